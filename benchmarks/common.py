"""What every benchmark script shares: the median of repeated timings and the --calibration choice."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable


def median_time(fn: Callable[[], Any], repeats: int = 5) -> tuple[float, Any]:
    """Median wall seconds of fn() over `repeats` runs after one warm-up run, and its last result."""
    result = fn()  # warm: loads and caches the calibration
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def add_calibration_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--calibration", default="profile", help="'profile' (the hardware's) or 'synthetic'")


def chosen_calibration(name: str):
    """The synthetic calibration of the tests, or None for each hardware profile's own."""
    if name != "synthetic":
        return None
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from synthetic import synthetic_calibration

    return synthetic_calibration()
