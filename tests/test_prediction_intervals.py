"""Prediction intervals (issue 19 item 3): the committed table's leave-one-out coverage on the
validation cases, that the table is what the cases give, and how the intervals reach the
report, compare and plan."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from ghsim.cli import main
from ghsim.report import intervals
from ghsim.tomlio import read_toml

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def table():
    return intervals.rows_from_table(read_toml(intervals.TABLE))


def test_leave_one_out_covers_at_least_90_percent_of_the_cases(table):
    rows, spread = table
    cov = intervals.leave_one_out(rows, spread)
    assert cov.cases >= 30
    assert cov.step_covered / cov.cases >= 0.9, cov.missed
    assert cov.peak_covered / cov.cases >= 0.9
    # no wider than the validation README says (it quotes these widths)
    assert cov.step_mean_width_rel < 0.30 and cov.peak_mean_width_rel < 0.10


def test_a_case_left_out_does_not_shape_its_own_interval(table):
    rows, spread = table
    i = max(range(len(rows)), key=lambda k: abs(rows[k].measured_step_s / rows[k].predicted_step_s - 1))
    moved = rows[:i] + [dataclasses.replace(rows[i], measured_step_s=rows[i].measured_step_s * 3,
                                            measured_busy_s=0.0, measured_peak_bytes=1.0)] + rows[i + 1:]
    assert intervals.held_out(moved, i, spread) == intervals.held_out(rows, i, spread)
    assert intervals.fit(moved, spread) != intervals.fit(rows, spread)  # it does shape the others'


def test_the_committed_table_is_what_the_cases_give(table):
    """Three of the cases, simulated and read from their traces again (the whole table:
    `python benchmarks/prediction_intervals.py --check`)."""
    from ghsim.validate.cases import validate
    from ghsim.validate.interval_table import case_row, microbench_spread

    rows, spread = table
    committed = {r.name: r for r in rows}
    for result in validate(REPO / "validation", only="llama370m"):
        fresh = case_row(result)
        old = committed[fresh.name]
        for field in ("predicted_step_s", "measured_step_s", "predicted_busy_s", "measured_busy_s",
                      "predicted_peak_bytes", "measured_peak_bytes", "predicted_utilization"):
            assert getattr(fresh, field) == pytest.approx(getattr(old, field), rel=1e-9), (fresh.name, field)
    assert {k: v["value"] for k, v in microbench_spread(REPO).items()} == pytest.approx(spread)


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-4, 1e4), st.floats(0.0, 1.0), st.floats(1e6, 1e12))
def test_intervals_are_ordered_and_scale_with_the_prediction(step, util, peak):
    m = intervals.load_model()
    lo, hi = m.step_interval(step, util)
    assert 0 <= lo <= hi
    lo2, hi2 = m.step_interval(2 * step, util)
    assert lo2 == pytest.approx(2 * lo) or lo == 0
    assert hi2 == pytest.approx(2 * hi)
    plo, phi = m.peak_interval(peak)
    assert 0 <= plo <= phi


def test_an_untimed_plan_has_no_interval():
    assert intervals.step_interval(float("nan"), float("nan")) is None
    assert intervals.peak_interval(float("nan")) is None


def test_a_plan_that_waits_on_its_host_gets_a_wider_interval():
    m = intervals.load_model()
    busy_lo, busy_hi = m.step_interval(1.0, 0.98)
    idle_lo, idle_hi = m.step_interval(1.0, 0.2)
    assert (idle_hi - idle_lo) > (busy_hi - busy_lo)  # host gaps were the less predictable row


def test_simulate_and_compare_carry_the_intervals():
    args = ["--model", "llama-3-8b", "--hardware", "h100-sxm", "--lora-rank", "16", "--seq", "1024"]
    d = json.loads(CliRunner().invoke(main, ["simulate", *args, "--json"]).output)
    lo, hi = d["step_time_interval_s"]
    assert lo < hi and lo <= d["step_time_s"] * 1.2
    plo, phi = d["memory"]["hbm_peak_interval_bytes"]
    assert plo <= d["memory"]["hbm_peak_bytes"] <= phi
    text = CliRunner().invoke(main, ["simulate", *args]).output
    assert f"(interval {lo * 1e3:.1f}-{hi * 1e3:.1f} ms)" in text and "in 31 validation cases on h100-sxm, h200-sxm" in text
    out = CliRunner().invoke(main, ["compare", *args, "--hardware", "h200-sxm"]).output
    assert "  interval (ms)" in out


def test_plan_calls_overlapping_plans_a_tie():
    r = CliRunner().invoke(main, ["plan", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--lora-rank", "16",
                                  "--seq", "1024", "--jobs", "1", "--precisions", "bf16", "--recompute", "none",
                                  "--top", "4", "--json", "--time-limit", "0"])
    assert r.exit_code == 0, r.output
    plans = json.loads(r.output)["plans"]
    best = plans[0]["step_time_interval_s"]
    assert plans[0]["tie_with_best"] is None
    for p in plans[1:]:
        lo, hi = p["step_time_interval_s"]
        overlaps = lo <= best[1] and best[0] <= hi
        assert bool(p["tie_with_best"]) == overlaps
        if overlaps:
            assert "intervals overlap" in p["tie_with_best"]


def test_sweep_rows_carry_the_intervals():
    from ghsim.search.sweep import SweepTask, run_task

    row = run_task(SweepTask("llama-3-8b", "h100-sxm", 1, seq=1024, lora_rank=16, precisions=("bf16",),
                             pins=(("recompute", "none"),), time_limit=0.0))
    assert row["status"] == "ok", row["error"]
    assert row["step_time_lo_s"] < row["step_time_hi_s"] and row["hbm_peak_lo_gb"] <= row["hbm_peak_hi_gb"]
