"""`ghsim trace compare` and `ghsim validate --explain`: rows that add up to each side's step,
deltas that add up to the step error, phases read from the kernel sequence, and the CLI's
error contract."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from ghsim.cli import main
from ghsim.errors import GhsimError
from ghsim.traces import events as ev
from ghsim.traces import phases as mt
from ghsim.traces.attribution import breakdown, measured_breakdown, simulated_breakdown, with_step_time
from ghsim.traces.comparison import compare
from synthetic_traces import write_kineto

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "data"


def _events(rows):
    return pd.DataFrame(rows, columns=["start_ns", "end_ns", "category", "phase", "name"])


def _chrome(events, step_s):
    """A minimal ghsim timeline: one GPU track, (cat, phase, ts_us, dur_us) events."""
    return {"otherData": {"generator": "ghsim", "step_time_s": step_s},
            "traceEvents": [{"ph": "M", "name": "thread_name", "tid": 1, "args": {"name": "gpu"}},
                            {"ph": "M", "name": "thread_name", "tid": 2, "args": {"name": "dp"}}]
            + [{"ph": "X", "name": f"op{i}", "cat": c, "tid": tid, "ts": ts, "dur": dur, "args": {"phase": p, **extra}}
               for i, (c, p, ts, dur, tid, extra) in enumerate(events)]}


def test_overlap_is_counted_once_compute_first():
    # gemm 0-60, communication 40-100 (20 hidden), copy 90-120 (10 hidden), idle 120-200
    e = _events([(0, 60, "gemm", mt.FWD, "g"), (40, 100, "communication", "", "c"), (90, 120, mt.COPIES, "", "m")])
    b = breakdown(e, np.array([[0, 200]]), 1, "x")
    assert b.by_category["gemm"] == pytest.approx(60e-9)
    assert b.by_category["communication"] == pytest.approx(40e-9)
    assert b.by_category[mt.COPIES] == pytest.approx(20e-9)
    assert b.by_category[mt.HOST_GAPS] == pytest.approx(80e-9)
    assert b.by_phase[mt.FWD] == pytest.approx(60e-9)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 300), st.sampled_from(mt.CATEGORY_ROWS[:-1]),
                          st.sampled_from(mt.PHASES)), max_size=30), st.integers(1, 4))
def test_rows_add_up_to_the_step_and_never_go_negative(raw, steps):
    e = _events([(s, s + d, c, p, "k") for s, d, c, p in raw])
    b = breakdown(e, np.array([[100, 1100]]), steps, "x")
    for rows in (b.by_category, b.by_phase):
        assert sum(rows.values()) == pytest.approx(b.step_s, rel=1e-12)
        assert min(rows.values()) >= 0
    assert b.step_s == pytest.approx(1000e-9 / steps)


def test_shares_add_up_to_the_step_error():
    pred = simulated_breakdown(_chrome([("gemm", "fwd", 0, 50, 1, {}), ("elementwise", "bwd", 50, 30, 1, {}),
                                        ("communication", "bwd", 60, 40, 2, {})], 100e-6), "pred")
    meas = breakdown(_events([(0, 70_000, "gemm", mt.FWD, "g"), (70_000, 90_000, "elementwise", mt.BWD, "e"),
                              (95_000, 130_000, mt.COPIES, "", "m")]), np.array([[0, 150_000]]), 1, "meas")
    c = compare(pred, meas)
    assert c.error_s == pytest.approx(-50e-6)
    for rows in (c.by_category, c.by_phase):
        assert sum(r.delta_s for r in rows) == pytest.approx(c.error_s)
        assert sum(c.share(r.delta_s) for r in rows) == pytest.approx(1.0)
    by = {r.name: r for r in c.by_category}
    assert by["communication"].predicted_s == pytest.approx(20e-6)  # 60-80 hidden behind elementwise
    assert by["gemm"].delta_s == pytest.approx(-20e-6)
    top = c.kernels.iloc[0]
    assert (top["phase"], top["category"]) == ("", mt.COPIES) or abs(top["delta_s"]) >= 20e-6


def test_a_composite_op_splits_over_its_categories_and_launch_gaps_are_idle():
    pred = simulated_breakdown(_chrome([("norm_reduction", "fwd", 0, 100, 1,
                                         {"split": {"elementwise": 0.75, "norm_reduction": 0.25}, "launch_gap_us": 20})],
                                       100e-6), "p")
    assert pred.by_category["elementwise"] == pytest.approx(60e-6)
    assert pred.by_category["norm_reduction"] == pytest.approx(20e-6)
    assert pred.by_category[mt.HOST_GAPS] == pytest.approx(20e-6)


def test_phases_follow_the_kernel_sequence_step_by_step():
    names = ["gemm_fwd", "softmax", "nll_loss_backward_reduce", "gemm_dgrad_like", "multi_tensor_apply_kernel",
             "gemm_fwd", "nll_loss_backward_reduce", "multi_tensor_apply_kernel", "elementwise"]
    cats = ["gemm", "norm_reduction", "norm_reduction", "gemm", "optimizer", "gemm", "norm_reduction", "optimizer",
            "elementwise"]
    starts = np.arange(len(names)) * 10
    steps = np.array([[0, 50], [50, 90]])
    phases = mt.measured_phases(starts, names, cats, steps, optimizer_starts=np.array([35, 65]))
    assert list(phases) == [mt.FWD, mt.FWD, mt.BWD, mt.BWD, mt.OPT, mt.FWD, mt.BWD, mt.OPT, mt.OPT]


def test_the_timed_step_moves_host_gaps_only():
    b = breakdown(_events([(0, 60, "gemm", mt.FWD, "g")]), np.array([[0, 100]]), 1, "x")
    t = with_step_time(b, 90e-9, "timed")
    assert t.by_category["gemm"] == b.by_category["gemm"]
    assert t.by_category[mt.HOST_GAPS] == pytest.approx(30e-9)
    assert sum(t.by_phase.values()) == pytest.approx(90e-9)


def test_a_measured_trace_without_a_timeline_is_refused(tmp_path):
    csv = tmp_path / "s.csv"
    csv.write_text("Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
                   "100.0,6000,3,2000,2000,1000,3000,100,ampere_sgemm\n")
    from ghsim.traces import load_trace

    with pytest.raises(GhsimError, match="no timeline"):
        measured_breakdown(load_trace(csv))


@pytest.fixture(scope="module")
def predicted_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cmp") / "pred.json"
    r = CliRunner().invoke(main, ["simulate", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--lora-rank", "16",
                                  "--seq", "1024", "--trace", str(path)])
    assert r.exit_code == 0, r.output
    return path


def test_cli_compare_text_and_json(predicted_file, tmp_path):
    measured = tmp_path / "k.json"
    write_kineto(measured, steps=3, kernels_per_step=40)
    r = CliRunner().invoke(main, ["trace", "compare", str(predicted_file), str(measured), "--steps", "2-3"])
    assert r.exit_code == 0, r.output
    assert "share of error" in r.output and "largest mismatches" in r.output
    r = CliRunner().invoke(main, ["trace", "compare", str(predicted_file), str(measured), "--json", "--step-time", "0.5"])
    d = json.loads(r.output)
    assert d["step_time_s"]["measured"] == pytest.approx(0.5)
    assert sum(row["share_of_error"] for row in d["by_phase"]) == pytest.approx(1.0)
    assert sum(row["delta_s"] for row in d["by_category"]) == pytest.approx(d["step_time_s"]["error_s"])


@pytest.mark.parametrize("swap", [True, False])
def test_cli_compare_refuses_files_in_the_wrong_place(predicted_file, tmp_path, swap):
    measured = tmp_path / "k.json"
    write_kineto(measured, steps=1, kernels_per_step=5)
    args = [str(measured), str(predicted_file)] if swap else [str(predicted_file), str(tmp_path)]
    r = CliRunner().invoke(main, ["trace", "compare", *args])
    assert r.exit_code == 2
    assert len(r.stderr.strip().splitlines()) == 1


def test_validate_explain_on_a_real_case_adds_up_to_its_error():
    from ghsim.validate.cases import validate
    from ghsim.validate.explain import carriers, explain_case

    (result,) = validate(REPO / "validation", only="h100-llama370m-tf32")
    e = explain_case(result)
    c = e.comparison
    assert c.error_rel == pytest.approx(result.errors["step_time_rel"], abs=1e-6)  # ns rounding
    assert sum(r.delta_s for r in c.by_category) == pytest.approx(c.error_s)
    assert sum(r.predicted_s for r in c.by_phase) == pytest.approx(result.predicted["step_time_s"], rel=1e-6)
    rows = carriers([e])
    assert {d["row"] for d in rows} == set(mt.CATEGORY_ROWS) and sum(d["largest_in_cases"] for d in rows) == 1


@pytest.mark.parametrize("hardware, noted", [("h100-sxm", False), ("a100-sxm-80gb", True)])
def test_a_trace_from_another_gpu_is_noted(tmp_path, hardware, noted):
    from ghsim.traces import load_trace

    measured = tmp_path / "k.json"
    write_kineto(measured, steps=1, kernels_per_step=5)  # on an "NVIDIA H100 80GB HBM3"
    chrome = _chrome([("gemm", "fwd", 0, 50, 1, {})], 100e-6)
    chrome["otherData"]["hardware"] = hardware
    c = compare(simulated_breakdown(chrome, "p"), measured_breakdown(load_trace(measured)))
    assert any("measured on NVIDIA H100" in n for n in c.notes) == noted
