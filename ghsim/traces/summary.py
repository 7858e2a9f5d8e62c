"""TraceSummary: the nsys-style breakdown of one window of a trace.

The same code summarizes a measured trace (`summarize(trace, ...)`) and the
simulator's own timeline (`summarize_intervals(...)`), so measured and
predicted numbers are computed the same way and compare category by category.

Conventions (stated once, used everywhere):
- busy fraction, idle gaps and UM migration share clip intervals to the
  window (the union of the chosen steps / NVTX ranges, or the span of all
  GPU activity);
- kernel shares, top kernels and copy totals count the events that *start*
  inside the window, whole (as `nsys stats` does), summing durations
  (kernels overlapping on two streams both count);
- everything is per device: the one asked for, else the busiest.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from ghsim.errors import GhsimError
from ghsim.traces import events as ev
from ghsim.traces import intervals as iv
from ghsim.traces.categories import CATEGORIES, categorize

NS_PER_S = 1e9
GAP_BIN_EDGES_S = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, float("inf"))
DEFAULT_TOP = 10


@dataclass(frozen=True)
class GapBin:
    lo_s: float
    hi_s: float  # inf for the last bin
    count: int
    total_s: float


@dataclass(frozen=True)
class IdleGaps:
    count: int
    total_s: float
    largest_s: float
    histogram: tuple[GapBin, ...]


@dataclass(frozen=True)
class KernelStat:
    name: str
    category: str
    share: float      # of all kernel time in the window
    count: int
    total_s: float


@dataclass(frozen=True)
class CopyStat:
    bytes: int
    time_s: float
    count: int


@dataclass(frozen=True)
class Window:
    """Where a summary looks: merged [start, end) ns pieces and their label."""

    label: str
    pieces: np.ndarray = field(repr=False)          # (n, 2) int64, merged
    step_times_s: tuple[float, ...] = ()
    whole_trace: bool = False

    @property
    def length_ns(self) -> int:
        return int((self.pieces[:, 1] - self.pieces[:, 0]).sum()) if len(self.pieces) else 0


@dataclass(frozen=True)
class TraceSummary:
    source: str
    format: str
    has_timeline: bool
    window: str
    window_s: float | None
    device: int | None
    gpu_name: str | None
    gpu_busy_fraction: float | None
    busy_fraction_by_device: Mapping[int, float]
    idle_gaps: IdleGaps | None
    kernel_count: int
    kernel_time_s: float
    kernel_share_by_category: Mapping[str, float]
    kernel_time_by_category_s: Mapping[str, float]
    top_kernels: tuple[KernelStat, ...]
    memcpy: Mapping[str, CopyStat]
    memset: CopyStat
    um_migration: CopyStat
    um_migration_share: float | None
    um_page_faults: Mapping[str, int]
    step_times_s: tuple[float, ...]
    memory_peak: Mapping[str, int] | None
    notes: tuple[str, ...] = ()
    kernel_count_by_category: Mapping[str, int] = field(default_factory=dict)  # launches (calibrate --trace)

    def to_dict(self) -> dict:
        """Plain JSON-ready dict; the first seven keys are the contract."""
        def copy(c: CopyStat) -> dict:
            return {"bytes": c.bytes, "time_s": c.time_s, "count": c.count}
        gaps = None
        if self.idle_gaps is not None:
            g = self.idle_gaps
            gaps = {"count": g.count, "total_s": g.total_s, "largest_s": g.largest_s,
                    "histogram": [{"lo_s": b.lo_s, "hi_s": None if b.hi_s == float("inf") else b.hi_s,
                                   "count": b.count, "total_s": b.total_s} for b in g.histogram]}
        return {
            "gpu_busy_fraction": self.gpu_busy_fraction,
            "idle_gaps": gaps,
            "kernel_share_by_category": dict(self.kernel_share_by_category),
            "top_kernels": [{"name": k.name, "category": k.category, "share": k.share, "count": k.count,
                             "total_s": k.total_s} for k in self.top_kernels],
            "memcpy": {d: copy(self.memcpy[d]) for d in ev.DIRECTIONS},
            "um_migration_share": self.um_migration_share,
            "step_times_s": list(self.step_times_s),
            "source": self.source,
            "format": self.format,
            "has_timeline": self.has_timeline,
            "window": {"label": self.window, "duration_s": self.window_s},
            "device": self.device,
            "gpu_name": self.gpu_name,
            "busy_fraction_by_device": {str(d): f for d, f in self.busy_fraction_by_device.items()},
            "kernel_count": self.kernel_count,
            "kernel_time_s": self.kernel_time_s,
            "kernel_time_by_category_s": dict(self.kernel_time_by_category_s),
            "memset": copy(self.memset),
            "um_migration": copy(self.um_migration),
            "um_page_faults": dict(self.um_page_faults),
            "memory_peak": dict(self.memory_peak) if self.memory_peak is not None else None,
            "notes": list(self.notes),
        }

    def to_table(self) -> str:
        from ghsim.traces.render import render_summary
        return render_summary(self)


# -- window selection ----------------------------------------------------------

_STEP_RANGE = re.compile(r"^\s*(\d+)\s*(?:[-:]\s*(\d+)\s*)?$")


def parse_steps(text: str) -> tuple[int, int]:
    """'3-5' -> (3, 5); '4' -> (4, 4)."""
    m = _STEP_RANGE.match(text or "")
    if not m:
        raise GhsimError(f"--steps {text!r}: expected a step number or a range like 3-5")
    lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
    if hi < lo:
        raise GhsimError(f"--steps {text!r}: the range ends before it starts")
    return lo, hi


def _activity_span(trace: ev.TraceData) -> np.ndarray:
    starts, ends = [], []
    for df in (trace.kernels, trace.memcpys, trace.memsets):
        if len(df):
            starts.append(df["start_ns"].min())
            ends.append((df["start_ns"] + df["dur_ns"]).max())
    if not starts:
        return np.zeros((0, 2), np.int64)
    return np.array([[min(starts), max(ends)]], np.int64)


def select_window(trace: ev.TraceData, steps: str | None = None, nvtx: str | None = None) -> Window:
    """The window a summary covers: all activity, ProfilerStep range, or NVTX ranges."""
    if steps and nvtx:
        raise GhsimError("use --steps or --nvtx, not both")
    if steps:
        table = trace.steps
        if table.empty:
            raise GhsimError(f"{trace.source}: no ProfilerStep#N ranges in this trace; "
                             f"use --nvtx NAME to pick a window by an NVTX range instead")
        have = table["step"].tolist()
        if steps.strip().lower() == "all":
            lo, hi = min(have), max(have)
        else:
            lo, hi = parse_steps(steps)
        chosen = table[(table["step"] >= lo) & (table["step"] <= hi)]
        missing = sorted(set(range(lo, hi + 1)) - set(have)) if steps.strip().lower() != "all" else []
        if missing:
            raise GhsimError(f"{trace.source}: steps {lo}-{hi} not all in the trace (missing {_ranges(missing)}); "
                             f"it has ProfilerStep#{_ranges(have)}")
        durations = tuple(float(d) / NS_PER_S for d in (chosen["end_ns"] - chosen["start_ns"]))
        label = f"steps {lo}-{hi}" if hi > lo else f"step {lo}"
        # Steps follow each other: the window is the wall-clock span, gaps between steps included.
        span = np.array([[chosen["start_ns"].min(), chosen["end_ns"].max()]], np.int64)
        return Window(label, span, durations)
    if nvtx:
        table = trace.nvtx
        names = table["name"].astype(str)
        hit = names == nvtx
        if not hit.any() and any(c in nvtx for c in "*?["):
            hit = names.map(lambda n: fnmatch.fnmatchcase(n, nvtx)).astype(bool)
        if not hit.any():
            known = sorted(set(names))[:8]
            raise GhsimError(f"{trace.source}: no NVTX range named {nvtx!r}"
                             + (f"; some it has: {', '.join(map(repr, known))}" if known else "; it has no NVTX ranges"))
        chosen = table[hit].sort_values("start_ns")
        # The same range on the CPU and projected on the GPU: keep the CPU one for wall time.
        if chosen["on_gpu"].any() and not chosen["on_gpu"].all():
            chosen = chosen[~chosen["on_gpu"]]
        durations = tuple(float(d) / NS_PER_S for d in (chosen["end_ns"] - chosen["start_ns"]))
        return Window(f"nvtx {nvtx!r} ({len(chosen)} ranges)", iv.as_windows(chosen["start_ns"], chosen["end_ns"]),
                      durations)
    steps_all = tuple(float(d) / NS_PER_S for d in (trace.steps["end_ns"] - trace.steps["start_ns"]))
    return Window("all", _activity_span(trace), steps_all, whole_trace=True)


def _ranges(numbers: Sequence[int]) -> str:
    numbers = sorted(numbers)
    if not numbers:
        return "none"
    parts, start, prev = [], numbers[0], numbers[0]
    for n in list(numbers[1:]) + [None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(parts)


# -- the summary -------------------------------------------------------------------


def kernel_categories(kernels: pd.DataFrame) -> np.ndarray:
    """Category index (into CATEGORIES) of every kernel row: given, or from the name."""
    if "category" in kernels:
        codes = pd.Categorical(kernels["category"], categories=CATEGORIES).codes.astype(np.int64)
        if (codes < 0).any():
            raise ValueError(f"kernel categories must be among {CATEGORIES}")
        return codes
    names = kernels["name"].cat
    per_name = np.array([CATEGORIES.index(categorize(str(n))) for n in names.categories], np.int64)
    return per_name[names.codes.to_numpy()] if len(per_name) else np.zeros(len(kernels), np.int64)


def _busy_by_device(kernels: pd.DataFrame, window: Window) -> dict[int, float]:
    length = window.length_ns
    out = {}
    for device, group in kernels.groupby("device", sort=True):
        start = group["start_ns"].to_numpy()
        bs, be = iv.merge(start, start + group["dur_ns"].to_numpy())
        out[int(device)] = iv.covered(bs, be, window.pieces) / length if length else 0.0
    return out


def _idle_gaps(kernels: pd.DataFrame, window: Window) -> IdleGaps:
    start = kernels["start_ns"].to_numpy()
    bs, be = iv.merge(start, start + kernels["dur_ns"].to_numpy())
    g = iv.gaps(bs, be, window.pieces)  # int ns, summed exactly before converting
    bins = []
    for lo, hi in zip(GAP_BIN_EDGES_S[:-1], GAP_BIN_EDGES_S[1:]):
        sel = g[(g >= lo * NS_PER_S) & (g < hi * NS_PER_S)]
        bins.append(GapBin(lo, hi, int(len(sel)), int(sel.sum()) / NS_PER_S))
    return IdleGaps(int(len(g)), int(g.sum()) / NS_PER_S, int(g.max()) / NS_PER_S if len(g) else 0.0, tuple(bins))


def _stat(rows: pd.DataFrame) -> CopyStat:
    return CopyStat(int(rows["bytes"].sum()), float(rows["dur_ns"].sum()) / NS_PER_S, int(rows["count"].sum()))


def _copy_stats(copies: pd.DataFrame, kinds: Iterable[str]) -> dict[str, CopyStat]:
    return {kind: _stat(copies[(copies["kind"] == kind).to_numpy()]) for kind in kinds}


def _sum_copies(stats: Iterable[CopyStat]) -> CopyStat:
    stats = list(stats)
    return CopyStat(sum(s.bytes for s in stats), sum(s.time_s for s in stats), sum(s.count for s in stats))


def _memory_peak(trace: ev.TraceData, device: int | None, window: Window) -> dict[str, int] | None:
    mem = trace.memory
    if mem.empty or device is None:
        return None
    mem = mem[mem["device"] == device]
    if not window.whole_trace:
        mem = mem[iv.in_windows(mem["ts_ns"].to_numpy(), window.pieces)]
    if mem.empty:
        return None
    return {"allocated_bytes": int(mem["allocated"].max()), "reserved_bytes": int(mem["reserved"].max())}


def summarize(trace: ev.TraceData, *, steps: str | None = None, nvtx: str | None = None,
              device: int | None = None, top: int = DEFAULT_TOP) -> TraceSummary:
    """Summarize one window of a trace.

    steps: "3-5" / "4" (ProfilerStep#N numbers) or "all" (first to last ProfilerStep): the wall-clock
           span from the first chosen step's start to the last one's end;
    nvtx:  NVTX / annotation range name (glob allowed): the union of those ranges;
    neither: the span of all GPU activity.
    """
    if not trace.has_timeline:
        if steps or nvtx:
            raise GhsimError(f"{trace.source}: an nsys stats CSV is aggregate-only (no timeline), so it cannot "
                             f"be cut to --steps/--nvtx; summarize the nsys SQLite export instead")
        window = Window("all (aggregate-only: no timeline)", np.zeros((0, 2), np.int64), (), whole_trace=True)
    else:
        window = select_window(trace, steps, nvtx)
    return summarize_window(trace, window, device=device, top=top)


def _choose_device(trace: ev.TraceData, busy: dict[int, float], device: int | None, notes: list[str]) -> int | None:
    """The device asked for (which must have activity), else the busiest one."""
    devices = sorted(set(int(d) for d in trace.kernels["device"].unique())
                     | set(int(d) for d in trace.memcpys["device"].unique())
                     | set(int(d) for d in trace.memsets["device"].unique()))
    if device is not None and device not in devices:
        raise GhsimError(f"{trace.source}: no GPU activity on device {device} (devices with activity: "
                         f"{', '.join(map(str, devices)) or 'none'})")
    if device is None and devices:
        device = max(busy, key=lambda d: (busy[d], -d)) if busy else devices[0]
        if len(devices) > 1:
            notes.append(f"{len(devices)} devices with activity; showing the busiest, device {device} "
                         f"(choose with --device)")
    return device


def _um_share(memcpys: pd.DataFrame, device: int | None, window: Window) -> float:
    """Wall time with a unified-memory migration in flight, as a fraction of the window."""
    um = memcpys[(memcpys["kind"].isin(ev.UM_DIRECTIONS) & (memcpys["device"] == device)).to_numpy()]
    start = um["start_ns"].to_numpy()
    bs, be = iv.merge(start, start + um["dur_ns"].to_numpy())
    return iv.covered(bs, be, window.pieces) / window.length_ns


def summarize_window(trace: ev.TraceData, window: Window, *, device: int | None = None,
                     top: int = DEFAULT_TOP) -> TraceSummary:
    notes: list[str] = []
    timeline = trace.has_timeline
    kernels = trace.kernels
    cats = kernel_categories(kernels)

    busy = _busy_by_device(kernels, window) if timeline and len(kernels) else {}
    device = _choose_device(trace, busy, device, notes)

    def pick(df: pd.DataFrame, time_col: str = "start_ns") -> np.ndarray:
        mask = (df["device"] == device).to_numpy() if device is not None else np.ones(len(df), bool)
        if timeline and not window.whole_trace:
            mask = mask & iv.in_windows(df[time_col].to_numpy(), window.pieces)
        return mask

    kmask = pick(kernels)
    k = kernels[kmask]
    kcats = cats[kmask]
    dur = k["dur_ns"].to_numpy().astype(np.float64)
    total_ns = float(dur.sum())
    by_cat_ns = np.bincount(kcats, weights=dur, minlength=len(CATEGORIES)) if len(k) else np.zeros(len(CATEGORIES))
    shares = {c: (float(by_cat_ns[i]) / total_ns if total_ns else 0.0) for i, c in enumerate(CATEGORIES)}
    if not total_ns:
        notes.append("no kernel time in the window: category shares are all zero")

    top_kernels = _top_kernels(k, kcats, total_ns, top)
    copies = trace.memcpys[pick(trace.memcpys)]
    memcpy = _copy_stats(copies, ev.DIRECTIONS)
    um = _sum_copies(_copy_stats(copies, ev.UM_DIRECTIONS).values())
    memset = _stat(trace.memsets[pick(trace.memsets)])

    length = window.length_ns
    gpu_busy = busy.get(device, 0.0) if timeline else None
    gaps = _idle_gaps(k if window.whole_trace else kernels[(kernels["device"] == device).to_numpy()], window) \
        if timeline and length else None
    um_share = _um_share(trace.memcpys, device, window) if timeline and length else None
    faults = trace.um_faults
    if timeline and not window.whole_trace and len(faults):
        faults = faults[iv.in_windows(faults["start_ns"].to_numpy(), window.pieces)]
    um_faults = {side: int(faults.loc[faults["side"] == side, "faults"].sum()) for side in ("cpu", "gpu")}

    if not timeline:
        notes.append("aggregate-only input (nsys stats CSV): no timeline, so no GPU busy fraction, idle gaps, "
                     "UM migration share or step times")
        if "missing" in trace.meta:
            notes.append(f"reports not found: {trace.meta['missing']}")
    gpu_name = next((g.name for g in trace.gpus if g.id == device), None)
    return TraceSummary(
        source=trace.source, format=trace.format, has_timeline=timeline, window=window.label,
        window_s=length / NS_PER_S if timeline else None, device=device, gpu_name=gpu_name,
        gpu_busy_fraction=gpu_busy, busy_fraction_by_device=busy, idle_gaps=gaps,
        kernel_count=int(k["count"].sum()), kernel_time_s=total_ns / NS_PER_S,
        kernel_share_by_category=shares,
        kernel_time_by_category_s={c: float(by_cat_ns[i]) / NS_PER_S for i, c in enumerate(CATEGORIES)},
        top_kernels=top_kernels, memcpy=memcpy, memset=memset, um_migration=um, um_migration_share=um_share,
        um_page_faults=um_faults, step_times_s=window.step_times_s,
        memory_peak=_memory_peak(trace, device, window), notes=tuple(notes),
        kernel_count_by_category=_counts_by_category(k, kcats),
    )


def _counts_by_category(k: pd.DataFrame, kcats: np.ndarray) -> dict[str, int]:
    counts = np.bincount(kcats, weights=k["count"].to_numpy(), minlength=len(CATEGORIES)) if len(k) else \
        np.zeros(len(CATEGORIES))
    return {c: int(counts[i]) for i, c in enumerate(CATEGORIES)}


def _top_kernels(k: pd.DataFrame, kcats: np.ndarray, total_ns: float, top: int) -> tuple[KernelStat, ...]:
    if not len(k) or top <= 0:
        return ()
    codes = k["name"].cat.codes.to_numpy()
    n_names = len(k["name"].cat.categories)
    time = np.bincount(codes, weights=k["dur_ns"].to_numpy().astype(np.float64), minlength=n_names)
    count = np.bincount(codes, weights=k["count"].to_numpy().astype(np.float64), minlength=n_names)
    cat_of = np.zeros(n_names, np.int64)
    cat_of[codes] = kcats
    order = np.lexsort((np.arange(n_names), -time))[:top]
    names = k["name"].cat.categories
    return tuple(KernelStat(str(names[i]), CATEGORIES[cat_of[i]], float(time[i]) / total_ns if total_ns else 0.0,
                            int(count[i]), float(time[i]) / NS_PER_S) for i in order if count[i] > 0)


# -- the simulator's timeline -------------------------------------------------------


@dataclass(frozen=True)
class KernelInterval:
    """One GPU op of a simulated timeline."""

    category: str           # one of CATEGORIES
    start_s: float
    dur_s: float
    name: str = ""          # defaults to the category
    device: int = 0


@dataclass(frozen=True)
class CopyInterval:
    """One copy of a simulated timeline."""

    direction: str          # HtoD | DtoH | DtoD | PtoP | UM_HtoD | UM_DtoH | UM_DtoD
    bytes: int
    start_s: float
    dur_s: float
    device: int = 0
    memory: str = "unknown"  # pinned | pageable | managed | device | unknown


def _frame(rows, columns: Sequence[str], defaults: Mapping[str, object]) -> pd.DataFrame:
    if isinstance(rows, pd.DataFrame):
        df = rows.copy()
    else:
        df = pd.DataFrame([{c: getattr(r, c, defaults.get(c)) for c in columns} for r in rows], columns=list(columns))
    for c, v in defaults.items():
        if c not in df:
            df[c] = v
    missing = [c for c in columns if c not in df]
    if missing:
        raise ValueError(f"interval table lacks columns {missing}")
    return df


def _to_ns(seconds) -> np.ndarray:
    return np.round(np.asarray(seconds, np.float64) * 1e9).astype(np.int64)


def summarize_intervals(kernels, copies=(), *, steps_s: Sequence[tuple[float, float]] = (),
                        window_s: tuple[float, float] | None = None, device: int | None = None,
                        top: int = DEFAULT_TOP, source: str = "simulated timeline") -> TraceSummary:
    """Summarize a timeline given as intervals whose categories are already known.

    kernels: KernelInterval objects (or any objects / a DataFrame with category,
             start_s, dur_s and optionally name, device).
    copies:  CopyInterval objects (or a DataFrame with direction, bytes, start_s,
             dur_s and optionally device, memory).
    steps_s: (start_s, end_s) of each step; the window is their span (first
             start to last end) unless window_s is given; with neither, the
             span of all activity.
    """
    kd = _frame(kernels, ("category", "start_s", "dur_s", "name", "device"), {"name": "", "device": 0})
    bad = sorted(set(kd["category"]) - set(CATEGORIES))
    if bad:
        raise ValueError(f"unknown kernel categories {bad}; expected {CATEGORIES}")
    names = [n if n else c for n, c in zip(kd["name"], kd["category"])]
    k = ev.make_kernels(names, _to_ns(kd["start_s"]), _to_ns(kd["dur_s"]), kd["device"].to_numpy(),
                        np.zeros(len(kd), np.int64), category=kd["category"].tolist())
    cd = _frame(copies, ("direction", "bytes", "start_s", "dur_s", "device", "memory"),
                {"device": 0, "memory": "unknown"})
    bad = sorted(set(cd["direction"]) - set(ev.COPY_KINDS))
    if bad:
        raise ValueError(f"unknown copy directions {bad}; expected {ev.COPY_KINDS}")
    c = ev.make_memcpys(cd["direction"].tolist(), cd["bytes"].to_numpy(), _to_ns(cd["start_s"]), _to_ns(cd["dur_s"]),
                        cd["device"].to_numpy(), np.zeros(len(cd), np.int64), cd["memory"].tolist())
    starts = _to_ns([s for s, _ in steps_s])
    ends = _to_ns([e for _, e in steps_s])
    parts = ev.empty_trace_parts()
    trace = ev.TraceData(source=source, format="intervals", kernels=k, memcpys=c, memsets=parts["memsets"],
                         um_faults=parts["um_faults"], nvtx=parts["nvtx"],
                         steps=ev.make_steps(np.arange(len(starts)), starts, ends), memory=parts["memory"])
    step_times = tuple(float(e - s) for s, e in steps_s)
    if window_s is not None:
        window = Window("window", iv.as_windows(_to_ns([window_s[0]]), _to_ns([window_s[1]])), step_times)
    elif len(starts):  # the span of the steps, as for a measured trace's --steps
        window = Window(f"{len(starts)} steps", np.array([[starts.min(), ends.max()]], np.int64), step_times)
    else:
        window = Window("all", _activity_span(trace), step_times, whole_trace=True)
    return summarize_window(trace, window, device=device, top=top)
