"""A prediction held against a measurement, row by row: where the step error comes from.

Each side's rows add up to its step time (attribution.py), so the rows' differences add
up to the step error, and each row's share of that error is its difference over the
whole (shares add to 100%; a row working against the total has a negative share).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from ghsim.traces.attribution import StepBreakdown

TINY_S = 1e-9  # a step error this small explains nothing: no shares


@dataclass(frozen=True)
class Row:
    name: str
    predicted_s: float
    measured_s: float

    @property
    def delta_s(self) -> float:
        return self.predicted_s - self.measured_s


@dataclass(frozen=True)
class Comparison:
    predicted: StepBreakdown
    measured: StepBreakdown
    by_category: tuple[Row, ...]
    by_phase: tuple[Row, ...]
    kernels: pd.DataFrame  # per (phase, category): predicted / measured time and count, delta, share

    @property
    def error_s(self) -> float:
        return self.predicted.step_s - self.measured.step_s

    @property
    def error_rel(self) -> float:
        return self.error_s / self.measured.step_s

    @property
    def notes(self) -> tuple[str, ...]:
        out = (*self.predicted.notes, *self.measured.notes)
        ratio = self.predicted.step_s / self.measured.step_s
        if not 0.5 <= ratio <= 2:
            out += (f"the predicted step is {ratio:.2g}x the measured one: are both the same model, plan, "
                    f"batch and GPU (and the measured window one training step)?",)
        family = self.predicted.gpu.split("-")[0].lower()  # h100-sxm -> h100, gh200-96gb-quad -> gh200
        if family and self.measured.gpu and family not in self.measured.gpu.lower():
            out += (f"measured on {self.measured.gpu}, predicted for {self.predicted.gpu}",)
        return out

    def share(self, delta_s: float) -> float | None:
        return delta_s / self.error_s if abs(self.error_s) > TINY_S else None

    def to_dict(self) -> dict[str, Any]:
        def rows(rs: tuple[Row, ...]) -> list[dict[str, Any]]:
            return [{"row": r.name, "predicted_s": r.predicted_s, "measured_s": r.measured_s, "delta_s": r.delta_s,
                     "share_of_error": self.share(r.delta_s)} for r in rs]
        kernels = [{**{k: v for k, v in rec.items() if k not in ("top_predicted", "top_measured")},
                    "share_of_error": self.share(rec["delta_s"]),
                    "largest_predicted": [{"name": n, "time_s": t} for n, t in rec["top_predicted"]],
                    "largest_measured": [{"name": n, "time_s": t} for n, t in rec["top_measured"]]}
                   for rec in self.kernels.to_dict("records")]
        return {"step_time_s": {"predicted": self.predicted.step_s, "measured": self.measured.step_s,
                                "error_s": self.error_s, "error_rel": self.error_rel},
                "by_category": rows(self.by_category), "by_phase": rows(self.by_phase),
                "largest_mismatches": kernels, "notes": list(self.notes),
                "predicted": self.predicted.to_dict(), "measured": self.measured.to_dict()}

    def to_table(self, top: int = 8) -> str:
        from ghsim.traces.render import render_comparison
        return render_comparison(self, top)


def _rows(pred: dict[str, float], meas: dict[str, float]) -> tuple[Row, ...]:
    return tuple(Row(k, pred[k], meas[k]) for k in pred)


def _kernel_groups(pred: pd.DataFrame, meas: pd.DataFrame) -> pd.DataFrame:
    """Kernel time per (phase, category) on both sides, largest mismatch first."""
    keys = ["phase", "category"]
    both = pred.merge(meas, on=keys, how="outer", suffixes=("_predicted", "_measured"))
    for side in ("predicted", "measured"):
        for col in ("time_s", "count"):
            both[f"{col}_{side}"] = both[f"{col}_{side}"].fillna(0.0)
        both[f"top_{side}"] = both[f"top_{side}"].map(lambda t: t if isinstance(t, list) else [])
    both["delta_s"] = both["time_s_predicted"] - both["time_s_measured"]
    both = both.assign(size=both["delta_s"].abs()).sort_values(["size", "phase", "category"],
                                                               ascending=[False, True, True])
    return both.drop(columns="size").reset_index(drop=True)


def compare(predicted: StepBreakdown, measured: StepBreakdown) -> Comparison:
    return Comparison(predicted, measured, _rows(dict(predicted.by_category), dict(measured.by_category)),
                      _rows(dict(predicted.by_phase), dict(measured.by_phase)),
                      _kernel_groups(predicted.groups, measured.groups))
