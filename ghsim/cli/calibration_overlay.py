"""`--calibration overlay.toml` for simulate, compare and plan: price with a calibration overlay
(`ghsim calibrate --trace`) on the part and model it was fitted on, and say so in the report."""

from __future__ import annotations

import dataclasses
from typing import Callable

import click

from ghsim.errors import GhsimError

OVERLAY_SUFFIX = ".toml"
REPORT_KEY = "calibration_overlay"  # the report's section (text: its summary line; JSON: every figure)


def overlay_option(f: Callable) -> Callable:
    return click.option("--calibration", "calibration_file", type=click.Path(), default=None,
                        help="Calibration overlay (TOML from `ghsim calibrate --trace`) fitted on a measured run of "
                             "this model on this part: its factors correct the microbenchmark prices.")(f)


def is_overlay(path: str | None) -> bool:
    return bool(path) and str(path).lower().endswith(OVERLAY_SUFFIX)


def _read(path: str):
    from ghsim.cost.overlay import read_overlay

    if not is_overlay(path):
        raise GhsimError(f"{path}: --calibration takes a calibration overlay TOML (`ghsim calibrate --trace`); a "
                         f"microbenchmark JSON is installed with `ghsim calibrate MICROBENCH --reference PROFILE`")
    return read_overlay(path)


def read_checked(path: str, hw, model):
    """The overlay at `path`, refused (one line) when fitted on another GPU or model shape."""
    from ghsim.cost.overlay import check_applies

    overlay = _read(path)
    check_applies(overlay, hw, model)
    return overlay


def overlaid(overlay, hw):
    """The part's microbenchmark calibration with the overlay on top."""
    from ghsim.cost.calibration import load_calibration
    from ghsim.cost.overlay import apply

    return apply(load_calibration(hw.calibration), overlay)


def with_section(report, overlay, plan):
    """The report, saying which overlay priced it and which figures it changed."""
    return dataclasses.replace(report, extra={**report.extra, REPORT_KEY: overlay.report_section(plan)})


def per_part(path: str | None, hardware: list, model) -> tuple[object | None, dict]:
    """For compare: the overlay and a calibration for each part it was fitted on (the others keep
    their microbenchmarks); refused when it fits none of them."""
    if not path:
        return None, {}
    from ghsim.cost.overlay import check_applies

    overlay = _read(path)
    calibrations, refusals = {}, []
    for hw in hardware:
        try:
            check_applies(overlay, hw, model)
        except GhsimError as e:
            refusals.append(str(e))
            continue
        calibrations[hw.name] = overlaid(overlay, hw)
    if not calibrations:
        raise GhsimError(refusals[0])
    return overlay, calibrations
