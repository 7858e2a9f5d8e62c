"""The figures show what their titles and axes say (issue 17 item 12)."""

from __future__ import annotations

from pathlib import Path

import pytest

import ghsim.report.plots as plots
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import plan_from_dict
from ghsim.simulate import simulate


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions would save, kept open for inspection."""
    kept = []

    def keep(fig, path):
        fig.tight_layout()
        fig.canvas.draw()
        kept.append(fig)
    monkeypatch.setattr(plots, "save", keep)
    yield kept
    for fig in kept:
        plots.plt.close(fig)


def test_host_memory_has_its_own_axis_and_capacity(figures, cal):
    plan = plan_from_dict({"recompute": "full", "offload": ["optimizer"], "seq": 1024})
    report = simulate(load_model("llama-2-7b"), load_hardware("gh200-96gb"), plan, cal)
    assert report.host.peak_bytes > 0
    plots.plot_step(report, "unused.png")
    axes = figures[0].axes
    hbm_ax, host_ax = axes[1], axes[2]
    hbm_labels = [line.get_label() for line in hbm_ax.get_lines()]
    assert not any("host" in label for label in hbm_labels), hbm_labels  # not against the HBM line
    host_labels = [line.get_label() for line in host_ax.get_lines()]
    assert "host allocated (node)" in host_labels and "host memory capacity (node)" in host_labels
    capacity = [line for line in host_ax.get_lines() if "capacity" in line.get_label()][0]
    assert capacity.get_ydata()[0] == pytest.approx(report.host_capacity / 1e9)
    assert hbm_ax.get_ylabel() == "HBM (GB)" and host_ax.get_ylabel() == "host (GB)"


def test_multi_gpu_timeline_is_coloured_and_promises_only_what_it_draws(figures, cal):
    plan = plan_from_dict({"gpus": 8, "tp": 2, "pp": 2, "global_batch": 16, "recompute": "full", "seq": 1024})
    report = simulate(load_model("llama-3-8b"), load_hardware("h100-sxm"), plan, cal)
    plots.plot_step(report, "unused.png")
    ax = figures[0].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "forward (micro-batch)" in labels and "backward (micro-batch)" in labels and "other" not in labels
    title = ax.get_title()
    if "shaded" in title:
        assert len(ax.patches) > 0
    else:
        assert not [p for p in ax.patches if type(p).__name__ == "Polygon"]  # no axvspan drawn


def test_validation_plot_units_band_and_ticks(figures):
    from ghsim.validate.cases import validate

    results = validate(Path(__file__).resolve().parent.parent / "validation", with_trace=False)
    plots.plot_validation(results, "unused.png")
    fig = figures[0]
    renderer = fig.canvas.get_renderer()
    for ax, unit, key in zip(fig.axes, ("ms", "GB"), ("step_time_rel", "peak_memory_rel")):
        assert f"({unit})" in ax.get_title() and f"({unit})" in ax.get_xlabel() and f"({unit})" in ax.get_ylabel()
        tol = results[0].case.tolerance[key]
        assert ax.get_legend().get_texts()[0].get_text() == f"±{tol:.0%} (tolerance)"
        for axis in (ax.xaxis, ax.yaxis):
            boxes = [t.get_window_extent(renderer) for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
            assert len(boxes) >= 2
            for a, b in zip(boxes, boxes[1:]):
                assert not a.overlaps(b), [t.get_text() for t in axis.get_ticklabels()]
