"""Invariants of whole-step predictions, over random models and plans (synthetic calibration)."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from ghsim.hardware import load_hardware
from ghsim.model import ModelSpec
from ghsim.plan import Plan, Precision, Recompute
from ghsim.simulate import simulate
from synthetic import synthetic_calibration

CAL = synthetic_calibration()
FAST_GEMM = synthetic_calibration(gemm_eff=0.85)
HW = load_hardware("h100-sxm")


@st.composite
def models(draw):
    heads = draw(st.sampled_from([8, 16, 32]))
    head_dim = draw(st.sampled_from([64, 128]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
    hidden = heads * head_dim
    return ModelSpec(name="random", hidden_size=hidden, intermediate_size=draw(st.sampled_from([2, 3, 4])) * hidden,
                     num_layers=draw(st.integers(1, 6)), num_attention_heads=heads, num_kv_heads=kv,
                     head_dim=head_dim, vocab_size=draw(st.sampled_from([1000, 32000])))


@st.composite
def plans(draw):
    return Plan(seq=draw(st.sampled_from([128, 512, 2048])), micro_batch=draw(st.integers(1, 4)),
                precision=draw(st.sampled_from(list(Precision))), recompute=draw(st.sampled_from(list(Recompute))),
                lora_rank=draw(st.sampled_from([0, 0, 8])), cuda_graphs=draw(st.booleans()),
                optimizer_impl=draw(st.sampled_from(["foreach", "fused"])))


def valid(plan):
    return not (plan.lora_rank and plan.precision == Precision.FP8)


@settings(max_examples=40, deadline=None)
@given(models(), plans())
def test_breakdown_adds_up_and_utilization_is_a_fraction(model, plan):
    if not valid(plan):
        return
    r = simulate(model, HW, plan, CAL, keep_timeline=True)
    assert math.isclose(sum(r.time_breakdown_s.values()), r.step_time_s, rel_tol=1e-9)
    assert 0.0 < r.gpu_utilization <= 1.0 + 1e-12


@settings(max_examples=40, deadline=None)
@given(models(), plans())
def test_memory_never_drops_when_micro_batch_grows(model, plan):
    if not valid(plan):
        return
    small = simulate(model, HW, plan, CAL)
    big = simulate(model, HW, plan.with_(micro_batch=plan.micro_batch + 1), CAL)
    assert big.hbm.peak_bytes >= small.hbm.peak_bytes


@settings(max_examples=40, deadline=None)
@given(models(), plans())
def test_recompute_never_raises_peak_memory(model, plan):
    if not valid(plan):
        return
    peaks = [simulate(model, HW, plan.with_(recompute=rc), CAL).hbm.peak_bytes
             for rc in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)]
    assert peaks[1] <= peaks[0] * (1 + 1e-9)
    assert peaks[2] <= peaks[0] * (1 + 1e-9)


@settings(max_examples=40, deadline=None)
@given(models(), plans())
def test_faster_gemms_never_slow_the_step(model, plan):
    if not valid(plan):
        return
    assert simulate(model, HW, plan, FAST_GEMM).step_time_s <= simulate(model, HW, plan, CAL).step_time_s + 1e-12
