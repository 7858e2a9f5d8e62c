"""The same plan on several hardware profiles, side by side, and why one is faster.

The reason is read off the step breakdowns, grouped the way an engineer reads
an nsys timeline: compute (kernels), exposed transfers (copies on the compute
stream and waits for copies), CPU waits (the CPU optimizer), unified-memory
stalls, host launch waits, and the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ghsim.cost.calibration import Calibration
from ghsim.errors import GhsimError
from ghsim.graph.ops import KERNEL_CATEGORIES, Category
from ghsim.hardware import Hardware
from ghsim.model import ModelSpec
from ghsim.plan import Plan
from ghsim.report.step_report import Stall, StepReport

GROUPS: dict[str, tuple[str, ...]] = {
    "compute": tuple(c for c in KERNEL_CATEGORIES if c != Category.COMMUNICATION),
    "communication": (Category.COMMUNICATION,),
    "exposed transfers": (Category.MEMCPY, Stall.WAIT_TRANSFER),
    "CPU waits": (Stall.WAIT_CPU,),
    "unified-memory stalls": (Stall.UM_MIGRATION,),
    "host launch waits": (Stall.WAIT_HOST_LAUNCH,),
    "other waits": (Stall.WAIT_OTHER,),
}


def grouped(breakdown: dict[str, float]) -> dict[str, float]:
    """Seconds per group; categories no group names go to "other waits"."""
    out = {g: 0.0 for g in GROUPS}
    named = {c: g for g, cats in GROUPS.items() for c in cats}
    for cat, sec in breakdown.items():
        out[named.get(cat, "other waits")] += float(sec)
    return out


@dataclass(frozen=True)
class Pairwise:
    faster: str
    slower: str
    speedup: float  # slower step time / faster step time
    reason: str
    fits: bool = True  # the plan fits on both parts

    def to_dict(self) -> dict[str, Any]:
        return {"faster": self.faster, "slower": self.slower, "speedup": self.speedup, "reason": self.reason,
                "fits_both": self.fits}


def explain(a: StepReport, b: StepReport) -> Pairwise:
    """Which of two reports is faster, by how much, and which breakdown groups make the difference."""
    fast, slow = (a, b) if a.step_time_s <= b.step_time_s else (b, a)
    gf, gs = grouped(fast.time_breakdown_s), grouped(slow.time_breakdown_s)
    diffs = sorted(((gs[g] - gf[g], g) for g in GROUPS), reverse=True)
    parts = [f"{g} {gs[g] * 1e3:.1f} vs {gf[g] * 1e3:.1f} ms" for d, g in diffs if d > 0.05 * slow.step_time_s][:3]
    if not parts and diffs and diffs[0][0] > 0:
        d, g = diffs[0]
        parts = [f"{g} {gs[g] * 1e3:.1f} vs {gf[g] * 1e3:.1f} ms"]
    name_f, name_s = fast.hardware["name"], slow.hardware["name"]
    speedup = slow.step_time_s / fast.step_time_s if fast.step_time_s > 0 else float("inf")
    why = "; ".join(parts) if parts else "the breakdowns are nearly the same"
    unfit = [r for r in (fast, slow) if not r.fits]
    if unfit:  # a speedup of a step that cannot run on a part is no answer: say so first
        where = " or ".join(r.hardware["name"] for r in unfit)
        text = (f"the plan does not fit on {where} ("
                + "; ".join(f"{r.hardware['name']}: {r.fit_problems[0]}" for r in unfit)
                + f"); as simulated, {name_f} would be {speedup:.2f}x faster than {name_s}: {why}")
    else:
        text = f"{name_f} is {speedup:.2f}x faster than {name_s}: {why}"
    return Pairwise(name_f, name_s, speedup, text, fits=not unfit)


@dataclass(frozen=True)
class Comparison:
    reports: list[StepReport]
    pairs: list[Pairwise]  # the first hardware against each other one
    best: list[dict[str, Any]] | None  # each hardware's best plan (--best)

    def to_dict(self) -> dict[str, Any]:
        results = []
        for r in self.reports:
            d = r.to_dict()
            d.setdefault("hardware", r.hardware)
            results.append(d)
        out: dict[str, Any] = {"results": results, "comparisons": [p.to_dict() for p in self.pairs]}
        if self.best is not None:
            out["best"] = self.best
            out["best_comparisons"] = [b.to_dict() for b in best_pairs(self.best)]
        return out


def compare(model: ModelSpec, hardware: list[Hardware], plan: Plan,
            calibration: Calibration | None = None,
            best_plan: Callable[[ModelSpec, Hardware, Plan], dict[str, Any]] | None = None,
            calibrations: dict[str, Calibration] | None = None) -> Comparison:
    """Simulate `plan` on each hardware (in the order given); with best_plan, also each one's best.
    `calibrations`: a calibration for some parts by name (a calibration overlay fitted on that part)."""
    from ghsim.simulate import simulate

    if len(hardware) < 2:
        raise GhsimError("compare needs at least two --hardware profiles")
    reports = []
    for hw in hardware:
        try:
            reports.append(simulate(model, hw, plan, (calibrations or {}).get(hw.name, calibration),
                                    keep_timeline=False))
        except GhsimError as e:
            raise GhsimError(f"{hw.name}: {e}") from None
    pairs = [explain(reports[0], r) for r in reports[1:]]
    best = [best_plan(model, hw, plan) for hw in hardware] if best_plan is not None else None
    return Comparison(reports, pairs, best)


def best_pairs(best: list[dict[str, Any] | None]) -> list[Pairwise]:
    """The first part's best plan against each other part's best plan (where both have one)."""
    first = best[0]
    out = []
    for other in best[1:]:
        if not first or not other:
            continue
        fast, slow = (first, other) if first["step_time_s"] <= other["step_time_s"] else (other, first)
        speedup = slow["step_time_s"] / fast["step_time_s"] if fast["step_time_s"] > 0 else float("inf")
        out.append(Pairwise(fast["hardware"], slow["hardware"], speedup,
                            f"{fast['hardware']} is {speedup:.2f}x faster than {slow['hardware']} on their best plans "
                            f"({fast['step_time_s']:.2f} vs {slow['step_time_s']:.2f} s/step, both fit)"))
    return out


def _span(iv: tuple[float, float] | None, scale: float) -> str:
    """A prediction interval (report/intervals.py) as 'lo-hi'."""
    return f"{iv[0] * scale:.1f}-{iv[1] * scale:.1f}" if iv else "-"


def render(c: Comparison) -> str:
    names = [r.hardware["name"] for r in c.reports]
    rows = [
        ("step time (ms)", [f"{r.step_time_s * 1e3:.1f}" for r in c.reports]),
        ("  interval (ms)", [_span(r.step_time_interval_s, 1e3) for r in c.reports]),
        ("tokens/s", [f"{r.tokens_per_s:.0f}" for r in c.reports]),
        ("MFU (%)", [f"{r.mfu * 100:.1f}" for r in c.reports]),
        ("GPU utilization (%)", [f"{r.gpu_utilization * 100:.1f}" for r in c.reports]),
        ("HBM peak / GPU (GB)", [f"{r.hbm.peak_bytes / 1e9:.1f}" for r in c.reports]),
        ("  interval (GB)", [_span(r.hbm_peak_interval_bytes, 1e-9) for r in c.reports]),
        ("host peak / node (GB)", [f"{r.host.peak_bytes / 1e9:.1f}" for r in c.reports]),
        ("fits", ["yes" if r.fits else "NO" for r in c.reports]),
        ("host link", [r.hardware.get("host_link", "") for r in c.reports]),
    ]
    # every column wide enough for its longest cell (an interval such as 9873.2-15098.3), two spaces apart
    width = max(14, *(len(n) + 2 for n in names), *(len(v) + 2 for _, vals in rows for v in vals))
    head = f"{'':<26}" + "".join(f"{n:>{width}}" for n in names)
    lines = [f"model {c.reports[0].model['name']}, plan {c.reports[0].plan.get('flags', '')}", "", head]
    lines += [f"{label:<26}" + "".join(f"{v:>{width}}" for v in vals) for label, vals in rows]
    lines += ["", "where the step goes (ms)"]
    groups = [grouped(r.time_breakdown_s) for r in c.reports]
    for g in GROUPS:
        if any(gr[g] > 0 for gr in groups):
            lines.append(f"  {g:<24}" + "".join(f"{gr[g] * 1e3:>{width}.1f}" for gr in groups))
    lines.append("")
    lines += [p.reason for p in c.pairs]
    if c.best is not None:
        lines += ["", "best plan per hardware"]
        for name, b in zip(names, c.best):
            if not b:
                lines.append(f"  {name}: no plan fits")
            else:
                judged = (f", {b['n_evaluated']:,} of {b['n_candidates']:,} plans judged"
                          if "n_candidates" in b else "")
                lines.append(f"  {name}: fits; step {b['step_time_s'] * 1e3:.1f} ms, {b['tokens_per_s']:.0f} tokens/s, "
                             f"{b.get('hbm_peak_bytes', 0) / 1e9:.1f} GB HBM{judged}: {b['flags']}")
        lines += [p.reason for p in best_pairs(c.best)]
    return "\n".join(lines)
