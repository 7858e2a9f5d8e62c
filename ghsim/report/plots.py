"""Figures people would rather see than read: the step timeline and memory over the step."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ghsim.errors import GhsimError  # noqa: E402
from ghsim.graph.ops import Category, Phase, Resource  # noqa: E402
from ghsim.report.step_report import GiB, StepReport  # noqa: E402

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
        raise GhsimError(f"{path}: cannot write: {e}") from None
    finally:
        plt.close(fig)


PHASE_SHADES = {Phase.FWD: "#e8f0fb", Phase.BWD: "#fbeee8", Phase.RECOMPUTE: "#fbeee8", Phase.OPT: "#fbe8ea"}


def plot_step(report: StepReport, path: str) -> None:
    """Timeline (a row per busy resource, coloured by category, phases shaded) above memory over time."""
    tl = report.timeline
    if tl is None:
        raise GhsimError("this report kept no timeline to plot")
    start, end = tl.schedule.start * 1e3, tl.schedule.end * 1e3
    used = [r for r in tl.resources if any(op.resource == r and end[i] > start[i] for i, op in enumerate(tl.ops))]
    rows = {name: i for i, name in enumerate(used)}
    fig, (ax_t, ax_m) = plt.subplots(2, 1, figsize=(12, 2.5 + 0.6 * len(rows) + 2), sharex=True,
                                     gridspec_kw={"height_ratios": [max(len(rows), 2), 2]})
    _shade_phases(ax_t, tl, start, end)
    by_cat: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for i, op in enumerate(tl.ops):
        if end[i] > start[i] and op.resource in rows:
            by_cat.setdefault((op.category, rows[op.resource]), []).append((start[i], end[i] - start[i]))
    # long categories first, so short kernels (norms, casts) stay visible on top of them
    for (cat, row), bars in sorted(by_cat.items(), key=lambda kv: -sum(d for _, d in kv[1])):
        ax_t.broken_barh(bars, (row - 0.4, 0.8), color=CATEGORY_COLORS.get(cat, "#333333"), label=cat)
    handles, labels = ax_t.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax_t.legend(unique.values(), unique.keys(), loc="upper right", fontsize=8, ncol=5)
    ax_t.set_yticks(range(len(rows)), list(rows))
    ax_t.set_ylim(-0.6, len(rows) - 0.4 + 0.8)
    ax_t.set_title(f"{report.model['name']} on {report.hardware['name']}: step {report.step_time_s * 1e3:.1f} ms, "
                   f"GPU busy {report.gpu_utilization * 100:.0f}%  (shaded: forward, backward, optimizer)")
    if report.hbm.curve is not None and len(report.hbm.curve) == len(tl.ops):
        # allocations happen in issue order; draw them where each op runs
        ax_m.step(start, report.hbm.curve / GiB, where="post", lw=1, label="HBM allocated")
        if report.host.curve is not None and report.host.peak_bytes > 0:
            ax_m.step(start, report.host.curve / GiB, where="post", lw=1, label="host allocated")
    else:  # a pipeline-level timeline has no per-op memory: show the peak
        ax_m.axhline(report.hbm.peak_bytes / GiB, lw=1, label="HBM peak (per GPU)")
    ax_m.axhline(report.hbm_capacity / GiB, color="red", ls="--", lw=1, label="HBM capacity")
    ax_m.set_ylim(bottom=0)
    ax_m.set_ylabel("GiB")
    ax_m.set_xlabel("time in step (ms)")
    ax_m.legend(fontsize=8, loc="lower right")
    save(fig, path)


def _shade_phases(ax, tl, start, end) -> None:
    """Background spans of the step's phases on the compute stream."""
    spans: dict[str, list[float]] = {}
    gpu, recompute, bwd = Resource.GPU, Phase.RECOMPUTE, Phase.BWD  # read once, not per op (graph/ops.py)
    for i, op in enumerate(tl.ops):
        if op.resource == gpu and op.phase in PHASE_SHADES and end[i] > start[i]:
            span = spans.setdefault(op.phase if op.phase != recompute else bwd, [start[i], end[i]])
            span[0], span[1] = min(span[0], start[i]), max(span[1], end[i])
    for phase, (a, b) in spans.items():
        ax.axvspan(a, b, color=PHASE_SHADES[phase], zorder=0)


def plot_validation(results, path: str) -> None:
    """Predicted vs measured step time and peak memory, one point per simulated case."""
    ran = [r for r in results if r.status != "skipped"]
    if not ran:
        raise GhsimError("no simulated cases to plot")
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, key, scale, unit in ((axes[0], "step_time_s", 1e3, "ms"), (axes[1], "peak_memory_bytes", 1e-9, "GB")):
        m = [r.measured[key] * scale for r in ran]
        p = [r.predicted[key] * scale for r in ran]
        colors = ["tab:red" if r.status == "fail" else "tab:blue" for r in ran]
        ax.scatter(m, p, c=colors)
        lo, hi = min(m + p) * 0.8, max(m + p) * 1.2
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="gray", alpha=0.15, label="±10%")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured ({unit})")
        ax.set_ylabel(f"predicted ({unit})")
        ax.set_title(key.replace("_", " "))
        ax.legend(fontsize=8)
    fig.suptitle("ghsim vs measured cases (red: outside tolerance)")
    save(fig, path)
