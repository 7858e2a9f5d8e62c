"""What an offload run holds in host memory while its step runs, beyond the state it keeps all
step (issue 14, session 5): the CPU AdamW's temporaries per implementation, DeepSpeed ZeRO-3's
16-bit cast of a sub-group, FSDP's root unit on the GPU."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from ghsim.graph.ops import Category, Kind, Op, Resource
from ghsim.graph.optimizer import cpu_adamw_temporaries
from ghsim.graph.step import param_counts, trainable_tensor_sizes
from ghsim.plan import DEEPSPEED_SUB_GROUP, CpuOptimizer, Framework, OffloadSchedule, Plan, Precision
from ghsim.sim.memory import host_peak
from ghsim.simulate import simulate
from tests.test_library_offload_paths import H100, SMALL

OPT = frozenset({"optimizer", "grads"})
ALL = frozenset({"params", "grads", "optimizer"})


def _plain(impl: CpuOptimizer) -> Plan:
    return Plan(seq=1024, micro_batch=1, precision=Precision.BF16, offload=OPT, cpu_optimizer=impl)


def _host(plan: Plan):
    return simulate(SMALL, H100, plan).host


def test_foreach_holds_a_copy_of_the_second_moments_the_for_loop_two_of_its_largest_tensor():
    fused = _host(_plain(CpuOptimizer.TORCH_FUSED))
    sizes = trainable_tensor_sizes(SMALL, _plain(CpuOptimizer.TORCH_FUSED))
    trainable = sum(n * c for n, c in zip(sizes[::2], sizes[1::2]))
    assert "optimizer_temporaries" not in fused.breakdown
    foreach = _host(_plain(CpuOptimizer.TORCH_FOREACH))
    assert foreach.peak_bytes - fused.peak_bytes == pytest.approx(4 * trainable)
    forloop = _host(_plain(CpuOptimizer.TORCH_FORLOOP))
    assert forloop.peak_bytes - fused.peak_bytes == pytest.approx(8 * max(sizes[::2]))
    assert forloop.breakdown["optimizer_temporaries"] == pytest.approx(8 * max(sizes[::2]))


@given(st.sampled_from(list(CpuOptimizer)), st.floats(1e3, 1e11), st.floats(1, 1e9))
def test_temporaries_are_never_negative_and_only_torch_allocates_them(impl, params, largest):
    t = cpu_adamw_temporaries(impl, params, largest)
    assert t >= 0
    if impl in (CpuOptimizer.TORCH_FUSED, CpuOptimizer.DEEPSPEED, CpuOptimizer.AUTO):
        assert t == 0


def test_the_for_loop_temporaries_are_the_step_s_however_many_pieces_it_is_priced_in():
    # FSDP's CPU AdamW is priced layer by layer; the temporaries are those of its largest tensor
    plan = Plan(seq=1024, micro_batch=1, precision=Precision.BF16, framework=Framework.FSDP_MIXED, zero=3,
                offload=ALL, cpu_optimizer=CpuOptimizer.TORCH_FORLOOP)
    r = simulate(SMALL, H100, plan)
    adams = [op for op in r.timeline.ops if op.name == "cpu_adamw"]
    assert len(adams) > 1 and {op.host_transient for op in adams} == {8 * max(adams[0].shape[::2])}


def test_a_torch_optimizer_under_zero_offload_holds_the_whole_step_s_temporaries():
    # DeepSpeed ZeRO-2 with a client torch optimizer (zero_force_ds_cpu_optimizer false): foreach's copy of
    # the second moments covers the whole partition, however many pieces the step is priced in
    plan = Plan(seq=1024, micro_batch=1, precision=Precision.BF16, framework=Framework.DEEPSPEED, zero=2,
                offload=frozenset({"optimizer"}), cpu_optimizer=CpuOptimizer.TORCH_FOREACH)
    adams = [op for op in simulate(SMALL, H100, plan).timeline.ops if op.name == "cpu_adamw"]
    assert len(adams) > 1
    assert {op.host_transient for op in adams} == {4 * sum(op.params for op in adams)}


def test_deepspeed_zero3_casts_a_whole_sub_group_into_fresh_host_memory():
    plan = Plan(seq=1024, micro_batch=1, precision=Precision.BF16, framework=Framework.DEEPSPEED, zero=3,
                offload=OPT)
    r = simulate(SMALL, H100, plan)
    casts = [op for op in r.timeline.ops if op.name == "params.cast_bf16.cpu"]
    trainable = param_counts(SMALL, plan).trainable
    assert casts and {op.host_transient for op in casts} == {2 * min(trainable, DEEPSPEED_SUB_GROUP)}
    assert r.host.breakdown["cast_temporaries"] == pytest.approx(2 * min(trainable, DEEPSPEED_SUB_GROUP))
    # with offload_param the 16-bit partition is on the host already: cast in place, no copy up
    off = simulate(SMALL, H100, plan.with_(offload=ALL))
    assert "cast_temporaries" not in off.host.breakdown


def test_superoffload_counts_its_worker_process_once():
    plan = Plan(seq=1024, micro_batch=1, precision=Precision.BF16, framework=Framework.DEEPSPEED, zero=3,
                offload=OPT, offload_schedule=OffloadSchedule.SUPEROFFLOAD)
    host = simulate(SMALL, H100, plan).host.breakdown
    assert host["superoffload_worker_process"] > 0
    base = simulate(SMALL, H100, plan.with_(offload_schedule=OffloadSchedule.AUTO)).host.breakdown
    assert "superoffload_worker_process" not in base


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e9), st.floats(0, 1e9), st.floats(0, 1e9)), min_size=1, max_size=20),
       st.floats(0, 1e10))
def test_host_peak_is_the_largest_held_plus_running_temporaries(effects, base):
    ops = [Op(name=f"o{i}", category=Category.CPU, kind=Kind.HOST_WORK, resource=Resource.CPU, host_alloc=a,
              host_free=min(f, a), host_transient=t) for i, (a, f, t) in enumerate(effects)]
    held, peak = base, base
    for op in ops:
        held += op.host_alloc - op.host_free
        peak = max(peak, held + op.host_transient)
    assert host_peak(ops, {"static": base}).peak_bytes == pytest.approx(peak)


def test_fsdp_zero3_keeps_its_root_unit_gathered():
    zero3 = Plan(seq=1024, micro_batch=1, precision=Precision.BF16, framework=Framework.FSDP_MIXED, zero=3,
                 offload=ALL, cpu_optimizer=CpuOptimizer.TORCH_FORLOOP)
    hbm = simulate(SMALL, H100, zero3).hbm.breakdown
    params = param_counts(SMALL, zero3).total
    layers = SMALL.num_layers * SMALL.layer_params
    assert hbm["fsdp_root_params"] == pytest.approx(2 * (params - layers), rel=1e-6)
    # DeepSpeed keeps its non-layer parameters resident its own way (graph/states.py resident_states)
    ds = simulate(SMALL, H100, zero3.with_(framework=Framework.DEEPSPEED, cpu_optimizer=CpuOptimizer.AUTO))
    assert "fsdp_root_params" not in ds.hbm.breakdown


def test_zero3_offload_param_keeps_both_16_bit_partitions_and_the_gradient_buffers():
    plan = Plan(seq=1024, micro_batch=1, precision=Precision.BF16, framework=Framework.DEEPSPEED, zero=3, offload=ALL)
    host = simulate(SMALL, H100, plan).host.breakdown
    assert {"offloaded_params", "init_param_partitions", "grad_partition16", "grads"} <= set(host)
    # zero.Init's per-parameter partitions, each its own power-of-two pinned block
    assert host["init_param_partitions"] > 2 * param_counts(SMALL, plan).total
    pageable = simulate(SMALL, H100, plan.with_(offload_pinned=False)).host.breakdown
    assert pageable["init_param_partitions"] == pytest.approx(2 * param_counts(SMALL, plan).total)


def test_deepspeed_s_engine_process_is_counted_only_where_its_engine_runs():
    from ghsim.cost.library_overheads import training_process_host_bytes
    ds = Plan(seq=1024, micro_batch=1, precision=Precision.BF16, framework=Framework.DEEPSPEED, zero=2, offload=OPT)
    assert simulate(SMALL, H100, ds).host.breakdown["training_process"] == training_process_host_bytes(deepspeed=True)
    plain = ds.with_(zero=0, offload_schedule=OffloadSchedule.SYNC)  # a plain loop with bf16 weights, fp32 masters
    assert simulate(SMALL, H100, plain).host.breakdown["training_process"] == training_process_host_bytes()
    assert training_process_host_bytes(deepspeed=True) > training_process_host_bytes()
