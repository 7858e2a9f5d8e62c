"""Figures people would rather see than read: the step timeline and memory over the step."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ghsim.errors import GhsimError  # noqa: E402
from ghsim.graph.ops import Category, Phase, Resource  # noqa: E402
from ghsim.report.step_report import StepReport  # noqa: E402

CATEGORY_COLORS = {
    Category.GEMM: "#1f77b4", Category.ATTENTION: "#9467bd", Category.ELEMENTWISE: "#2ca02c",
    Category.NORM_REDUCTION: "#bcbd22", Category.OPTIMIZER: "#d62728", Category.COMMUNICATION: "#ff7f0e",
    Category.OTHER: "#7f7f7f", Category.MEMCPY: "#17becf", Category.CPU: "#8c564b",
}


def save(fig, path: str) -> None:
    """Write a figure as PNG and release it; an unwritable path is a one-line error."""
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as e:  # ValueError: a file extension matplotlib cannot write
        raise GhsimError(f"{path}: cannot write: {getattr(e, 'strerror', None) or e}") from None
    finally:
        plt.close(fig)


PHASE_SHADES = {Phase.FWD: "#e8f0fb", Phase.BWD: "#fbeee8", Phase.RECOMPUTE: "#fbeee8", Phase.OPT: "#fbe8ea"}
# A pipeline-level timeline (several GPUs) has one op per micro-batch, of category "other": its
# bars are coloured by what the micro-batch does instead.
MICROBATCH_COLORS = {"fwd": ("forward (micro-batch)", "#1f77b4"), "final_fwd": ("forward (micro-batch)", "#1f77b4"),
                     "bwd": ("backward (micro-batch)", "#d68a3c"), "final_bwd": ("backward (micro-batch)", "#d68a3c"),
                     "recompute": ("backward (micro-batch)", "#d68a3c")}


def _bar_style(op) -> tuple[str, str]:
    """(legend label, colour) of one op's bar: its kernel category, or for a whole micro-batch
    (category other) its phase."""
    if op.category == Category.OTHER and str(op.phase) in MICROBATCH_COLORS:
        return MICROBATCH_COLORS[str(op.phase)]
    return str(op.category), CATEGORY_COLORS.get(op.category, "#333333")


def plot_step(report: StepReport, path: str) -> None:
    """Timeline (a row per busy resource, coloured by category, phases shaded where the GPU
    stream has them) above HBM over time, and host memory on its own axis with its own capacity."""
    tl = report.timeline
    if tl is None:
        raise GhsimError("this report kept no timeline to plot")
    start, end = tl.schedule.start * 1e3, tl.schedule.end * 1e3
    used = [r for r in tl.resources if any(op.resource == r and end[i] > start[i] for i, op in enumerate(tl.ops))]
    rows = {name: i for i, name in enumerate(used)}
    per_op_memory = report.hbm.curve is not None and len(report.hbm.curve) == len(tl.ops)
    host = per_op_memory and report.host.curve is not None and report.host.peak_bytes > 0
    heights = [max(len(rows), 2), 2] + ([2] if host else [])
    fig, axes = plt.subplots(len(heights), 1, figsize=(12, 2.5 + 0.6 * len(rows) + 2 * (len(heights) - 1)),
                             sharex=True, gridspec_kw={"height_ratios": heights})
    ax_t, ax_m = axes[0], axes[1]
    shaded = _shade_phases(ax_t, tl, start, end)
    by_style: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for i, op in enumerate(tl.ops):
        if end[i] > start[i] and op.resource in rows:
            by_style.setdefault((*_bar_style(op), rows[op.resource]), []).append((start[i], end[i] - start[i]))
    # long categories first, so short kernels (norms, casts) stay visible on top of them
    for (label, color, row), bars in sorted(by_style.items(), key=lambda kv: -sum(d for _, d in kv[1])):
        ax_t.broken_barh(bars, (row - 0.4, 0.8), color=color, label=label)
    handles, labels = ax_t.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax_t.legend(unique.values(), unique.keys(), loc="upper right", fontsize=8, ncol=5)
    ax_t.set_yticks(range(len(rows)), list(rows))
    ax_t.set_ylim(-0.6, len(rows) - 0.4 + 0.8)
    shading = f"  (shaded: {', '.join(shaded)})" if shaded else ""
    ax_t.set_title(f"{report.model['name']} on {report.hardware['name']}: step {report.step_time_s * 1e3:.1f} ms, "
                   f"GPU busy {report.gpu_utilization * 100:.0f}%{shading}")
    if per_op_memory:
        # allocations happen in issue order; draw them where each op runs
        ax_m.step(start, report.hbm.curve / 1e9, where="post", lw=1, label="HBM allocated (per GPU)")
    else:  # a pipeline-level timeline has no per-op memory: show the peak
        ax_m.axhline(report.hbm.peak_bytes / 1e9, lw=1, label="HBM peak (per GPU)")
    ax_m.axhline(report.hbm_capacity / 1e9, color="red", ls="--", lw=1, label="HBM capacity")
    ax_m.set_ylim(bottom=0)
    ax_m.set_ylabel("HBM (GB)")
    ax_m.legend(fontsize=8, loc="lower right")
    if host:
        ax_h = axes[2]
        ax_h.step(start, report.host.curve / 1e9, where="post", lw=1, color="#8c564b", label="host allocated (node)")
        ax_h.axhline(report.host_capacity / 1e9, color="red", ls="--", lw=1, label="host memory capacity (node)")
        ax_h.set_ylim(bottom=0)
        ax_h.set_ylabel("host (GB)")
        ax_h.legend(fontsize=8, loc="lower right")
    axes[-1].set_xlabel("time in step (ms)")
    save(fig, path)


_PHASE_NAMES = {Phase.FWD: "forward", Phase.BWD: "backward", Phase.OPT: "optimizer"}


def _shade_phases(ax, tl, start, end) -> list[str]:
    """Background spans of the step's phases on the compute stream; the names of those drawn."""
    spans: dict[str, list[float]] = {}
    gpu, recompute, bwd = Resource.GPU, Phase.RECOMPUTE, Phase.BWD  # read once, not per op (graph/ops.py)
    for i, op in enumerate(tl.ops):
        if op.resource == gpu and op.phase in PHASE_SHADES and end[i] > start[i]:
            span = spans.setdefault(op.phase if op.phase != recompute else bwd, [start[i], end[i]])
            span[0], span[1] = min(span[0], start[i]), max(span[1], end[i])
    for phase, (a, b) in spans.items():
        ax.axvspan(a, b, color=PHASE_SHADES[phase], zorder=0)
    return [_PHASE_NAMES[p] for p in _PHASE_NAMES if p in spans]


def _shared_tolerance(ran, key: str) -> float | None:
    """The tolerance every case uses for `key` (None when they differ or none has one)."""
    tols = {r.case.tolerance.get(key) for r in ran}
    return tols.pop() if len(tols) == 1 else None


def plot_validation(results, path: str) -> None:
    """Predicted vs measured step time and peak memory, one point per simulated case; the band is
    the tolerance the cases are held to (validation/tolerances.toml or their own)."""
    from matplotlib.ticker import LogLocator, ScalarFormatter

    ran = [r for r in results if r.status != "skipped"]
    if not ran:
        raise GhsimError("no simulated cases to plot")
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    panels = ((axes[0], "step_time_s", "step_time_rel", 1e3, "step time", "ms"),
              (axes[1], "peak_memory_bytes", "peak_memory_rel", 1e-9, "peak allocated HBM", "GB"))
    for ax, key, tol_key, scale, title, unit in panels:
        shown = [r for r in ran if key in r.measured]  # published throughput rows have no peak
        m = [r.measured[key] * scale for r in shown]
        p = [r.predicted[key] * scale for r in shown]
        if not m:
            ax.set_title(f"{title}: not measured")
            continue
        failed = [r.status == "fail" and tol_key in r.failed for r in shown]
        ax.scatter(m, p, c=["tab:red" if f else "tab:blue" for f in failed], s=18)
        lo, hi = min(m + p) * 0.8, max(m + p) * 1.2
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        tol = _shared_tolerance(ran, tol_key)
        if tol is not None:
            ax.fill_between([lo, hi], [lo * (1 - tol), hi * (1 - tol)], [lo * (1 + tol), hi * (1 + tol)],
                            color="gray", alpha=0.15, label=f"±{tol:.0%} (tolerance)")
            ax.legend(fontsize=8, loc="upper left")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers, few enough not to overlap
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0), numticks=8))
            axis.set_minor_locator(LogLocator(base=10, subs=(), numticks=1))
            axis.set_major_formatter(ScalarFormatter())
        ax.tick_params(axis="x", labelrotation=45)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured {title} ({unit})")
        ax.set_ylabel(f"predicted {title} ({unit})")
        ax.set_title(f"{title} ({unit}), {len(shown)} cases")
    fig.suptitle("ghsim vs measured cases (red: outside its tolerance)")
    save(fig, path)
