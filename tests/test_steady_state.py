"""Identical micro-batches cost O(1) (issue 17 item 10): a step of M micro-batches extrapolated
from its steady state equals the step simulated in full, for every kind of plan; absurd
sizes are refused in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghsim.errors import GhsimError
from ghsim.hardware import load_hardware
from ghsim.model import model_from_dict
from ghsim.plan import Plan
from ghsim.graph.pipeline import peak_inflight_bytes
from ghsim.simulate import inflight_microbatches, simulate, simulate_prepared

H100 = load_hardware("h100-sxm")
GH200 = load_hardware("gh200-96gb")
TINY = model_from_dict(dict(name="tiny", hidden_size=512, intermediate_size=1408, num_layers=4,
                            num_attention_heads=8, num_kv_heads=4, vocab_size=8000), "tiny")

PLANS = {
    "one-gpu": (H100, dict(seq=512)),
    "one-gpu-loader": (H100, dict(seq=512, batch_prep_s=0.03, dataloader_workers=2)),
    "one-gpu-offload": (GH200, dict(seq=512, offload=("optimizer",), zero=2)),
    "one-gpu-unified-memory": (GH200, dict(seq=512, unified_memory=True)),
    "dp2-zero2": (H100, dict(seq=512, gpus=2, zero=2)),
    "pp2": (H100, dict(seq=512, gpus=2, pp=2)),
    "pp2-interleaved": (H100, dict(seq=512, gpus=2, pp=2, pp_interleave=2)),
    "dp2-offload": (H100, dict(seq=512, gpus=2, zero=2, offload=("optimizer",))),
}


def _flat(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        elif isinstance(v, list):
            for i, x in enumerate(v):
                yield from _flat(x if isinstance(x, dict) else {"": x}, f"{prefix}{k}[{i}].")
        else:
            yield prefix + str(k), v


@pytest.mark.parametrize("name", PLANS)
@pytest.mark.parametrize("microbatches", [29, 40])
def test_extrapolated_step_equals_the_full_simulation(cal, name, microbatches):
    hw, fields = PLANS[name]
    dp = fields.get("gpus", 1) // fields.get("pp", 1)
    if fields.get("pp_interleave"):  # interleaved 1F1B: micro-batches a multiple of pp
        microbatches += microbatches % fields["pp"]
    plan = Plan(**fields, global_batch=dp * microbatches)
    full = simulate_prepared(TINY, hw, plan, cal, keep_timeline=False, exact_up_to=10**6)
    fast = simulate_prepared(TINY, hw, plan, cal, keep_timeline=False, exact_up_to=8)
    assert any("steady-state period" in n for n in fast.notes)
    assert fast.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    a, b = fast.to_dict(), full.to_dict()
    a["notes"], b["notes"] = a["notes"][:-1], b["notes"]
    for (key, x), (key2, y) in zip(_flat(a), _flat(b)):
        assert key == key2
        if isinstance(x, float):
            assert x == pytest.approx(y, rel=1e-9, abs=1e-12), key
        else:
            assert x == y, key


def test_ten_million_microbatches_take_no_more_than_a_few(cal):
    plan = Plan(seq=512, global_batch=10_000_000)
    r = simulate(TINY, H100, plan, cal)
    few = simulate(TINY, H100, Plan(seq=512, global_batch=64), cal)
    per_micro = few.step_time_s / 64
    assert r.step_time_s == pytest.approx(10_000_000 * per_micro, rel=0.01)
    assert r.tokens_per_step == 10_000_000 * 512
    assert len(r.timeline.ops) < 20 * len(few.timeline.ops) / 64 * 64  # a bounded timeline, not 10**7 micro-batches


def test_absurd_batch_is_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "ghsim.cli", "simulate", "--model", "llama-3-8b",
                        "--global-batch", str(10**12)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--global-batch" in r.stderr


def test_absurd_layer_count_is_refused(tmp_path):
    with pytest.raises(GhsimError, match="'num_layers' = 1000000000 is beyond"):
        model_from_dict(dict(hidden_size=512, intermediate_size=1408, num_layers=10**9, num_attention_heads=8,
                             vocab_size=8000), "t.toml")


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 400), st.data())
def test_inflight_peak_of_many_microbatches_is_reached_within_a_few(pp, v, M, data):
    if v > 1 and M % pp:
        M += pp - M % pp
    d = data.draw(st.integers(0, pp - 1))
    saved = data.draw(st.lists(st.floats(0.0, 1e9), min_size=v, max_size=v))
    few, full = peak_inflight_bytes(pp, v, inflight_microbatches(pp, v, M), d, saved), \
        peak_inflight_bytes(pp, v, M, d, saved)
    assert few[1] == full[1] and few[0] == pytest.approx(full[0], rel=1e-12)  # (summed in another order)


@pytest.mark.parametrize("fields", [dict(gpus=2, pp=2), dict(gpus=2, pp=2, pp_interleave=2), dict(gpus=2)])
def test_step_time_floor_of_many_microbatches_matches_the_full_schedule(cal, fields):
    from ghsim import simulate as sim
    from ghsim.step_floors import step_time_floor
    plan = Plan(seq=512, global_batch=(2 if fields.get("pp", 1) == 1 else 1) * 96, **fields)
    rank = sim.prepare(TINY, H100, plan, cal)
    fast = step_time_floor(TINY, H100, plan, rank)
    exact = sim.EXACT_MICROBATCHES
    try:
        sim.EXACT_MICROBATCHES = 10**6
        full = step_time_floor(TINY, H100, plan, sim.prepare(TINY, H100, plan, cal))
    finally:
        sim.EXACT_MICROBATCHES = exact
    assert fast == pytest.approx(full, rel=1e-9)
