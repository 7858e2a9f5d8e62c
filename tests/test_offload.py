"""Offload schedules, host links and unified memory, on the synthetic calibration (structure, not accuracy)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ghsim.cost.compute import CostModel
from ghsim.cost.cpu_optimizer import curve_of
from ghsim.cost.hostlink import HostSide
from ghsim.cost.library_overheads import training_process_host_bytes
from ghsim.errors import GhsimError
from ghsim.graph.states import pinned_tensor_blocks
from ghsim.graph.step import trainable_tensor_sizes
from ghsim.graph import ops as K
from ghsim.hardware import load_hardware
from ghsim.model import load_model, model_from_dict
from ghsim.plan import CpuOptimizer, Framework, OffloadSchedule, Plan, plan_from_dict
from ghsim.simulate import simulate
from step_graphs import step_graph

H100 = load_hardware("h100-sxm")
PCIE = load_hardware("h100-pcie")
GH200 = load_hardware("gh200-96gb")
SMALL = model_from_dict(dict(name="llama-1.1b-shape", hidden_size=2048, intermediate_size=5632, num_layers=22,
                             num_attention_heads=32, num_kv_heads=4, head_dim=64, vocab_size=32000), "test")
OPT = frozenset({"optimizer", "grads"})


def make_plan(**plan) -> Plan:
    return plan_from_dict({"micro_batch": 4, "seq": 2048, **plan})


def run(cal, hw=H100, model=SMALL, **plan):
    return simulate(model, hw, make_plan(**plan), cal)


def graph_of(cal, hw=H100, model=SMALL, **plan):
    p = make_plan(**plan)
    return step_graph(model, hw, p, cal)


def named(graph, name):
    return [i for i, op in enumerate(graph.ops) if op.name == name]


# --- schedules ---------------------------------------------------------------------------
def test_sync_optimizer_offload_is_the_harness_schedule(cal):
    g = graph_of(cal, offload=OPT)
    opt = [op for op in g.ops if op.phase == "opt"]
    assert [op.name for op in opt] == ["grads.d2h", "cpu_adamw", "params.h2d"]
    d2h, adam, h2d = opt
    assert d2h.resource == "gpu" and h2d.resource == "gpu"  # non_blocking copies on the compute stream
    assert adam.resource == "cpu" and adam.host_waits and h2d.host_waits
    assert d2h.bytes == pytest.approx(SMALL.total_params * 4)  # torch-amp: fp32 grads and params
    assert not any(op.kind == K.OPT_GPU for op in g.ops)


def test_zero_offload_copies_grads_as_deepspeed_019_does(cal):
    """Stage 1/2 (overlap_comm false): each gradient cast to fp32 on the GPU and copied into the
    pinned fp32 buffer on the compute stream, during backward; the host step waits for all."""
    g = graph_of(cal, offload=OPT, framework="deepspeed", zero=2)
    d2h = named(g, "grads.d2h")
    assert len(d2h) == SMALL.num_layers + 2  # every layer, the LM head, the embedding
    assert all(g.ops[i].resource == "gpu" for i in d2h)
    assert sum(g.ops[i].bytes for i in d2h) == pytest.approx(SMALL.total_params * 4)  # fp32 grads
    assert len(named(g, "grads.cast_fp32")) == len(d2h)
    tl = run(cal, offload=OPT, framework="deepspeed", zero=2).timeline
    ends = [tl.schedule.end[i] for i, op in enumerate(tl.ops) if op.name == "grads.d2h"]
    bwd_end = max(tl.schedule.end[i] for i, op in enumerate(tl.ops) if op.phase == "bwd" and op.resource == "gpu")
    first_norm = min(tl.schedule.start[i] for i, op in enumerate(tl.ops) if op.name == "grads.norm.cpu")
    assert min(ends) < bwd_end  # copied while backward runs
    assert first_norm >= max(ends)  # the global gradient norm waits for every gradient


def test_zero_offload_host_step_runs_pass_by_pass(cal):
    """norm, clip, DeepSpeedCPUAdam over the partition, the fp32 -> bf16 narrowing, then the copies up."""
    tl = run(cal, offload=OPT, framework="deepspeed", zero=2, grad_clip=True).timeline
    order = ["grads.norm.cpu", "grads.clip.cpu", "cpu_adamw", "params.cast_bf16.cpu", "params.h2d"]
    spans = [[(tl.schedule.start[i], tl.schedule.end[i]) for i, op in enumerate(tl.ops) if op.name == n]
             for n in order]
    assert all(spans)
    for before, after in zip(spans, spans[1:]):
        assert max(e for _, e in before) <= min(s for s, _ in after) + 1e-12
    unclipped = run(cal, offload=OPT, framework="deepspeed", zero=2)
    assert not any(op.name == "grads.clip.cpu" for op in unclipped.timeline.ops)
    assert unclipped.step_time_s < run(cal, offload=OPT, framework="deepspeed", zero=2, grad_clip=True).step_time_s


def test_superoffload_overlaps_cpu_adam_with_backward(cal):
    r = run(cal, GH200, offload=OPT, framework="deepspeed", offload_schedule=OffloadSchedule.SUPEROFFLOAD,
            offload_ratio=0.8)
    tl = r.timeline
    bwd_end = max(tl.schedule.end[i] for i, op in enumerate(tl.ops) if op.phase == "bwd" and op.resource == "gpu")
    cpu_starts = [tl.schedule.start[i] for i, op in enumerate(tl.ops) if op.kind == K.OPT_CPU]
    assert min(cpu_starts) < bwd_end  # speculation: the CPU steps while backward still runs
    gpu_share = [op for op in tl.ops if op.kind == K.OPT_GPU]
    assert len(gpu_share) == 1 and 0.1 * SMALL.total_params < gpu_share[0].params < 0.3 * SMALL.total_params
    zo = run(cal, GH200, offload=OPT, framework="deepspeed")
    assert r.step_time_s < zo.step_time_s
    assert r.to_dict()["offload"]["schedule"] == "superoffload"


def test_superoffload_places_casts_where_cheapest(cal):
    so = dict(offload=OPT, framework="deepspeed", offload_schedule=OffloadSchedule.SUPEROFFLOAD)
    # over C2C the link is never the bottleneck: the GPU widens gradients to fp32 and sends 4 bytes
    c2c = graph_of(cal, GH200, **so)
    assert named(c2c, "grads.cast_fp32") and not named(c2c, "grads.cast_fp32.cpu")
    # a PCIe host whose CPU keeps up and a short backward: the link is the bottleneck, so it
    # carries 2-byte gradients and the CPU widens them
    fast_cpu = load_hardware("h100-pcie", {"cpu.adamw_params_per_s": {"value": 1e12, "source": "test"}})
    pcie = graph_of(cal, fast_cpu, micro_batch=1, seq=256, **so)
    assert named(pcie, "grads.cast_fp32.cpu") and not named(pcie, "grads.cast_fp32")


def test_ratio_zero_keeps_the_optimizer_on_the_gpu(cal):
    r = run(cal, GH200, offload=OPT, framework="deepspeed", offload_ratio=0.0)
    assert not any(op.kind == K.OPT_CPU for op in r.timeline.ops)
    assert r.host.peak_bytes == 0


def test_activation_offload_overlapped_beats_save_on_cpu(cal):
    sync = run(cal, PCIE, micro_batch=2, offload=frozenset({"activations"}))
    over = run(cal, PCIE, micro_batch=2, offload=frozenset({"activations"}), offload_schedule=OffloadSchedule.OVERLAPPED)
    none = run(cal, PCIE, micro_batch=2)
    assert over.step_time_s <= sync.step_time_s
    assert over.hbm.peak_bytes < none.hbm.peak_bytes and sync.hbm.peak_bytes < none.hbm.peak_bytes
    # save_on_cpu packs a tensor once per op that saves it (and the loss's tensors too)
    assert sync.host.peak_bytes > over.host.peak_bytes
    assert "offloaded_activations" in over.host.breakdown
    d2h = [op for op in over.timeline.ops if op.name == "activations.d2h"]
    assert d2h and all(op.resource == "d2h" for op in d2h)


def test_full_recompute_offloads_the_checkpoints(cal):
    r = run(cal, PCIE, recompute="full", offload=frozenset({"activations"}), offload_schedule="overlapped")
    x = 4 * 2048 * SMALL.hidden_size * 4  # fp32 residual stream under torch-amp
    # the checkpoints, in a training process holding its own measured memory
    assert r.host.peak_bytes == pytest.approx(SMALL.num_layers * x + training_process_host_bytes(), rel=1e-6)


def test_parameter_offload_fetches_each_layer_twice(cal):
    g = graph_of(cal, offload=frozenset({"params", "optimizer"}), framework="deepspeed")
    fetches = named(g, "params.h2d.fwd") + named(g, "params.h2d.bwd")
    assert len(fetches) == 2 * SMALL.num_layers
    r = run(cal, offload=frozenset({"params", "optimizer"}), framework="deepspeed")
    keep = run(cal, offload=frozenset({"optimizer"}), framework="deepspeed")
    assert r.hbm.peak_bytes < keep.hbm.peak_bytes
    assert "offloaded_params" in r.host.breakdown


def test_fsdp_cpu_offload_casts_on_the_gpu_and_steps_on_the_cpu(cal):
    r = run(cal, offload=frozenset({"params", "grads", "optimizer"}), framework="fsdp-mixed")
    names = {op.name for op in r.timeline.ops}
    assert {"params.cast.fwd", "params.cast.bwd", "grads.cast_fp32", "cpu_adamw"} <= names
    assert "params.h2d" not in names  # the next forward fetches the updated flat parameters
    assert r.to_dict()["offload"]["schedule"] == "sync"


def test_grad_accumulation_sends_every_micro_batch(cal):
    one = graph_of(cal, offload=OPT, framework="deepspeed")
    two = graph_of(cal, offload=OPT, framework="deepspeed", global_batch=8)
    assert len(named(two, "grads.d2h")) == 2 * len(named(one, "grads.d2h"))
    assert named(two, "grads.accumulate.cpu")


def test_report_has_memory_tiers_and_offload_section(cal):
    d = run(cal, offload=OPT).to_dict()
    mem = d["memory"]
    # the moments pageable; each tensor's fp32 master and gradient in its own power-of-two pinned block;
    # while torch's for-loop AdamW (a CPU offload's default) steps, two fp32 copies of the largest tensor
    sizes = trainable_tensor_sizes(SMALL, Plan())
    blocks = pinned_tensor_blocks(sizes)
    assert blocks > 1.0
    assert mem["host_peak_bytes"] == pytest.approx((8 + 8 * blocks) * SMALL.total_params + 8 * max(sizes[::2])
                                                   + training_process_host_bytes())
    assert mem["host_breakdown"]["optimizer_temporaries"] == 8 * max(sizes[::2])
    assert mem["host_breakdown"]["training_process"] == training_process_host_bytes()
    assert {"master_params", "optimizer_states", "grads"} <= set(mem["host_breakdown"])
    assert d["offload"]["bytes_d2h"] > 0 and d["offload"]["cpu_optimizer_s"] > 0
    assert "wait_cpu" in d["time_breakdown_s"]
    json.dumps(d)


def test_pageable_buffers_are_slower(cal):
    pinned = run(cal, PCIE, offload=OPT, framework="deepspeed")
    pageable = run(cal, PCIE, offload=OPT, framework="deepspeed", offload_pinned=False)
    assert pageable.step_time_s > pinned.step_time_s


# --- host link kinds -----------------------------------------------------------------------
def test_pcie_shares_its_bidirectional_cap():
    side = HostSide.of(PCIE)
    one_way = side.link_rate(K.H2D)
    both = side.link_rate(K.H2D, duplex=True) + side.link_rate(K.D2H, duplex=True)
    assert both == pytest.approx(PCIE.host_link.bidirectional_total)
    assert side.link_rate(K.H2D, duplex=True) < one_way
    c2c = HostSide.of(GH200)
    assert c2c.link_rate(K.H2D) > c2c.link_rate(K.D2H)  # asymmetric


def test_gpus_behind_one_switch_share_the_link():
    shared = dataclasses.replace(PCIE, host_link=dataclasses.replace(PCIE.host_link, gpus_sharing=2))
    alone = HostSide.of(shared, Plan(gpus=1, framework=Framework.DEEPSPEED))
    pair = HostSide.of(shared, Plan(gpus=2, gpus_per_node=2, framework=Framework.DEEPSPEED))
    assert pair.link_rate(K.H2D) == pytest.approx(alone.link_rate(K.H2D) / 2)
    assert pair.cpu_adamw_rate() == pytest.approx(alone.cpu_adamw_rate() / 2)


def test_cpu_adam_rate_depends_on_the_cpu(cal):
    """Fewer cores, slower torch AdamW; Grace's 72 cores are bound by its LPDDR5X bandwidth."""
    few = load_hardware("h100-sxm", {"cpu.cores": {"value": 16, "source": "test"}})
    fused = CpuOptimizer.TORCH_FUSED
    assert HostSide.of(few, None, cal).cpu_adamw_rate(fused) < HostSide.of(H100, None, cal).cpu_adamw_rate(fused)
    grace = HostSide.of(GH200, None, cal).cpu_adamw_rate(CpuOptimizer.DEEPSPEED)
    assert grace == pytest.approx(GH200.cpu.adamw_params_per_s * 28 / curve_of(CpuOptimizer.DEEPSPEED).bytes_per_param)


# --- unified memory --------------------------------------------------------------------------
def test_unified_memory_lora_fits_full_finetune_migrates(cal):
    model = load_model("llama-2-7b")
    lora = simulate(model, GH200, Plan(seq=4096, lora_rank=16, unified_memory=True), cal)
    full = simulate(model, GH200, Plan(seq=4096, unified_memory=True), cal)
    assert lora.to_dict()["unified_memory"]["migrated_bytes"] == 0
    assert lora.time_breakdown_s["um_migration"] == 0
    um = full.to_dict()["unified_memory"]
    assert um["spilled_bytes"] > 0 and um["migration_share"] > 0.1
    assert full.fits and full.gpu_utilization < lora.gpu_utilization
    assert full.host.breakdown.get("um_spilled", 0) > 0
    pcie = simulate(model, PCIE, Plan(seq=4096, unified_memory=True), cal)
    assert pcie.step_time_s > full.step_time_s


# --- bad input ---------------------------------------------------------------------------
def test_offload_ratio_outside_unit_interval(cal):
    for bad in (-0.1, 1.5):
        with pytest.raises(GhsimError, match="ratio"):
            run(cal, offload=OPT, offload_ratio=bad)


def test_unified_memory_where_unsupported(cal):
    hw = dataclasses.replace(PCIE, unified_memory=dataclasses.replace(PCIE.unified_memory, supported=False))
    with pytest.raises(GhsimError, match="unified memory"):
        run(cal, hw, unified_memory=True)


def test_offload_beyond_host_memory(cal):
    small_host = load_hardware("h100-pcie", {"memory.host.capacity_gb": {"value": 8, "source": "test"}})
    with pytest.raises(GhsimError, match="host memory") as e:
        run(cal, small_host, offload=OPT)
    assert "\n" not in str(e.value)


def test_superoffload_needs_the_optimizer(cal):
    with pytest.raises(GhsimError, match="superoffload"):
        run(cal, offload=frozenset({"activations"}), offload_schedule=OffloadSchedule.SUPEROFFLOAD)


def test_cli_bad_offload_inputs_exit_2(tmp_path: Path):
    from click.testing import CliRunner

    from ghsim.cli import main

    res = CliRunner().invoke(main, ["simulate", "--model", "llama-2-7b", "--offload", "optimizer",
                                    "--offload-ratio", "2"])
    assert res.exit_code == 2 and "ratio" in res.output and "Traceback" not in res.output


def test_deepspeed_config_superoffload_and_pinning(tmp_path: Path):
    from ghsim.deepspeed import plan_dict_from_ds_config

    cfg = {"bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 4,
           "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True,
                                                                   "ratio": 0.9, "super_offload": True}}}
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(cfg))
    d = plan_dict_from_ds_config(p)
    assert d["offload_schedule"] == "superoffload" and d["offload_ratio"] == 0.9 and d["offload_pinned"] is True
    cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    p.write_text(json.dumps(cfg))
    assert plan_dict_from_ds_config(p)["offload_pinned"] is True  # DeepSpeed 0.19.8's default (offload_config.py)
    plan = plan_from_dict({k: v for k, v in d.items() if k != "zero"})
    assert plan.offload_schedule == OffloadSchedule.SUPEROFFLOAD


def test_save_on_cpu_packs_every_saved_occurrence(cal):
    from ghsim.graph.offload import save_on_cpu_layer

    plan = make_plan(micro_batch=2, offload=["activations"])
    g = graph_of(cal, micro_batch=2, offload=["activations"])
    d2h = [op for op in g.ops if op.name == "activations.d2h"]
    assert len(d2h) == SMALL.num_layers and all(op.host_waits for op in d2h)  # packed.copy_ blocks the host
    nbytes, copies = save_on_cpu_layer(SMALL, plan, 0.0)
    assert copies == 40  # what the h100 activation-offload trace shows per Llama layer
    T, h = 2 * 2048, SMALL.hidden_size
    assert nbytes >= 3 * T * h * 4  # the layer input twice and the attention residual once more


def test_rewrite_reports_where_each_op_went(cal):
    from ghsim.graph.offload import StepFacts, apply_offload_mapped

    p = make_plan(offload=["activations"])
    base = graph_of(cal)  # the same step without offload
    facts = StepFacts(trainable=SMALL.total_params, n_tensors=201, saved_per_layer=1e8, gpu_param_width=4,
                      layer_params=SMALL.layer_params)
    # only activations move: no optimizer, so no link widths to decide (widths=None)
    out, mapping = apply_offload_mapped(base, SMALL, p.with_(offload_schedule=OffloadSchedule.OVERLAPPED), facts, None)
    assert len(mapping) == len(base.ops) and mapping == sorted(mapping)
    assert all(out.ops[mapping[i]] is base.ops[i] for i in range(len(base.ops)))
    assert len(out.ops) == len(base.ops) + 2 * SMALL.num_layers  # one copy down, one back, per layer


def test_cli_bad_hardware_for_offload_and_unified_memory_exit_2(tmp_path: Path):
    from click.testing import CliRunner

    from ghsim.cli import main

    src = (Path(__file__).resolve().parent.parent / "hardware_profiles" / "h100-pcie.toml").read_text()
    no_um = tmp_path / "no-um.toml"
    no_um.write_text(src.replace("[unified_memory]\nsupported = true", "[unified_memory]\nsupported = false"))
    res = CliRunner().invoke(main, ["simulate", "--model", "llama-2-7b", "--hardware", str(no_um), "--unified-memory"])
    assert res.exit_code == 2 and "unified memory" in res.output and len(res.output.strip().splitlines()) == 1
    tiny_host = tmp_path / "tiny-host.toml"
    marker = "[memory.host]\n"
    head, tail = src.split(marker)
    tail = "\n".join('capacity_gb = { value = 16, source = "test" }' if line.startswith("capacity_gb") else line
                     for line in tail.split("\n"))
    tiny_host.write_text(head + marker + tail)
    res = CliRunner().invoke(main, ["simulate", "--model", "llama-2-7b", "--hardware", str(tiny_host),
                                    "--offload", "optimizer"])
    assert res.exit_code == 2 and "host memory" in res.output and len(res.output.strip().splitlines()) == 1


def test_zero3_optimizer_offload_returns_parameters_through_pageable_memory(cal):
    """DeepSpeed 0.19 stage 3 with offload_optimizer only: the training thread copies each updated
    piece up from pageable memory before it steps the next (its trace: Pageable -> Device)."""
    g = graph_of(cal, offload=OPT, framework="deepspeed", zero=3)
    ups = [g.ops[i] for i in named(g, "params.h2d")]
    assert ups and all(not op.pinned and op.host_waits for op in ups)
    z3 = run(cal, offload=OPT, framework="deepspeed", zero=3).step_time_s
    assert z3 > run(cal, offload=OPT, framework="deepspeed", zero=2).step_time_s


@pytest.mark.parametrize("framework", ["fsdp-mixed", "deepspeed"])
def test_clipping_with_nothing_on_the_host_is_no_host_pass(cal, framework):
    """offload_ratio 0 leaves every gradient on the GPU: clipping adds no host pass (it used to
    index an empty list)."""
    r = run(cal, offload=OPT, framework=framework, offload_ratio=0.0, grad_clip=True, zero=3)
    assert not any(op.name.startswith("grads.") and op.resource == "cpu" for op in r.timeline.ops)


def test_deepspeed_zero_offload_checks_each_gradient_on_the_gpu(cal):
    # stage 1/2 ZeRO-Offload: bucket copy every micro-batch; fp64 norm and overflow check per
    # gradient at the accumulation boundary, before it leaves; not the harness's own overlapped
    # loop, whose gradients go straight down
    for accum in (1, 2):
        ds = graph_of(cal, offload=OPT, framework="deepspeed", zero=2, offload_schedule="overlapped",
                      global_batch=4 * accum)
        checks, bucket = named(ds, "ds.grad_checks"), named(ds, "ds.grads_to_bucket")
        assert checks and all(ds.ops[i].phase == "bwd" for i in checks + bucket)
        # bf16: the fp64 cast and norm (2 + 8 + 8), amax and amin (2 + 2), once; the bucket copy (2 + 2) each time
        assert sum(ds.ops[i].bytes for i in checks) == pytest.approx(22 * SMALL.total_params, rel=1e-6)
        assert sum(ds.ops[i].bytes for i in bucket) == pytest.approx(4 * accum * SMALL.total_params, rel=1e-6)
    assert not named(graph_of(cal, offload=OPT, zero=2, offload_schedule="overlapped"), "ds.grad_checks")
