"""Offload with several GPUs: each data-parallel rank offloads its own shard over its share of the host
(ZeRO-Offload, ZeRO-Infinity, SuperOffload, FSDP CPU offload, activation offload), synthetic calibration."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from ghsim.cli import main
from ghsim.cost.calibration import Calibration
from ghsim.cost.hostlink import HostSide
from ghsim.errors import GhsimError
from ghsim.hardware import load_hardware
from ghsim.model import ModelSpec, load_model
from ghsim.plan import Framework, Plan, plan_from_dict
from ghsim.simulate import simulate
from ghsim.simulate import chunk_graph, prepare, run_microbatch

H100 = load_hardware("h100-sxm")
QUAD = load_hardware("gh200-96gb-quad")
PCIE = load_hardware("h100-pcie")
MID = ModelSpec(name="mid", hidden_size=2048, intermediate_size=5632, num_layers=8, num_attention_heads=16,
                num_kv_heads=8, head_dim=128, vocab_size=32000)
LLAMA8 = load_model("llama-3-8b")

def plan(**kw) -> Plan:
    return plan_from_dict({"seq": 1024, "framework": "deepspeed", **kw})

def micro_batch(cal: Calibration, model: ModelSpec, hw, p: Plan, final: bool = True, first: bool = True,
                last: bool = True):
    """The kernel-level graph of one rank's micro-batch, and its run (as simulate_prepared builds it)."""
    build = prepare(model, hw, p, cal)
    mb = chunk_graph(model, p, build, model.num_layers // build.layout.chunks, (first, last), final)
    return mb, run_microbatch(mb, hw, build.rank.cost, p, build.prices)

def named(graph, name):
    return [i for i, op in enumerate(graph.ops) if op.name == name]

# --- each rank offloads its own shard --------------------------------------------------------------

def test_each_rank_moves_and_updates_only_its_shard(cal):
    reports = {dp: simulate(MID, H100, plan(gpus=dp, zero=3, offload=["optimizer"]), cal) for dp in (2, 4, 8)}
    for dp, r in reports.items():
        off = r.extra["offload"]
        assert off["per_gpu"] and off["schedule"] == "overlapped"
        # the rank's reduced gradient shard goes down in fp32 and its updated parameter shard comes back
        # in bf16, as DeepSpeed 0.19's stage 3 moves them, and each 16-bit gradient partition makes a
        # round trip through the pinned flat buffer first (validation/measured_libraries traces)
        assert off["bytes_d2h"] == pytest.approx(MID.total_params / dp * (4 + 2), rel=0.02)
        assert off["bytes_h2d"] == pytest.approx(MID.total_params / dp * (2 + 2), rel=0.02)
    # every GPU of the node holds its shard on the host: the node holds the whole state, however many GPUs
    # (fp32 masters and moments exactly; the pinned gradient buffers in power-of-two blocks, so at least
    # the fp32 gradients and the 16-bit partition, at most twice that)
    for r in reports.values():
        b = r.host.breakdown
        assert b["master_params"] + b["optimizer_states"] == pytest.approx(MID.total_params * 12, rel=0.01)
        assert MID.total_params * 6 * 0.99 <= b["grads"] + b["grad_partition16"] <= MID.total_params * 12
    # a shard 1/dp the size on 1/dp of the host's cores: the node's CPU updates the whole model each step
    cpu = [r.extra["offload"]["cpu_optimizer_s"] for r in reports.values()]
    assert max(cpu) == pytest.approx(min(cpu), rel=1e-9)

def test_gradient_shards_leave_after_their_reduce_scatter(cal):
    p = plan(gpus=4, zero=3, offload=["optimizer"])
    mb, run = micro_batch(cal, MID, QUAD, p)
    g = mb.graph
    reductions = set(named(g, "grads.reduce_scatter"))
    copies = named(g, "grads.d2h")
    assert reductions and len(copies) == len(reductions)  # one copy down per bucket
    for i in copies:
        assert any(d in reductions or g.ops[d].resource == "dp" for d in g.deps[i])
        assert run.schedule.start[i] >= min(run.schedule.end[d] for d in g.deps[i]) - 1e-12
    # the full bucket is freed by its reduce-scatter, the shard never lands in HBM under offload
    assert all(g.ops[i].hbm_alloc == 0 for i in reductions)

def test_zero1_reduces_once_and_gathers_the_updated_parameters_after_they_return(cal):
    p = plan(gpus=4, zero=1, offload=["optimizer"], global_batch=8)
    middle, _ = micro_batch(cal, MID, H100, p, final=False)
    assert not named(middle.graph, "grads.d2h")  # ZeRO-1 accumulates on the GPU until the last micro-batch
    final, run = micro_batch(cal, MID, H100, p)
    g = final.graph
    gather = named(g, "params.all_gather")[0]
    h2d = named(g, "params.h2d")
    assert h2d and run.schedule.start[gather] >= max(run.schedule.end[i] for i in h2d) - 1e-12

def test_zero2_streams_every_micro_batch_and_the_host_accumulates(cal):
    p = plan(gpus=4, zero=2, offload=["optimizer"], global_batch=8)
    middle, mrun = micro_batch(cal, MID, H100, p, final=False)
    assert named(middle.graph, "grads.d2h") and named(middle.graph, "grads.accumulate.cpu")
    assert not named(middle.graph, "cpu_adamw")
    assert mrun.times["t_dp"] > mrun.times["t_bwd"]  # the last shard still travels after backward

@pytest.mark.parametrize("kept", [3, MID.num_layers])
def test_zero_infinity_fetches_each_layers_shard_before_its_all_gather(cal, kept):
    # DeepSpeed's prefetch window (stage3_max_live_parameters) keeps the last `kept` layers gathered
    # into backward: neither fetched nor gathered again (graph/zero3_window.py); 1e9 holds all 8
    live = MID.vocab_size * MID.hidden_size + (kept + 0.5) * MID.layer_params if kept < MID.num_layers else 1e9
    p = plan(gpus=4, zero=3, offload=["optimizer", "params"], max_live_parameters=live)
    mb, run = micro_batch(cal, MID, H100, p)
    g = mb.graph
    gathers = named(g, "zero3.all_gather")
    fetches = set(named(g, "params.h2d.fwd") + named(g, "params.h2d.bwd"))
    assert len(fetches) == len(gathers) == 2 * MID.num_layers - kept
    assert sum((op.hbm_by_tag or {}).get("param_buffers", 0.0) for op in g.ops) == pytest.approx(0.0, abs=1)
    for i in gathers:
        assert fetches & set(g.deps[i])
    shard = MID.layer_params / 4 * 2  # bf16 working copy of this rank's 1/dp of the layer
    assert all(g.ops[i].bytes == pytest.approx(shard) for i in fetches)
    assert not named(g, "params.h2d")  # ZeRO-Infinity writes updated parameters on the host

def test_fsdp_cpu_offload_fetches_fp32_shards_and_casts_them_on_the_gather_stream(cal):
    p = plan(gpus=2, zero=3, framework="fsdp-mixed", offload=["params"])
    mb, _ = micro_batch(cal, MID, H100, p)
    casts = named(mb.graph, "params.cast.fwd")
    assert casts and all(mb.graph.ops[i].resource == "dp" for i in casts)
    fetch = named(mb.graph, "params.h2d.fwd")[0]
    assert mb.graph.ops[fetch].bytes == pytest.approx(MID.layer_params / 2 * 4)

def test_activation_offload_frees_hbm_on_every_stage_and_holds_the_in_flight_micro_batches_on_the_host(cal):
    base = dict(gpus=4, pp=2, global_batch=8, framework="deepspeed", zero=1)
    off = simulate(MID, H100, plan(**base, offload=["activations"]), cal)
    on_gpu = simulate(MID, H100, plan(**base), cal)
    assert off.hbm.peak_bytes < on_gpu.hbm.peak_bytes
    stage0 = off.extra["parallel"]["stages"][0]["memory_breakdown"]
    assert stage0.get("pipeline_activations", 0.0) < on_gpu.extra["parallel"]["stages"][0]["memory_breakdown"][
        "pipeline_activations"]
    assert off.host.breakdown.get("pipeline_offloaded_activations", 0.0) > 0

# --- the schedules -----------------------------------------------------------------------------------

def test_superoffload_on_a_quad_gh200_overlaps_the_cpu_optimizer_with_backward(cal):
    base = dict(gpus=4, zero=3, offload=["optimizer"], seq=2048)
    zo = simulate(LLAMA8, QUAD, plan(**base, offload_schedule="overlapped"), cal, keep_timeline=False)
    # ratio 0.5: each rank's 2e9 parameters are 2 sub-groups of DeepSpeed's 1e9, and stage 3 keeps
    # int((1 - ratio) x 2) whole sub-groups on the GPU (at 0.8 it would keep none)
    so = simulate(LLAMA8, QUAD, plan(**base, offload_schedule="superoffload", offload_ratio=0.5), cal,
                  keep_timeline=False)
    assert so.step_time_s < zo.step_time_s
    mb, run = micro_batch(cal, LLAMA8, QUAD, plan(**base, offload_schedule="superoffload", offload_ratio=0.5))
    adam = named(mb.graph, "cpu_adamw")
    assert min(run.schedule.start[i] for i in adam) < run.times["t_bwd"]  # speculation: during backward
    assert named(mb.graph, "adamw.fused.gpu_share")  # the tail buckets stay on the GPU
    # the GPU keeps half of the optimizer state
    assert so.hbm.breakdown.get("optimizer_states", 0) > 0 and "optimizer_states" not in zo.hbm.breakdown

def test_sync_offload_copies_after_the_last_reduction(cal):
    p = plan(gpus=2, framework="torch-amp", offload=["optimizer"])  # DDP + the harness's explicit CPU AdamW
    mb, run = micro_batch(cal, MID, H100, p)
    g = mb.graph
    d2h = named(g, "grads.d2h")
    assert len(d2h) == 1 and g.ops[d2h[0]].resource == "gpu"
    last_reduction = max(named(g, "grads.all_reduce"))
    assert run.schedule.start[d2h[0]] >= run.schedule.end[last_reduction] - 1e-12

def test_each_gh200_superchip_has_its_own_grace_and_x86_gpus_share_one_host(cal):
    ds = Framework.DEEPSPEED
    quad = [HostSide.of(QUAD, Plan(gpus=n, framework=ds), cal) for n in (1, 2, 4)]
    assert len({h.cpu_adamw_rate() for h in quad}) == 1  # one Grace per GPU, however many the plan uses
    assert quad[0].cores_per_gpu == QUAD.cpu.cores // 4
    assert len({h.host_memory_rate() for h in quad}) == 1
    x86 = [HostSide.of(H100, Plan(gpus=n, framework=ds), cal) for n in (1, 2, 8)]
    rates = [h.cpu_adamw_rate() for h in x86]
    assert rates[0] / rates[2] == pytest.approx(8) and rates[0] / rates[1] == pytest.approx(2)
    assert x86[0].host_memory_rate() / x86[2].host_memory_rate() == pytest.approx(8)

def test_offload_is_slower_on_a_crowded_pcie_host_than_on_superchips(cal):
    """The same plan and GPU, 4 per node: four GH200s with a Grace each vs four H100s on one x86 host."""
    p = plan(gpus=4, zero=3, offload=["optimizer"], seq=2048)
    gh = simulate(LLAMA8, QUAD, p, cal, keep_timeline=False)
    x86_quad = dataclasses.replace(QUAD, host_link=PCIE.host_link, cpu=PCIE.cpu, host=PCIE.host)
    pcie = simulate(LLAMA8, x86_quad, p, cal, keep_timeline=False)
    assert gh.step_time_s < pcie.step_time_s
    assert pcie.time_breakdown_s["wait_cpu"] > gh.time_breakdown_s["wait_cpu"]

# --- bad input ------------------------------------------------------------------------------------

def test_host_memory_too_small_for_the_nodes_gpus_is_one_clear_error(cal):
    small_host = dataclasses.replace(H100, host=dataclasses.replace(H100.host, capacity_bytes=64e9))
    p = plan(gpus=8, zero=3, offload=["optimizer"])
    with pytest.raises(GhsimError, match="host memory per node"):
        simulate(LLAMA8, small_host, p, cal)
    one_per_node = simulate(LLAMA8, small_host, p.with_(gpus_per_node=1), cal, keep_timeline=False)
    assert one_per_node.host.peak_bytes < 64e9  # one GPU per node: its 1/8 shard (16 GB) fits

@pytest.mark.parametrize("args, message", [
    (["--gpus", "4", "--zero", "1", "--offload", "params"], "needs --zero 3"),
    (["--gpus", "4", "--unified-memory"], "one GPU only"),
    (["--gpus", "8", "--zero", "3", "--offload", "optimizer", "--offload-schedule", "superoffload",
      "--offload-ratio", "1.5"], "offload ratio"),
])
def test_bad_multi_gpu_offload_input_is_one_line_and_exit_2(args, message):
    res = CliRunner().invoke(main, ["simulate", "--model", "llama-3-8b", "--hardware", "h100-sxm", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1

def test_cli_multi_gpu_offload_json():
    import json

    res = CliRunner().invoke(main, ["simulate", "--model", "llama-3-8b", "--hardware", "gh200-96gb-quad",
                                    "--gpus", "4", "--zero", "3", "--framework", "deepspeed", "--seq", "2048",
                                    "--offload", "optimizer", "--offload-schedule", "superoffload",
                                    "--offload-ratio", "0.8", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output)
    assert r["offload"]["schedule"] == "superoffload" and r["offload"]["per_gpu"]
    assert r["memory"]["host_peak_bytes"] > 0 and r["fits"]
    assert any("1/4 shard" in n for n in r["notes"])
