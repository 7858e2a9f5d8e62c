"""Leave-one-out check of `ghsim calibrate --trace` (issue 19 item 1) on validation/cases/.

Cases are grouped by machine (hardware profile and GPU count) and model. For each case of a group,
an overlay is fitted on every OTHER case's trace (its plan, its profiled steps) and the case's step
time is predicted with it; the error is set beside the uncalibrated one. Singletons are listed as
such (nothing to calibrate on).

    PYTHONPATH=$PWD python benchmarks/calibration_loo.py [--markdown] [--only SUBSTRING] [--profiled-step]
                                                         [--root validation/measured_libraries]
                                                         [--exclude compile,-ao-]

Each source gives its trace and its step timed without the profiler (calibrate --step-time-ms);
--profiled-step: its trace alone (host time fitted to the fastest profiled step).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ghsim.cost.calibration import load_calibration  # noqa: E402
from ghsim.cost.overlay import apply  # noqa: E402
from ghsim.errors import GhsimError  # noqa: E402
from ghsim.simulate import simulate  # noqa: E402
from ghsim.trace_calibration import fit_overlay  # noqa: E402
from ghsim.traces import load_trace  # noqa: E402
from ghsim.validate.cases import DEFAULT_TOLERANCES, Case, case_hardware, find_cases, load_case  # noqa: E402
from ghsim.model import load_model, model_from_dict  # noqa: E402


def case_model(c: Case):
    return (load_model(c.model_table["name"]) if set(c.model_table) == {"name"}
            else model_from_dict(c.model_table, str(c.folder / "case.toml"), c.name))


def group_key(c: Case) -> tuple[str, int, str]:
    return c.hardware_name, c.plan.gpus, str(c.model_table.get("name"))


def fit_on(source: Case, timed: bool = True):
    """The overlay fitted on `source`'s trace (every profiled step), as `ghsim calibrate --trace` does; with
    `timed`, given its step timed without the profiler (--step-time-ms) as the host fit's target."""
    model, hw = case_model(source), case_hardware(source)
    cal = load_calibration(hw.calibration)
    return fit_overlay(load_trace(source.trace), None, model, source.model_table.get("name", source.name), hw,
                       source.plan, cal, lambda c: simulate(model, hw, source.plan, c), out_path=f"{source.name}.toml",
                       step_time_s=float(source.measured["step_time_s"]) if timed else None)


def predict(target: Case, overlay=None) -> float:
    model, hw = case_model(target), case_hardware(target)
    cal = load_calibration(hw.calibration)
    return simulate(model, hw, target.plan, apply(cal, overlay) if overlay else cal, keep_timeline=False).step_time_s


def pair_error(source: Case, target: Case) -> float:
    """Relative step-time error predicting `target` with the overlay fitted on `source`."""
    return predict(target, fit_on(source)) / float(target.measured["step_time_s"]) - 1


def leave_one_out(cases: list[Case], timed: bool = True) -> list[dict]:
    groups: dict[tuple, list[Case]] = defaultdict(list)
    for c in cases:
        groups[group_key(c)].append(c)
    overlays: dict[str, object] = {}
    rows = []
    for key, members in groups.items():
        for target in members:
            measured = float(target.measured["step_time_s"])
            before = predict(target) / measured - 1
            after, failed = [], []
            for source in members:
                if source is target:
                    continue
                try:
                    overlay = overlays.get(source.name) or overlays.setdefault(source.name, fit_on(source, timed))
                    after.append((source.name, predict(target, overlay) / measured - 1))
                except GhsimError as e:
                    failed.append((source.name, str(e)))
            rows.append({"group": key, "case": target.name, "before": before, "after": after, "refused": failed})
    return rows


def _loaded(folder: Path) -> Case | None:
    """A measured case; None for a run that failed (no [measured] table: validate reports it skipped)."""
    try:
        return load_case(folder, DEFAULT_TOLERANCES)
    except GhsimError:
        return None


def main(argv: list[str]) -> None:
    only = argv[argv.index("--only") + 1] if "--only" in argv else ""
    root = Path(argv[argv.index("--root") + 1]) if "--root" in argv else ROOT / "validation"
    excluded = [x for x in (argv[argv.index("--exclude") + 1] if "--exclude" in argv else "").split(",") if x]
    cases = [c for c in map(_loaded, find_cases(root)) if c is not None]
    cases = [c for c in cases if only in c.name and c.trace is not None and not any(x in c.name for x in excluded)]
    rows = leave_one_out(cases, timed="--profiled-step" not in argv)
    md = "--markdown" in argv
    if md:
        print("| case | uncalibrated | calibrated on each other case of its group: median / worst (n) |")
        print("| --- | --- | --- |")
    for r in rows:
        errs = [e for _, e in r["after"]]
        if not errs:
            cell = "alone in its group" + (f"; refused: {r['refused'][0][1]}" if r["refused"] else "")
        else:
            worst = max(errs, key=abs)
            cell = f"{np.median(np.abs(errs)):.1%} / {worst:+.1%} ({len(errs)})"
            if r["refused"]:
                cell += f"; {len(r['refused'])} refused"
        if md:
            print(f"| {r['case']} | {r['before']:+.1%} | {cell} |")
        else:
            print(f"{r['case']:<46} before {r['before']:+7.1%}   after {cell}")
            for name, e in r["after"]:
                print(f"    from {name:<44} {e:+7.1%}")
            for name, why in r["refused"]:
                print(f"    from {name:<44} refused: {why}")
    paired = [r for r in rows if r["after"]]
    pairs = [abs(e) for r in paired for _, e in r["after"]]
    before = [abs(r["before"]) for r in paired]
    per_case = [float(np.median([abs(e) for _, e in r["after"]])) for r in paired]
    print()
    print(f"{len(paired)} cases with another case of their (machine, model) to calibrate on, {len(pairs)} pairs")
    print(f"uncalibrated: median |error| {np.median(before):.1%}, worst {max(before):.1%}")
    print(f"calibrated (every pair): median |error| {np.median(pairs):.1%}, worst {max(pairs):.1%}; "
          f"{sum(p <= 0.05 for p in pairs)} of {len(pairs)} pairs within 5%")
    print(f"calibrated (each case's median over its sources): median {np.median(per_case):.1%}, "
          f"worst {max(per_case):.1%}")


if __name__ == "__main__":
    main(sys.argv[1:])
