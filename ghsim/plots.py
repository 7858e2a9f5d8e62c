"""Figures people would rather see than read: the step timeline and memory over the step."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ghsim.errors import GhsimError  # noqa: E402
from ghsim.report import GiB, StepReport  # noqa: E402

CATEGORY_COLORS = {
    "gemm": "#1f77b4", "attention": "#9467bd", "elementwise": "#2ca02c", "norm_reduction": "#bcbd22",
    "optimizer": "#d62728", "communication": "#ff7f0e", "other": "#7f7f7f", "memcpy": "#17becf", "cpu": "#8c564b",
}


def save(fig, path: str) -> None:
    """Write a figure as PNG and release it; an unwritable path is a one-line error."""
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise GhsimError(f"{path}: cannot write: {e}") from None
    finally:
        plt.close(fig)


def plot_step(report: StepReport, path: str) -> None:
    """Timeline (one row per resource, coloured by category) above HBM allocated over time."""
    tl = report.timeline
    if tl is None:
        raise GhsimError("this report kept no timeline to plot")
    fig, (ax_t, ax_m) = plt.subplots(2, 1, figsize=(12, 6), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    rows = {name: i for i, name in enumerate(tl.resources)}
    by_cat: dict[str, list[tuple[float, float, int]]] = {}
    for i, op in enumerate(tl.ops):
        d = tl.schedule.end[i] - tl.schedule.start[i]
        if d > 0:
            by_cat.setdefault(op.category, []).append((tl.schedule.start[i] * 1e3, d * 1e3, rows[op.resource]))
    for cat, spans in by_cat.items():
        for row in set(s[2] for s in spans):
            bars = [(s, d) for s, d, r in spans if r == row]
            ax_t.broken_barh(bars, (row - 0.4, 0.8), color=CATEGORY_COLORS.get(cat, "#333333"), label=cat)
    handles, labels = ax_t.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax_t.legend(unique.values(), unique.keys(), loc="upper right", fontsize=8, ncol=4)
    ax_t.set_yticks(range(len(rows)), list(rows))
    ax_t.set_title(f"{report.model['name']} on {report.hardware['name']}: step {report.step_time_s * 1e3:.1f} ms, "
                   f"GPU busy {report.gpu_utilization * 100:.0f}%")
    if report.hbm.curve is not None:
        ax_m.plot(tl.schedule.issue * 1e3, report.hbm.curve / GiB, lw=1, label="HBM allocated")
        ax_m.axhline(report.hbm_capacity / GiB, color="red", ls="--", lw=1, label="HBM capacity")
    if report.host.curve is not None and report.host.peak_bytes > 0:
        ax_m.plot(tl.schedule.issue * 1e3, report.host.curve / GiB, lw=1, label="host allocated")
    ax_m.set_ylabel("GiB")
    ax_m.set_xlabel("time in step (ms); memory drawn at issue time")
    ax_m.legend(fontsize=8)
    save(fig, path)


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
