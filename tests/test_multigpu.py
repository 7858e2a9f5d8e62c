"""Multi-GPU plans: collectives, layouts, ZeRO memory, pipeline schedules, bad input (synthetic calibration)."""

import math
import subprocess
import sys
import time

import pytest

from ghsim.cost.links import NVLINK_HOP_S, Fabric, collective_time
from ghsim.errors import GhsimError
from ghsim.graph.collectives import Group
from ghsim.graph.parallel import Chunk, Layout, build_microbatch
from ghsim.graph.states import model_states
from ghsim.graph.pipeline import FWD, peak_inflight_bytes, stage_order
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Framework, Plan, Recompute
from ghsim.simulate import simulate

H100 = load_hardware("h100-sxm")
A100 = load_hardware("a100-sxm-80gb")
QUAD = load_hardware("gh200-96gb-quad")
GH200 = load_hardware("gh200-96gb")
SMALL = load_model("gpt3-1.7b")
LLAMA7 = load_model("llama-2-7b")


def run(cal, model=SMALL, hw=H100, **plan):
    return simulate(model, hw, Plan(**plan), cal)


# --- collective costs --------------------------------------------------------------------------

def test_ring_all_reduce_inside_a_node_is_the_textbook_formula():
    f = Fabric.of(H100)
    g = Group("dp", 8, 8)
    S = 1e9
    c, a = H100.gpu_link.latency_s, NVLINK_HOP_S
    assert collective_time("all_reduce", S, g, f) == pytest.approx(c + 2 * 7 * a + 2 * 7 / 8 * S / H100.gpu_link.bandwidth)
    assert collective_time("all_gather", S, g, f) == pytest.approx(c + 7 * a + 7 / 8 * S / H100.gpu_link.bandwidth)


def test_groups_across_nodes_are_limited_by_their_nics():
    f = Fabric.of(H100)
    one_per_node = Group("dp", 16, 1)  # e.g. the data-parallel group of a TP-8 job
    assert f.bus_bw(one_per_node) == H100.network.bandwidth
    eight_per_node = Group("dp", 64, 8)
    assert f.bus_bw(eight_per_node) == min(H100.gpu_link.bandwidth, 8 * H100.network.bandwidth)
    # trees keep latency logarithmic at scale
    big = Group("dp", 4096, 1)
    assert collective_time("all_reduce", 8, big, f) < 100 * H100.network.latency_s


def test_quad_gh200_mesh_pairs_get_one_link_not_all_three():
    f = Fabric.of(QUAD)
    assert f.bus_bw(Group("dp", 2, 2)) == pytest.approx(150e9)
    assert f.bus_bw(Group("dp", 4, 4)) == pytest.approx(450e9)


def test_single_superchip_nodes_talk_over_the_network():
    layout = Layout.of(Plan(gpus=4), GH200)
    assert layout.gpus_per_node == 1 and layout.nodes == 4
    assert Fabric.of(GH200).bus_bw(layout.groups()["dp"]) == GH200.network.bandwidth


def test_megatron_placement_puts_tp_inside_nodes():
    g = Layout.of(Plan(gpus=1024, tp=8, pp=8), H100).groups()
    assert (g["tp"].size, g["tp"].per_node) == (8, 8)
    assert (g["dp"].size, g["dp"].per_node) == (16, 1)
    assert (g["pp"].size, g["pp"].per_node) == (8, 1)


# --- memory per GPU -------------------------------------------------------------------------

def test_zero_model_states_match_the_zero_paper_figure_1():
    """Rajbhandari et al. 2020, Fig. 1: 7.5B params, 64 GPUs, fp16 + Adam (2 + 2 + 12 bytes)."""
    psi, plan = 7.5e9, Plan(gpus=64, framework=Framework.DEEPSPEED, precision="fp16")
    published = {0: 120, 1: 31.4, 2: 16.6, 3: 1.9}
    for zero, gb in published.items():
        total = sum(model_states(psi, psi, plan.with_(zero=zero), 64).values()) / 1e9
        assert total == pytest.approx(gb, rel=0.02), zero


def test_tensor_parallel_layers_free_every_tensor(cal):
    for sp in (False, True):
        for rc in Recompute:
            plan = Plan(gpus=8, tp=8, seq=1024, recompute=rc, sequence_parallel=sp, framework=Framework.DEEPSPEED)
            mb = build_microbatch(LLAMA7, plan, Layout.of(plan, H100), Chunk(2, True, True), True)
            net = {}
            for op in mb.graph.ops:
                for tag, b in (op.hbm_by_tag or {}).items():
                    net[tag] = net.get(tag, 0) + b
            assert {k for k, v in net.items() if abs(v) > 1} == {"grads"}, (sp, rc, net)


def test_sequence_parallelism_shrinks_saved_activations(cal):
    base = dict(gpus=8, tp=8, seq=2048, framework=Framework.DEEPSPEED, recompute=Recompute.SELECTIVE)
    no_sp = run(cal, LLAMA7, **base)
    sp = run(cal, LLAMA7, **base, sequence_parallel=True)
    assert sp.hbm.peak_bytes < no_sp.hbm.peak_bytes


def test_pipeline_stage0_holds_pp_microbatches_of_activations():
    for pp in (2, 4, 8):
        peak, count = peak_inflight_bytes(pp, 1, 4 * pp, 0, [1.0])
        assert count == pp
        assert peak_inflight_bytes(pp, 1, 4 * pp, pp - 1, [1.0])[1] == 1


def test_stage_orders_run_every_forward_and_backward_once():
    for pp, v, M in ((4, 1, 8), (4, 2, 8), (2, 3, 4), (8, 1, 3)):
        for d in range(pp):
            order = stage_order(pp, v, M, d)
            assert sorted(order) == sorted((k, c, m) for k in "FB" for c in range(v) for m in range(M))
            seen = set()
            for kind, c, m in order:  # a backward comes after its own forward
                if kind == FWD:
                    seen.add((c, m))
                else:
                    assert (c, m) in seen


# --- whole steps ------------------------------------------------------------------------------

def test_multi_gpu_report_is_consistent(cal):
    r = run(cal, gpus=16, tp=2, pp=2, global_batch=32, zero=1, framework=Framework.DEEPSPEED)
    assert math.isclose(sum(r.time_breakdown_s.values()), r.step_time_s, rel_tol=1e-9)
    d = r.to_dict()
    assert d["parallel"]["layout"]["dp"] == 4 and d["parallel"]["layout"]["micro_batches"] == 8
    assert 0 < d["mfu"] < 1 and 0 < d["gpu_utilization"] <= 1
    assert len(d["parallel"]["stages"]) == 2


def test_data_parallel_step_costs_about_one_gpu_plus_exposed_reduction(cal):
    one = run(cal, LLAMA7, gpus=1, seq=2048, framework=Framework.DEEPSPEED)
    two = run(cal, LLAMA7, gpus=8, seq=2048, framework=Framework.DEEPSPEED)
    assert one.step_time_s < two.step_time_s < 1.3 * one.step_time_s
    assert two.time_breakdown_s["communication"] > 0


def test_zero3_gathers_parameters_layer_by_layer(cal):
    r = run(cal, LLAMA7, gpus=8, seq=2048, zero=3, framework=Framework.FSDP_MIXED)
    gathered = r.hbm.breakdown.get("gathered_params", 0)
    layer = LLAMA7.layer_params * 2
    root = (LLAMA7.embedding_params + LLAMA7.lm_head_params + LLAMA7.hidden_size) * 2  # FSDP's root unit
    assert 0 < gathered <= 2 * layer + root + 1  # this layer, the prefetched next one and the root unit
    assert r.hbm.breakdown.get("params", 0) == 0  # fsdp keeps only fp32 shards (master_params)


def test_expert_parallel_moe_runs_all_to_all(cal):
    moe = load_model("mixtral-8x7b")
    r = run(cal, moe, gpus=16, tp=2, ep=8, seq=1024, zero=1, framework=Framework.DEEPSPEED)
    names = {op.name for op in r.timeline.ops}
    assert r.step_time_s > 0 and names


def test_seventy_b_on_1024_gpus_simulates_within_a_second(cal):
    model = load_model("llama-3-70b")
    plan = Plan(gpus=1024, tp=8, pp=8, seq=4096, global_batch=512, recompute=Recompute.FULL,
                framework=Framework.DEEPSPEED, zero=1)
    simulate(model, H100, plan, cal)
    t = time.perf_counter()
    r = simulate(model, H100, plan, cal)
    assert time.perf_counter() - t < 1.0
    assert r.fits


def test_zero_with_one_gpu_is_a_documented_no_op(cal):
    base = run(cal, gpus=1, seq=1024)
    z = run(cal, gpus=1, seq=1024, zero=2)
    assert z.step_time_s == base.step_time_s and z.hbm.peak_bytes == base.hbm.peak_bytes
    assert any("no saving" in n for n in z.notes)
    tp_only = run(cal, gpus=2, tp=2, seq=1024, zero=3)
    assert any("no saving" in n for n in tp_only.notes)


@pytest.mark.parametrize("plan, message", [
    (dict(gpus=6, tp=4), r"not divisible by tp\*pp"),
    (dict(gpus=6, tp=3), "attention heads"),
    (dict(gpus=16, tp=16, seq=1024), "key/value heads"),
    (dict(gpus=5, pp=5), "layers"),
    (dict(gpus=16, gpus_per_node=16), "exceeds"),
    (dict(gpus=12, gpus_per_node=8), "whole number"),
    (dict(gpus=8, ep=2), "mixture-of-experts"),
])
def test_bad_parallel_plans_are_rejected(cal, plan, message):
    model = LLAMA7 if "key/value" not in message else load_model("llama-3-8b")
    with pytest.raises(GhsimError, match=message):
        simulate(model, H100, Plan(**plan), cal)


def test_cli_bad_parallel_plan_is_one_line_and_exit_2():
    p = subprocess.run([sys.executable, "-c", "from ghsim.cli import main; main()", "simulate", "--model",
                        "llama-2-7b", "--hardware", "h100-sxm", "--gpus", "6", "--tp", "3"],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "attention heads" in p.stderr
