"""How DeepSpeed 0.19 and plain PyTorch really move offloaded state (issue 14, session 4): each test
pins one behaviour read from the libraries' code and the profiler traces in
validation/measured_libraries, priced from the microbenchmarks in _raw/offload_calibration.json."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghsim.cost.cpu_optimizer import curve_of
from ghsim.cost.hostlink import HostSide
from ghsim.cost.library_overheads import superoffload_worker_pace
from ghsim.graph.deepspeed_optimizer import zero3_hooks
from ghsim.graph.offload import deepspeed_sub_group_ratio
from ghsim.graph.step import param_counts, trainable_tensor_sizes
from ghsim.hardware import load_hardware
from ghsim.model import ModelSpec, load_model
from ghsim.plan import CpuOptimizer, Framework, OffloadSchedule, Plan, Precision
from ghsim.simulate import simulate

H100 = load_hardware("h100-sxm")
GH200 = load_hardware("gh200-96gb")
SMALL = ModelSpec(name="small", hidden_size=1024, intermediate_size=2816, num_layers=4, num_attention_heads=8,
                  num_kv_heads=8, head_dim=128, vocab_size=32000, max_seq_len=1024)
OPT = frozenset({"optimizer", "grads"})


def _plan(**kw) -> Plan:
    return Plan(**{"seq": 1024, "micro_batch": 1, "precision": Precision.BF16, **kw})


def test_tensor_sizes_cover_the_trainable_parameters():
    for name in ("llama-3-8b", "llama-2-7b"):
        model = load_model(name)
        sizes = trainable_tensor_sizes(model, Plan())
        pairs = list(zip(sizes[::2], sizes[1::2]))
        assert sum(n * c for n, c in pairs) == pytest.approx(param_counts(model, Plan()).trainable, rel=1e-6)
        assert sum(c for _, c in pairs) == param_counts(model, Plan()).n_tensors


@pytest.mark.parametrize("impl", [c for c in CpuOptimizer if c != CpuOptimizer.AUTO])
def test_tensor_size_factor_follows_the_measured_rates(impl):
    """At the curve's own size the factor is 1; elsewhere it is the measured rate there over the
    rate at that size; DeepSpeedCPUAdam steps flat partitions whatever the model's tensors."""
    curve = curve_of(impl)
    row = curve.size_rows[-1]  # the reference host's all-thread row, which size_factor reads by default
    assert curve.size_factor(()) == 1.0
    at_ref = curve.size_factor((int(curve.curve_elements), 10))
    assert at_ref == pytest.approx(1.0 if impl != CpuOptimizer.DEEPSPEED else row.rates[-1] /
                                   row.rates[row.elements.index(curve.curve_elements)])
    big = curve.size_factor((int(row.elements[-1]), 3))
    ref = row.rates[row.elements.index(curve.curve_elements)]
    assert big == pytest.approx(row.rates[-1] / ref)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 10**9), st.integers(1, 100)), min_size=1, max_size=6))
def test_tensor_size_factor_stays_within_the_measured_spread(pairs):
    curve = curve_of(CpuOptimizer.TORCH_FOREACH)
    row = curve.size_rows[-1]
    ref = row.rates[row.elements.index(curve.curve_elements)]
    f = curve.size_factor(tuple(v for p in pairs for v in p))
    assert min(row.rates) / ref - 1e-9 <= f <= max(row.rates) / ref + 1e-9


def test_superoffload_worker_is_priced_as_measured_on_x86_only():
    plan = _plan(framework=Framework.DEEPSPEED, zero=3, offload=OPT, offload_schedule=OffloadSchedule.SUPEROFFLOAD)
    x86, grace = HostSide.of(H100, plan), HostSide.of(GH200, plan)
    assert x86.worker_process and not grace.worker_process
    share, handoff = superoffload_worker_pace()
    in_process = HostSide.of(H100, plan.with_(offload_schedule=OffloadSchedule.OVERLAPPED, cpu_threads=x86.optimizer_threads))
    assert x86.cpu_adamw_rate() == pytest.approx(share * in_process.cpu_adamw_rate())
    # the hand-off is paid per sub-group of 1e9 parameters
    assert x86.cpu_optimizer_time(1e9) == pytest.approx(1e9 / x86.cpu_adamw_rate() + handoff)


def test_superoffload_splits_the_cores_as_deepspeed_does():
    for perc, worker in ((0.8, 13), (0.9, 15), (0.5, 8)):
        side = HostSide.of(load_hardware("h100-sxm", {"cpu.cores": {"value": 16, "source": "test"}}),
                           _plan(offload=OPT, offload_schedule=OffloadSchedule.SUPEROFFLOAD, cpu_cores_share=perc))
        assert side.optimizer_threads == worker and side.main_threads == 16


def test_deepspeed_zero3_offloads_whole_sub_groups():
    ds = _plan(framework=Framework.DEEPSPEED, zero=3, offload=OPT, offload_ratio=0.9)
    tensors = [32_000_000] * 100  # 3.2e9 parameters: 3 sub-groups of 32 tensors and one of 4
    same, note = deepspeed_sub_group_ratio(ds, tensors)  # int(0.1 x 4) = 0 stay on the GPU
    assert same.offload_ratio == 1.0 and "runs as 1" in note
    half, _ = deepspeed_sub_group_ratio(ds.with_(offload_ratio=0.5), [40_000_000] * 100)  # 4 of 25
    assert half.offload_ratio == 0.5
    for other in (ds.with_(zero=2), ds.with_(framework=Framework.TORCH_AMP), ds.with_(offload_ratio=1.0)):
        assert deepspeed_sub_group_ratio(other, tensors) == (other, None)


def test_sub_groups_close_at_the_size_as_deepspeed_does():
    """stage3.py closes a sub-group once it holds sub_group_size elements: the ETH 8B model's 2.013e9
    elements per rank make 5 sub-groups of 4e8 (not ceil = 6), so ratio 0.8 keeps none on the GPU."""
    from ghsim.graph.offload.setup import sub_group_count
    from ghsim.graph.step import partition_sizes
    from ghsim.model import model_from_dict
    eth = model_from_dict({"name": "eth", "hidden_size": 4096, "intermediate_size": 14336, "num_layers": 32,
                           "num_attention_heads": 32, "num_kv_heads": 8, "head_dim": 128, "vocab_size": 131072,
                           "tie_embeddings": False, "max_seq_len": 2048}, "test", "eth")
    plan = _plan(framework=Framework.DEEPSPEED, zero=3, offload=OPT, offload_ratio=0.8, gpus=4,
                 sub_group_size=4e8)
    tensors = partition_sizes(eth, plan, 4)
    assert sum(tensors) == 2_013_332_480 and sub_group_count(tensors, 4e8) == 5
    assert deepspeed_sub_group_ratio(plan, tensors)[0].offload_ratio == 1.0
    assert sub_group_count([10, 10], 100) == 1 and sub_group_count([100, 1], 100) == 2


def test_zero3_hooks_every_module_of_a_layer():
    hooks = zero3_hooks(SMALL, _plan(framework=Framework.DEEPSPEED, zero=3), "fwd")
    assert hooks[0].params == 13  # layer, attention, MLP, activation, 7 projections, 2 norms
    assert zero3_hooks(SMALL, _plan(framework=Framework.DEEPSPEED, zero=2), "fwd") == []


def test_deepspeed_stage3_moves_fp32_gradients_a_16_bit_round_trip_and_bf16_parameters():
    r = simulate(SMALL, H100, _plan(framework=Framework.DEEPSPEED, zero=3, offload=OPT))
    p = param_counts(SMALL, Plan()).trainable
    off = r.extra["offload"]
    assert off["bytes_d2h"] == pytest.approx(p * (4 + 2), rel=0.01)
    assert off["bytes_h2d"] == pytest.approx(p * (2 + 2), rel=0.01)
    # and keeps its 5e8-element reduce bucket on the one GPU, whole however small the model
    assert r.hbm.breakdown.get("comm_buckets") == pytest.approx(5e8 * 2)


def test_plain_offload_with_bf16_weights_moves_fp32_both_ways():
    r = simulate(SMALL, H100, _plan(framework=Framework.DEEPSPEED, offload=OPT,
                                    offload_schedule=OffloadSchedule.SYNC))
    p = param_counts(SMALL, Plan()).trainable
    assert r.extra["offload"]["bytes_d2h"] == pytest.approx(4 * p, rel=0.01)
    assert r.extra["offload"]["bytes_h2d"] == pytest.approx(4 * p, rel=0.01)


def test_deepspeed_host_buffers_come_in_power_of_two_pinned_blocks():
    from ghsim.graph.states import pinned_block

    assert pinned_block(4e9) == 2**32 and pinned_block(2**30) == 2**30 and pinned_block(0) == 0
    model = load_model("llama-3-8b")
    p = param_counts(model, Plan()).trainable
    z2 = simulate(model, H100, _plan(framework=Framework.DEEPSPEED, zero=2, offload=OPT)).host.breakdown
    assert z2["master_params"] == z2["grads"] == pinned_block(4 * p) and z2["param_copy16"] == pinned_block(2 * p)
    pageable = simulate(model, H100, _plan(framework=Framework.DEEPSPEED, zero=2, offload=OPT,
                                           offload_pinned=False)).host.breakdown
    assert pageable["master_params"] == pytest.approx(4 * p) and pageable["param_copy16"] == pytest.approx(2 * p)
    z3 = simulate(model, H100, _plan(framework=Framework.DEEPSPEED, zero=3, offload=OPT)).host.breakdown
    assert z3["master_params"] == pytest.approx(4 * p)  # pageable: stage 3 clones them to the CPU
    assert z3["grads"] == 8 * 2**32 + pinned_block(4 * (p - 8e9))  # 8 full sub-groups of 1e9 and the rest


def test_a_fresh_host_tensor_faults_in_by_the_hosts_page_size():
    """torch's cast into a fresh pageable tensor (ZeRO-3's parameter return) is mostly page faults on the
    measured 4 KiB host: a host with 64 KiB pages (Grace) pays the faults' fixed part on 1/16 of the pages,
    the bytes (cast, kernel zeroing) in full; a profile's page size must be a real size."""
    from ghsim.cost.library_overheads import blocking_cast_seconds_per_param
    from ghsim.errors import GhsimError
    from ghsim.hardware import hardware_from_dict, load_hardware
    from ghsim.tomlio import read_toml

    x86, grace = (load_hardware(n).cpu.page_size_kb for n in ("h100-sxm", "gh200-96gb"))
    assert (x86, grace) == (4.0, 64.0)
    at_4k, at_64k = blocking_cast_seconds_per_param(x86), blocking_cast_seconds_per_param(grace)
    assert 0.3 * at_4k < at_64k < at_4k
    assert blocking_cast_seconds_per_param(2048.0) < at_64k  # more pages' worth per fault: cheaper still
    d = read_toml(Path(__file__).resolve().parents[1] / "hardware_profiles" / "gh200-96gb.toml")
    d["cpu"]["page_size_kb"] = {"value": 0, "source": "test"}
    with pytest.raises(GhsimError, match="page_size_kb"):
        hardware_from_dict(d, "test.toml")
