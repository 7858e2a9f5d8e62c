"""What the search ranks plans by (Objective), and the sort key that says which is better."""

from __future__ import annotations

from enum import Enum

from ghsim.errors import GhsimError
from ghsim.hardware import Hardware
from ghsim.search.screen import Evaluation


class Objective(str, Enum):
    TIME = "time"  # step time
    COST = "cost"  # dollars per million tokens
    MEMORY = "memory"  # HBM headroom

    @classmethod
    def parse(cls, value: str) -> "Objective":
        try:
            return cls(value)
        except ValueError:
            raise GhsimError(f"unknown objective {value!r} (choose from {', '.join(o.value for o in cls)})") from None


def score(e: Evaluation, objective: Objective, price: float, hw: Hardware) -> tuple[float, float]:
    """Sort key, smaller is better; ties broken by step time."""
    if objective == Objective.MEMORY:
        return (e.hbm_peak_bytes, e.step_time_s)
    if objective == Objective.COST:
        return (e.usd_per_mtok(price), e.step_time_s)
    return (e.step_time_s, e.hbm_peak_bytes)
