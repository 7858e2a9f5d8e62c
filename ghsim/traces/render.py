"""TraceSummary -> aligned text tables, laid out like `nsys stats` output."""

from __future__ import annotations

from ghsim.traces import events as ev

NAME_WIDTH = 90


def table(headers: list[str], rows: list[list[str]], left: set[int] = frozenset()) -> str:
    """Columns right-aligned (numbers) except those in `left`, nsys-style dashes under headers."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([" " + line(headers), " " + line(["-" * w for w in widths])] + [" " + line(r) for r in rows])


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f}"


def _short(name: str) -> str:
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 3] + "..."


def _gap_label(lo: float, hi: float) -> str:
    def t(s: float) -> str:
        return f"{s * 1e6:g} us" if s < 1e-3 else f"{s * 1e3:g} ms"
    if lo == 0:
        return f"< {t(hi)}"
    if hi == float("inf"):
        return f">= {t(lo)}"
    return f"{t(lo)} - {t(hi)}"


def render_summary(s) -> str:
    out = [f"Trace summary: {s.source}"]
    where = f" format {s.format} | window: {s.window}"
    if s.window_s is not None:
        where += f" ({s.window_s:.6f} s)"
    if s.device is not None:
        where += f" | device {s.device}" + (f" ({s.gpu_name})" if s.gpu_name else "")
    out.append(where)
    if s.step_times_s:
        what = "range durations" if s.window.startswith("nvtx") else "step times"
        out.append(f" {what} (ms): " + "  ".join(_ms(t) for t in s.step_times_s))
    out.append("")

    if s.gpu_busy_fraction is not None:
        by_dev = ", ".join(f"{d}: {_pct(f)} %" for d, f in s.busy_fraction_by_device.items())
        out.append(f"GPU busy (kernels): {_pct(s.gpu_busy_fraction)} % of the window   [by device: {by_dev}]")
    if s.idle_gaps is not None:
        g = s.idle_gaps
        out.append(f"Idle gaps: {g.count:,}, total {_ms(g.total_s)} ms, largest {_ms(g.largest_s)} ms")
        out.append(table(["Gap size", "Count", "Total (ms)"],
                         [[_gap_label(b.lo_s, b.hi_s), f"{b.count:,}", _ms(b.total_s)] for b in g.histogram],
                         left={0}))
    out.append("")

    out.append(f"Kernel time by category (total {_ms(s.kernel_time_s)} ms, {s.kernel_count:,} kernels)")
    out.append(table(["Category", "Time (%)", "Total Time (ms)"],
                     [[c, _pct(s.kernel_share_by_category[c]), _ms(s.kernel_time_by_category_s[c])]
                      for c in s.kernel_share_by_category], left={0}))
    out.append("")

    if s.top_kernels:
        out.append("Top kernels")
        out.append(table(["Time (%)", "Total Time (ms)", "Instances", "Avg (us)", "Category", "Name"],
                         [[_pct(k.share), _ms(k.total_s), f"{k.count:,}", f"{k.total_s / k.count * 1e6:,.3f}",
                           k.category, _short(k.name)] for k in s.top_kernels], left={4, 5}))
        out.append("")

    rows = []
    for label, c in [(d, s.memcpy[d]) for d in ev.DIRECTIONS] + [("memset", s.memset), ("UM migration", s.um_migration)]:
        rate = f"{c.bytes / c.time_s / 1e9:,.2f}" if c.time_s > 0 else "-"
        rows.append([label, f"{c.count:,}", f"{c.bytes / 1e6:,.3f}", _ms(c.time_s), rate])
    out.append("Memory operations")
    out.append(table(["Operation", "Count", "Total (MB)", "Total Time (ms)", "Throughput (GB/s)"], rows, left={0}))
    um = f"Unified memory: migration {_pct(s.um_migration_share)} % of the window"
    out.append(um + f"; page faults: CPU {s.um_page_faults.get('cpu', 0):,}, GPU {s.um_page_faults.get('gpu', 0):,}")
    if s.memory_peak:
        out.append(f"Allocator peak: allocated {s.memory_peak['allocated_bytes'] / 1e9:,.3f} GB, "
                   f"reserved {s.memory_peak['reserved_bytes'] / 1e9:,.3f} GB")
    for note in s.notes:
        out.append(f"Note: {note}")
    return "\n".join(out) + "\n"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def render_comparison(c, top: int = 8) -> str:
    """A Comparison (comparison.py): step error, rows by category and by phase, largest mismatches."""
    p, m = c.predicted, c.measured
    out = [f"predicted  {p.source}", f"measured   {m.source}",
           f"step time  predicted {_ms(p.step_s)} ms, measured {_ms(m.step_s)} ms: "
           f"error {c.error_s * 1e3:+,.3f} ms ({c.error_rel:+.1%})", ""]
    for title, rows in (("per step, by category", c.by_category), ("per step, by phase", c.by_phase)):
        out += [title + " (each instant counted once: compute, then exposed communication, copies, host gaps)",
                table(["row", "predicted ms", "measured ms", "delta ms", "share of error"],
                      [[r.name, _ms(r.predicted_s), _ms(r.measured_s), f"{r.delta_s * 1e3:+,.3f}",
                        _share(c.share(r.delta_s))] for r in rows], left={0}), ""]
    out.append("largest mismatches, kernel time per step by phase and category (summed durations; "
               "kernel events carry no shapes)")
    rows = []
    for rec in c.kernels.head(top).to_dict("records"):
        rows.append([rec["phase"] or "-", rec["category"], _ms(rec["time_s_predicted"]), f"{rec['count_predicted']:g}",
                     _ms(rec["time_s_measured"]), f"{rec['count_measured']:g}", f"{rec['delta_s'] * 1e3:+,.3f}",
                     _share(c.share(rec["delta_s"]))])
    out.append(table(["phase", "category", "pred ms", "pred ops", "meas ms", "meas kernels", "delta ms", "share"], rows,
                     left={0, 1}))
    for rec in c.kernels.head(min(top, 3)).to_dict("records"):
        label = f"{rec['phase'] or '-'} {rec['category']}"
        for side in ("measured", "predicted"):
            names = "; ".join(f"{n.removeprefix('void ')[:70]} {t * 1e3:.2f} ms" for n, t in rec[f"top_{side}"])
            if names:
                out.append(f"  {label}, largest {side}: {names}")
    for n in c.notes:
        out.append(f"note: {n}")
    return "\n".join(out) + "\n"
