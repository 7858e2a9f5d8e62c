"""Prediction intervals: how far a measured step time and HBM peak may lie from ghsim's.

Built from measured spread only (hardware_profiles/calibration/prediction_intervals.toml,
written by benchmarks/prediction_intervals.py from `ghsim validate` and the microbenchmarks):
- each row of the step has a spread: the GPU's busy time (kernels, copies) and its idle time
  (host gaps), each the validation cases' pooled residual of that row (|measured - predicted|
  summed over the cases / predicted summed), combined with the microbenchmarks' repeat spread
  of that kind of time (repeated kernel timings; repeated host-overhead runs);
- a plan's scale sigma = step x (busy share x busy spread + idle share x idle spread), so a plan
  that waits on its host gets a wider interval than one that keeps its GPU busy;
- the interval is [pred + z_lo sigma, pred + z_hi sigma], z_lo and z_hi the lowest and highest of
  the validation cases' scores (measured - predicted) / sigma: split-conformal bounds, which
  cover a new case's measured value with probability >= 1 - 2/(n+1) when it is like the cases.
The HBM peak's interval is the same with sigma = the peak (one row: the replay's residual).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np

TABLE = Path(__file__).resolve().parents[2] / "hardware_profiles" / "calibration" / "prediction_intervals.toml"


@dataclass(frozen=True)
class CaseRow:
    """One validation case as the interval fit needs it (seconds, bytes)."""

    name: str
    predicted_step_s: float
    measured_step_s: float
    predicted_utilization: float  # kernel-busy share of the predicted step
    predicted_busy_s: float  # GPU rows of the step (compute, exposed communication, copies)
    measured_busy_s: float
    predicted_peak_bytes: float
    measured_peak_bytes: float


@dataclass(frozen=True)
class IntervalModel:
    busy_spread: float  # relative
    idle_spread: float  # relative
    step_scores: tuple[float, float]  # (lowest, highest) (measured - predicted) / sigma
    peak_scores: tuple[float, float]  # (lowest, highest) (measured - predicted) / predicted
    cases: int
    hardware: tuple[str, ...] = ()  # the profiles the cases ran on: the runs the intervals speak for

    def sigma_s(self, step_s: float, utilization: float) -> float:
        u = min(1.0, max(0.0, utilization))
        return step_s * (u * self.busy_spread + (1 - u) * self.idle_spread)

    def step_interval(self, step_s: float, utilization: float) -> tuple[float, float]:
        sigma = self.sigma_s(step_s, utilization)
        return max(0.0, step_s + self.step_scores[0] * sigma), step_s + self.step_scores[1] * sigma

    def peak_interval(self, peak_bytes: float) -> tuple[float, float]:
        return max(0.0, peak_bytes * (1 + self.peak_scores[0])), peak_bytes * (1 + self.peak_scores[1])


def _pooled(pred: np.ndarray, meas: np.ndarray) -> float:
    """Sum of |measured - predicted| over the sum of predicted: a row's residual, weighted by its size."""
    total = float(pred.sum())
    return float(np.abs(meas - pred).sum()) / total if total > 0 else 0.0


def fit(rows: Iterable[CaseRow], microbench: Mapping[str, float]) -> IntervalModel:
    """The interval model of these cases; microbench: the repeat spread of kernel ('gpu') and
    host-side ('host') timings."""
    rows = list(rows)
    if len(rows) < 2:
        raise ValueError("an interval needs at least two validation cases")
    p_busy = np.array([r.predicted_busy_s for r in rows])
    m_busy = np.array([r.measured_busy_s for r in rows])
    p_idle = np.array([r.predicted_step_s for r in rows]) - p_busy
    m_idle = np.array([r.measured_step_s for r in rows]) - m_busy
    busy = float(np.hypot(_pooled(p_busy, m_busy), microbench["gpu"]))
    idle = float(np.hypot(_pooled(np.maximum(p_idle, 0), np.maximum(m_idle, 0)), microbench["host"]))
    model = IntervalModel(busy, idle, (0.0, 0.0), (0.0, 0.0), len(rows))
    z = [(r.measured_step_s - r.predicted_step_s) / model.sigma_s(r.predicted_step_s, r.predicted_utilization)
         for r in rows]
    peak = [r.measured_peak_bytes / r.predicted_peak_bytes - 1 for r in rows]
    return IntervalModel(busy, idle, (min(z), max(z)), (min(peak), max(peak)), len(rows))


@dataclass(frozen=True)
class Coverage:
    """Leave-one-out: each case's interval fitted without it."""

    step_covered: int
    peak_covered: int
    cases: int
    step_mean_width_rel: float  # (hi - lo) / predicted, mean over the cases
    peak_mean_width_rel: float
    missed: tuple[str, ...]


Fitter = Callable[[list[CaseRow], Mapping[str, float]], IntervalModel]


def held_out(rows: list[CaseRow], i: int, microbench: Mapping[str, float],
             fitter: Fitter = fit) -> tuple[tuple[float, float], ...]:
    """Case i's step and peak intervals, fitted on the other cases only."""
    m, r = fitter(rows[:i] + rows[i + 1:], microbench), rows[i]
    return m.step_interval(r.predicted_step_s, r.predicted_utilization), m.peak_interval(r.predicted_peak_bytes)


def leave_one_out(rows: list[CaseRow], microbench: Mapping[str, float], fitter: Fitter = fit) -> Coverage:
    """Each case's interval fitted without it (`fitter`: fit, or a model to compare it with)."""
    step_in = peak_in = 0
    widths, peak_widths, missed = [], [], []
    for i, r in enumerate(rows):
        (lo, hi), (plo, phi) = held_out(rows, i, microbench, fitter)
        ok = lo <= r.measured_step_s <= hi
        step_in += ok
        peak_in += plo <= r.measured_peak_bytes <= phi
        if not ok:
            missed.append(r.name)
        widths.append((hi - lo) / r.predicted_step_s)
        peak_widths.append((phi - plo) / r.predicted_peak_bytes)
    return Coverage(step_in, peak_in, len(rows), float(np.mean(widths)), float(np.mean(peak_widths)), tuple(missed))


def rows_from_table(table: Mapping) -> tuple[list[CaseRow], dict[str, float]]:
    rows = [CaseRow(**{k: c[k] for k in CaseRow.__dataclass_fields__}) for c in table["case"]]
    return rows, {k: float(v["value"]) for k, v in table["microbench_spread"].items()}


def note(model: IntervalModel) -> str:
    """What an interval is, in one line of a report."""
    return (f"where measurements fell around ghsim's predictions in {model.cases} validation cases on "
            f"{', '.join(model.hardware) or 'measured GPUs'} (validation/README.md); runs unlike them can miss by more")


@lru_cache(maxsize=4)
def load_model(path: Path = TABLE) -> IntervalModel | None:
    """The model of the committed table; None when the table is absent (a stripped install)."""
    if not path.exists():
        return None
    from ghsim.tomlio import read_toml

    table = read_toml(path)
    rows, microbench = rows_from_table(table)
    return dataclasses.replace(fit(rows, microbench), hardware=tuple(table.get("meta", {}).get("hardware", ())))


def step_interval(step_s: float, utilization: float) -> tuple[float, float] | None:
    """None without the table, or for a plan that was not timed (a search verdict's NaN)."""
    m = load_model()
    return m.step_interval(step_s, utilization) if m and math.isfinite(step_s + utilization) else None


def peak_interval(peak_bytes: float) -> tuple[float, float] | None:
    m = load_model()
    return m.peak_interval(peak_bytes) if m and math.isfinite(peak_bytes) else None


def overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]
