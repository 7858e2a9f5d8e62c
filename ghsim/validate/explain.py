"""`ghsim validate --explain`: where each case's step error comes from (traces/comparison.py),
and which rows carry the error across the cases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ghsim.traces import phases as mt
from ghsim.traces.comparison import Comparison
from ghsim.validate.cases import CaseResult, case_hardware, case_model


@dataclass(frozen=True)
class CaseExplanation:
    name: str
    comparison: Comparison


def explain_case(result: CaseResult) -> CaseExplanation | None:
    """The case's prediction held against its trace, the timed step standing for the measured one;
    None for a skipped case or one without a trace."""
    case = result.case
    if result.status == "skipped" or case.trace is None:
        return None
    from ghsim.report.step_report import chrome_trace
    from ghsim.simulate import simulate
    from ghsim.traces import load_trace
    from ghsim.traces.attribution import measured_breakdown, simulated_breakdown, with_step_time
    from ghsim.traces.comparison import compare

    report = simulate(case_model(case), case_hardware(case), case.plan)
    pred = simulated_breakdown(chrome_trace(report), "ghsim")
    meas = with_step_time(measured_breakdown(load_trace(case.trace)), result.measured["step_time_s"],
                          "timed without the profiler, case.toml")
    return CaseExplanation(case.name, compare(pred, meas))


def carriers(explained: list[CaseExplanation]) -> list[dict[str, Any]]:
    """Per category row across the cases: its median and largest |delta| as a share of the measured
    step, its mean share of the step error, and in how many cases it is the largest term."""
    out = []
    largest = [max(e.comparison.by_category, key=lambda r: abs(r.delta_s)).name for e in explained]
    for i, row in enumerate(mt.CATEGORY_ROWS):
        rel = np.array([e.comparison.by_category[i].delta_s / e.comparison.measured.step_s for e in explained])
        shares = [s for e in explained if (s := e.comparison.share(e.comparison.by_category[i].delta_s)) is not None]
        out.append({"row": row, "median_abs_delta_rel": float(np.median(np.abs(rel))) if len(rel) else 0.0,
                    "max_abs_delta_rel": float(np.abs(rel).max()) if len(rel) else 0.0,
                    "mean_signed_delta_rel": float(rel.mean()) if len(rel) else 0.0,
                    "median_share_of_error": float(np.median(shares)) if shares else None,
                    "largest_in_cases": largest.count(row)})
    return sorted(out, key=lambda d: -d["median_abs_delta_rel"])


def to_dict(explained: list[CaseExplanation]) -> dict[str, Any]:
    return {"cases": [{"name": e.name, **e.comparison.to_dict()} for e in explained],
            "carriers": carriers(explained)}


def render(explained: list[CaseExplanation]) -> str:
    if not explained:
        return "no case with a trace to explain"
    if len(explained) == 1:
        return f"case {explained[0].name}\n" + explained[0].comparison.to_table()
    short = {"norm_reduction": "norm", "communication": "comm", "elementwise": "elemwise", "attention": "attn",
             "optimizer": "optim", "host gaps": "gaps"}
    head = f"{'case (delta ms per step: predicted - measured)':<44} {'error':>8}" + "".join(
        f" {short.get(r, r):>8}" for r in mt.CATEGORY_ROWS)
    lines = [head, "-" * len(head)]
    for e in explained:
        c = e.comparison
        lines.append(f"{e.name:<44} {c.error_rel:+8.1%}" + "".join(f" {r.delta_s * 1e3:+8.1f}" for r in c.by_category))
    lines += ["", "which rows carry the error across the cases (|delta| as a share of the measured step)",
              f"  {'row':<16} {'median':>8} {'max':>8} {'mean signed':>12} {'median share':>13} {'largest in':>11}"]
    for d in carriers(explained):
        share = "-" if d["median_share_of_error"] is None else f"{d['median_share_of_error']:+.0%}"
        lines.append(f"  {d['row']:<16} {d['median_abs_delta_rel']:8.1%} {d['max_abs_delta_rel']:8.1%} "
                     f"{d['mean_signed_delta_rel']:+12.1%} {share:>13} {d['largest_in_cases']:>6} cases")
    return "\n".join(lines)
