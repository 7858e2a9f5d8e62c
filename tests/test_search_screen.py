"""Screening: a plan's step extrapolated from small simulations (fewer layers, fewer
micro-batches) must match the full simulation, since the search ranks plans by it."""

from __future__ import annotations

import dataclasses
import random

import pytest

from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Framework, Plan, Precision, Recompute
from ghsim.search.screen import Status, compute_bound, evaluate
from ghsim.simulate import simulate

GH200 = load_hardware("gh200-96gb")
MODEL = dataclasses.replace(load_model("llama-2-7b"), num_layers=16)  # 16 layers: screened on 2 and 4


def _plans(n: int, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        p = Plan(seq=rng.choice([512, 1024]), micro_batch=rng.choice([1, 2]),
                 precision=rng.choice([Precision.BF16, Precision.FP8, Precision.FP32]),
                 recompute=rng.choice(list(Recompute)), framework=rng.choice(list(Framework)),
                 lora_rank=rng.choice([0, 16]), cuda_graphs=rng.choice([False, True]),
                 offload=rng.choice([frozenset(), frozenset({"optimizer", "grads"}), frozenset({"activations"})]),
                 optimizer_impl=rng.choice(["foreach", "fused"]))
        if p.precision == Precision.FP8 and p.lora_rank:
            continue
        out.append(p.with_(global_batch=p.micro_batch * rng.choice([5, 8])))
    return out


@pytest.mark.parametrize("plan", _plans(10, 1), ids=lambda p: p.flags()[18:])
def test_screened_step_matches_the_full_simulation(cal, plan):
    screened = evaluate(MODEL, GH200, plan, cal, level="screen")
    full = simulate(MODEL, GH200, plan, cal, keep_timeline=False)
    assert screened.step_time_s == pytest.approx(full.step_time_s, rel=0.01)
    assert screened.gpu_utilization == pytest.approx(full.gpu_utilization, abs=0.01)
    # peaks are convex in the layer count: extrapolation never over-estimates them
    assert screened.hbm_peak_bytes <= full.hbm.peak_bytes * (1 + 1e-9)
    assert screened.hbm_peak_bytes == pytest.approx(full.hbm.peak_bytes, rel=0.05)
    confirmed = evaluate(MODEL, GH200, plan, cal, level="confirm")
    assert confirmed.exact
    assert confirmed.step_time_s == pytest.approx(full.step_time_s, rel=1e-3)
    assert confirmed.hbm_peak_bytes == pytest.approx(full.hbm.peak_bytes, rel=1e-6)


@pytest.mark.parametrize("plan", _plans(4, 2), ids=lambda p: p.flags()[18:])
def test_compute_bound_is_a_lower_bound(cal, plan):
    full = simulate(MODEL, GH200, plan, cal, keep_timeline=False)
    assert compute_bound(MODEL, GH200, plan, cal) <= full.step_time_s


def test_a_plan_that_cannot_beat_the_bar_stops_early(cal):
    plan = Plan(seq=1024, global_batch=8, recompute=Recompute.FULL)
    full = simulate(MODEL, GH200, plan, cal, keep_timeline=False)
    stopped = evaluate(MODEL, GH200, plan, cal, bar=full.step_time_s / 3)
    assert stopped.status == Status.BOUNDED and "needs at least" in stopped.reason
    assert evaluate(MODEL, GH200, plan, cal, bar=full.step_time_s * 2).status == Status.FEASIBLE


def test_rejected_plans_carry_the_simulators_reason(cal):
    e = evaluate(MODEL, GH200, Plan(precision=Precision.FP8, lora_rank=8), cal)
    assert e.status == Status.REJECTED and "LoRA" in e.reason


# --- several GPUs: memory from the micro-batch graphs first, then the timed simulation ----------
H100 = load_hardware("h100-sxm")
MULTI = [  # fit and do not fit on 80 GB, with and without offload, pipelines, ZeRO-3
    Plan(gpus=8, seq=4096, global_batch=16, zero=1, framework=Framework.DEEPSPEED),
    Plan(gpus=8, seq=4096, global_batch=32, micro_batch=4, framework=Framework.DEEPSPEED),
    Plan(gpus=8, seq=4096, global_batch=16, pp=2, pp_interleave=2, micro_batch=2, zero=1,
         framework=Framework.DEEPSPEED),
    Plan(gpus=8, seq=4096, global_batch=16, zero=3, offload=frozenset({"optimizer", "grads"}),
         framework=Framework.DEEPSPEED),
    Plan(gpus=8, seq=4096, global_batch=64, micro_batch=8, tp=2, zero=2, framework=Framework.DEEPSPEED),
]


@pytest.mark.parametrize("plan", MULTI, ids=lambda p: p.flags())
def test_multi_gpu_verdict_matches_the_simulator(cal, plan):
    """A plan the memory replay rules out is not timed; every verdict is still the simulator's."""
    model = load_model("llama-2-7b")
    e = evaluate(model, H100, plan, cal, level="screen")
    full = simulate(model, H100, plan, cal, keep_timeline=False)
    assert e.exact
    assert (e.status == Status.FEASIBLE) == full.fits
    assert e.hbm_peak_bytes == full.hbm.peak_bytes and e.host_peak_bytes == full.host.peak_bytes
    if full.fits:
        assert e.step_time_s == full.step_time_s
    else:
        assert e.reason == "; ".join(full.fit_problems) and e.step_time_s != e.step_time_s  # not timed: NaN


def test_multi_gpu_verdicts_include_both_outcomes(cal):
    """(the cases above exercise both branches)"""
    model = load_model("llama-2-7b")
    fits = {simulate(model, H100, p, cal, keep_timeline=False).fits for p in MULTI}
    assert fits == {True, False}
