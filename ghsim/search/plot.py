"""The Pareto front of a plan search: step time against HBM peak, one point per simulated plan."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ghsim.hardware import GB  # noqa: E402
from ghsim.report.plots import save  # noqa: E402
from ghsim.search.core import SearchResult  # noqa: E402
from ghsim.search.explain import pareto_front  # noqa: E402
from ghsim.search.screen import Status  # noqa: E402
from ghsim.search.space import LAYOUT  # noqa: E402



def compact_label(p) -> str:
    """A few characters per choice: 'mb8 sel-rc off:opt Z3 pp4 CG'."""
    parts = [f"mb{p.micro_batch}", {"none": "", "selective": "sel-rc", "full": "full-rc"}[p.recompute.value]]
    if p.precision.value != "bf16":
        parts.append(p.precision.value)
    if p.zero:
        parts.append(f"Z{p.zero}")
    if p.offload:
        short = {"optimizer": "opt", "grads": "grad", "params": "par", "activations": "act"}
        parts.append("off:" + "+".join(short[t] for t in sorted(p.offload)))
        if p.offload_ratio != 1.0:
            parts.append(f"r{p.offload_ratio:g}")
    parts += [f"{k}{getattr(p, k)}" for k in LAYOUT if getattr(p, k) > 1]
    if p.pp_interleave > 1:
        parts.append(f"v{p.pp_interleave}")
    schedule = p.offload_schedule.value
    if p.offload and schedule != "auto":
        parts.append({"superoffload": "SO"}.get(schedule, schedule))
    if p.unified_memory:
        parts.append("UM")
    if p.cuda_graphs:
        parts.append("CG")
    return " ".join(x for x in parts if x)


def plot_pareto(r: SearchResult, path: str, label_front: int = 4) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.8))
    no_fit = [e for e in r.evaluations if e.status == Status.NO_FIT and e.step_time_s == e.step_time_s]
    if no_fit:
        ax.scatter([e.hbm_peak_bytes / GB for e in no_fit], [e.step_time_s for e in no_fit], s=10, c="#d9a0a0",
                   marker="x", label=f"does not fit ({len(no_fit)})")
    ax.scatter([e.hbm_peak_bytes / GB for e in r.ranked], [e.step_time_s for e in r.ranked], s=12, c="#9aaed1",
               label=f"fits ({len(r.ranked)})")
    front = pareto_front(r)
    if front:
        ax.plot([e.hbm_peak_bytes / GB for e in front], [e.step_time_s for e in front], "o-", c="#1f4e9c", ms=5,
                label="Pareto front")
        # label a few front points, spread along the memory axis so the labels stay readable
        span = max(e.hbm_peak_bytes for e in front) - min(e.hbm_peak_bytes for e in front) or 1.0
        last = -math.inf
        shown = 0
        best_plan = r.ranked[0].plan if r.ranked else None
        for e in sorted(front, key=lambda e: e.hbm_peak_bytes):
            if e.hbm_peak_bytes - last < span / label_front or shown >= label_front or e.plan == best_plan:
                continue
            last, shown = e.hbm_peak_bytes, shown + 1
            ax.annotate(compact_label(e.plan), (e.hbm_peak_bytes / GB, e.step_time_s), fontsize=7,
                        xytext=(0, 10 if shown % 2 else -14), textcoords="offset points", ha="left",
                        arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "#555555"})
    if r.ranked:
        best = r.ranked[0]
        ax.scatter([best.hbm_peak_bytes / GB], [best.step_time_s], s=140, marker="*", c="#e8a200", zorder=5,
                   label=f"best ({r.objective.value})")
        ax.annotate("best: " + compact_label(best.plan), (best.hbm_peak_bytes / GB, best.step_time_s), fontsize=7.5,
                    fontweight="bold", xytext=(8, -16), textcoords="offset points")
    ax.axvline(r.hardware.hbm.capacity_bytes / GB, color="red", ls="--", lw=1, label="HBM capacity")
    if r.ranked:  # the slow tail says little: show up to three times the best step
        ax.set_ylim(0, min(max(e.step_time_s for e in r.ranked), 3 * r.ranked[0].step_time_s) * 1.05)
    ax.set_xlabel("HBM peak per GPU (GB)")
    ax.set_ylabel("step time (s)")
    ax.set_title(f"{r.model.name} on {r.base.gpus} x {r.hardware.name}: {r.n_evaluated:,} plans judged, "
                 f"{r.n_feasible:,} fit", fontsize=10)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    save(fig, path)
