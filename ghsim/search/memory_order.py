"""Which plans need at least as much memory as which: the order the search relies on to
try the plans likeliest to fit first and to skip those a plan that did not fit rules out."""

from __future__ import annotations

import math

from ghsim.hardware import Hardware
from ghsim.plan import Plan, Recompute
from ghsim.search.screen import Evaluation


RECOMPUTE_MEMORY = {"full": 0, "selective": 1, "none": 2}  # activations kept: full <= selective <= none


def memory_order(p: Plan) -> tuple:
    """Sort key: among plans of equal bound, those needing less memory first (if they do not
    fit, neither do the rest)."""
    return (p.micro_batch, RECOMPUTE_MEMORY.get(p.recompute.value, 0), -p.zero, -len(p.offload), p.offload_ratio)


def needs_less_hbm(q: Plan, p: Plan) -> bool:
    """q keeps no more on each GPU than p by every choice that sizes HBM (the order NoFit uses, and
    a higher ZeRO stage): where p did not fit, q may."""
    return (q.micro_batch <= p.micro_batch and recompute_rank(q.recompute) <= recompute_rank(p.recompute)
            and q.offload >= p.offload and q.offload_ratio >= p.offload_ratio and q.zero >= p.zero)


def recompute_rank(rc: Recompute) -> int:
    return RECOMPUTE_MEMORY.get(rc.value, 0)


class NoFit:
    """Plans that do not fit, so that plans needing at least as much of the same memory are
    not simulated.

    "At least as much" is the physical partial order every memory model here follows
    (tests/test_search.py checks it on the simulator). HBM: a larger micro-batch, less
    recompute, a subset of the offloaded state, a smaller offload ratio. Host memory: a
    larger micro-batch, less recompute, a superset of the offloaded state, a larger offload
    ratio. CUDA graphs change no memory. All other choices must be equal, the ZeRO stage
    too: less sharding does not always hold more (ZeRO-1 adds DeepSpeed's reduce bucket,
    and saves nothing when the optimizer state is offloaded anyway).
    """

    def __init__(self, hw: Hardware) -> None:
        self.capacity = {"HBM": hw.hbm.capacity_bytes, "host": hw.host.capacity_bytes}
        self.failed: dict[str, dict[Plan, list[tuple]]] = {"HBM": {}, "host": {}}

    @staticmethod
    def _key(p: Plan) -> Plan:
        return p.with_(micro_batch=1, recompute=Recompute.FULL, cuda_graphs=False, offload=frozenset(),
                       offload_ratio=1.0)

    @staticmethod
    def _coords(p: Plan) -> tuple:
        return (p.micro_batch, RECOMPUTE_MEMORY.get(p.recompute.value, 0), p.offload, p.offload_ratio)

    def add(self, e: Evaluation) -> None:
        """Record the tiers `e` overflows (under unified memory the HBM cannot: pages spill)."""
        peaks = {"HBM": math.nan if e.plan.unified_memory else e.hbm_peak_bytes, "host": e.host_peak_bytes}
        for tier, peak in peaks.items():
            if peak > self.capacity[tier]:
                self.failed[tier].setdefault(self._key(e.plan), []).append(self._coords(e.plan))

    def dominates(self, p: Plan) -> str:
        mb, rc, off, r = self._coords(p)
        for tier, failed in self.failed.items():
            for fmb, frc, foff, fr in failed.get(self._key(p), ()):
                offloads = off <= foff and r <= fr if tier == "HBM" else off >= foff and r >= fr
                if mb >= fmb and rc >= frc and offloads:
                    what = [f"micro-batch {fmb}", [k for k, v in RECOMPUTE_MEMORY.items() if v == frc][0] + " recompute"]
                    if foff:
                        what.append("offload " + ",".join(sorted(foff)) + (f" ratio {fr:g}" if fr != 1 else ""))
                    return f"{tier} memory of " + ", ".join(what)
        return ""
