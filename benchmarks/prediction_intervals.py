"""Write hardware_profiles/calibration/prediction_intervals.toml: the measured spread the
prediction intervals are built from (ghsim/report/intervals.py), and print their
leave-one-out coverage.

    PYTHONPATH=$PWD python benchmarks/prediction_intervals.py [--check]

--check: fail (exit 1) when the committed table differs from what the cases give now.
--coverage: print the committed table's leave-one-out coverage (README.md quotes it).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ghsim.report.intervals import TABLE, leave_one_out, rows_from_table
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


def main(argv: list[str]) -> int:
    if "--coverage" in argv:
        print(coverage_table())
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
