"""Write hardware_profiles/calibration/prediction_intervals.toml: the measured spread the
prediction intervals are built from (ghsim/report/intervals.py), and print their
leave-one-out coverage.

    PYTHONPATH=$PWD python benchmarks/prediction_intervals.py [--check]

--check: fail (exit 1) when the committed table differs from what the cases give now.
--coverage: print the committed table's leave-one-out coverage (README.md quotes it).
--held-out: the same, and coverage on measured sets the table never saw (validation/README.md).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from ghsim.report.intervals import TABLE, CaseRow, IntervalModel, fit, leave_one_out, rows_from_table
from ghsim.tomlio import read_toml
from ghsim.validate.cases import validate
from ghsim.validate.interval_table import case_row, microbench_spread, table_toml

ROOT = Path(__file__).resolve().parents[1]
CASES = "validation/cases"


def coverage_table() -> str:
    """The committed table's leave-one-out coverage, as README.md quotes it."""
    rows, spread = rows_from_table(read_toml(TABLE))
    cov = leave_one_out(rows, spread)
    return "\n".join(["| interval | measured value inside (leave-one-out) | mean width |", "| --- | --- | --- |",
                      f"| step time | {cov.step_covered} of {cov.cases} cases | {cov.step_mean_width_rel:.1%} |",
                      f"| peak allocated HBM | {cov.peak_covered} of {cov.cases} cases | {cov.peak_mean_width_rel:.1%} |"])


HELD_OUT = ("validation/measured_libraries", "validation/published/sailor2025-clariden",
            "validation/published/steiger2025-eth-gh200")
LIBRARY_OFFLOAD = ("-ds-", "-fsdp2-", "-plain-")  # issue 14's cases, on any machine (h100-, h200-, h200x2-)


def one_band(rows: list[CaseRow], spread: dict[str, float]) -> IntervalModel:
    """The comparison: the same conformal bounds on the plain relative error (no rows)."""
    z = [r.measured_step_s / r.predicted_step_s - 1 for r in rows]
    return dataclasses.replace(fit(rows, spread), busy_spread=1.0, idle_spread=1.0, step_scores=(min(z), max(z)))


def _group(folder: str, case: str) -> str:
    if not folder.endswith("measured_libraries"):
        return folder.removeprefix("validation/")
    return ("measured_libraries: offload and ZeRO (issue 14)" if any(tag in case for tag in LIBRARY_OFFLOAD)
            else "measured_libraries: compile, torchao, HF, PEFT (issue 15)")


def _inside(interval: tuple[float, float], measured: float, predicted: float) -> tuple[bool, float]:
    return interval[0] <= measured <= interval[1], (interval[1] - interval[0]) / predicted


def _cell(covered: int, n: int, width: float) -> str:
    return f"{covered} ({covered / n:.0%}) / {width:.1%}"


def held_out_table() -> str:
    """Leave-one-out on the table's own cases, and coverage on measured sets it never saw; beside
    it, one relative band for every plan (validation/README.md quotes the table)."""
    rows, spread = rows_from_table(read_toml(TABLE))
    by_rows, band = fit(rows, spread), one_band(rows, spread)
    cov, cov_band = leave_one_out(rows, spread), leave_one_out(rows, spread, one_band)
    lines = ["| cases | n | step covered / mean width | same, one relative band for every plan | "
             "HBM covered / mean width |", "| --- | --- | --- | --- | --- |",
             f"| validation/cases, leave-one-out | {cov.cases} | "
             f"{_cell(cov.step_covered, cov.cases, cov.step_mean_width_rel)} | "
             f"{_cell(cov_band.step_covered, cov.cases, cov_band.step_mean_width_rel)} | "
             f"{_cell(cov.peak_covered, cov.cases, cov.peak_mean_width_rel)} |"]
    groups: dict[str, list[list[tuple[bool, float]]]] = {}
    for folder in HELD_OUT:
        for r in validate(ROOT / folder, with_trace=False):
            if r.status == "skipped":
                continue
            p, m = r.predicted, r.measured
            cells = [_inside(mod.step_interval(p["step_time_s"], p["gpu_utilization"]), m["step_time_s"],
                             p["step_time_s"]) for mod in (by_rows, band)]
            cells.append(_inside(by_rows.peak_interval(p["peak_memory_bytes"]), m["peak_memory_bytes"],
                                 p["peak_memory_bytes"]))
            groups.setdefault(_group(folder, r.case.name), []).append(cells)
    for name, cells in groups.items():
        n = len(cells)
        lines.append(f"| {name} | {n} | " + " | ".join(
            _cell(sum(c[k][0] for c in cells), n, sum(c[k][1] for c in cells) / n) for k in range(3)) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if "--coverage" in argv:
        print(coverage_table())
        return 0
    if "--held-out" in argv:
        print(held_out_table())
        return 0
    results = validate(ROOT / "validation")
    used = [(r, row) for r in results if (row := case_row(r)) is not None]
    rows = [row for _, row in used]
    text = table_toml(rows, microbench_spread(ROOT), CASES, [r.case.hardware_name for r, _ in used])
    if "--check" in argv:
        same = TABLE.exists() and TABLE.read_text() == text
        print("prediction_intervals.toml is up to date" if same else "prediction_intervals.toml is stale: rerun")
        return 0 if same else 1
    TABLE.write_text(text)
    rows, spread = rows_from_table(read_toml(TABLE))
    cov = leave_one_out(rows, spread)
    print(f"wrote {TABLE.relative_to(ROOT)}: {len(rows)} cases; leave-one-out step time covered "
          f"{cov.step_covered}/{cov.cases}, mean width {cov.step_mean_width_rel:.1%}; HBM peak covered "
          f"{cov.peak_covered}/{cov.cases}, mean width {cov.peak_mean_width_rel:.1%}; missed: {', '.join(cov.missed) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
