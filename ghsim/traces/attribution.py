"""Where one step's wall time goes, as rows that add up to the step: compute kernels by
category (or by phase), then communication, copies and host gaps (the GPU idle).

Overlapping work is counted once, by priority: a compute kernel's time first, then
communication that no compute kernel hides, then copies that neither hides; what is left
of the window is a host gap. The same code reads a measured trace and a simulated
timeline (ghsim's own Chrome trace), so the two sides are computed alike.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ghsim.errors import GhsimError
from ghsim.graph.ops import KERNEL_CATEGORIES, Category
from ghsim.traces import events as ev
from ghsim.traces import intervals as iv
from ghsim.traces import phases as mt
from ghsim.traces.summary import NS_PER_S, Window, kernel_categories, select_window

COMM = str(Category.COMMUNICATION)
# event columns: start_ns, end_ns, category (a kernel category, or COPIES), phase (mt.PHASES), name
_COLUMNS = ("start_ns", "end_ns", "category", "phase", "name")


@dataclass(frozen=True)
class StepBreakdown:
    """One side of a comparison, per step (seconds)."""

    source: str
    step_s: float
    by_category: Mapping[str, float]  # mt.CATEGORY_ROWS, adding up to step_s
    by_phase: Mapping[str, float]  # mt.PHASE_ROWS, adding up to step_s
    groups: pd.DataFrame  # per (phase, category): time_s, count (per step), top names
    steps: int
    notes: tuple[str, ...] = ()
    gpu: str = ""  # the measured GPU's name, or the hardware profile ghsim predicted for ('' unknown)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "step_time_s": self.step_s, "steps": self.steps,
                "by_category_s": dict(self.by_category), "by_phase_s": dict(self.by_phase),
                "notes": list(self.notes)}


def _row_of(category: str, phase: str, view: str) -> str:
    if category in (COMM, mt.COPIES):
        return category
    return phase if view == "phase" else category


def _exclusive(events: pd.DataFrame, windows: np.ndarray, rows: tuple[str, ...], view: str) -> dict[str, float]:
    """Wall time (ns) of each row inside the windows, each instant counted once, rows earlier
    in `rows` first; the last row (host gaps) is what nothing covers."""
    labels = np.array([_row_of(c, p, view) for c, p in zip(events["category"], events["phase"])], dtype=object)
    s, e = events["start_ns"].to_numpy(np.int64), events["end_ns"].to_numpy(np.int64)
    out, covered_before = {}, 0
    mask = np.zeros(len(events), bool)
    for row in rows[:-1]:
        mask |= labels == row
        covered = iv.covered(*iv.merge(s[mask], e[mask]), windows)
        out[row] = covered - covered_before
        covered_before = covered
    length = int((windows[:, 1] - windows[:, 0]).sum())
    out[rows[-1]] = length - covered_before
    return out


def _groups(events: pd.DataFrame, windows: np.ndarray, steps: int, top: int = 3) -> pd.DataFrame:
    """Kernel time per (phase, category) of the events that start in the windows, per step,
    with its largest names."""
    inside = events[iv.in_windows(events["start_ns"].to_numpy(np.int64), windows)]
    inside = inside.assign(dur_s=(inside["end_ns"] - inside["start_ns"]) / NS_PER_S,
                           phase=np.where(inside["category"].isin((COMM, mt.COPIES)), "", inside["phase"]))
    rows = []
    for (phase, cat), g in inside.groupby(["phase", "category"], sort=True):
        by_name = g.groupby("name", sort=False)["dur_s"].sum().sort_values(ascending=False)
        rows.append({"phase": phase, "category": cat, "time_s": g["dur_s"].sum() / steps, "count": len(g) / steps,
                     "top": [(str(n), float(t) / steps) for n, t in by_name.head(top).items()]})
    return pd.DataFrame(rows, columns=["phase", "category", "time_s", "count", "top"])


def breakdown(events: pd.DataFrame, windows: np.ndarray, steps: int, source: str,
              notes: tuple[str, ...] = (), gpu: str = "") -> StepBreakdown:
    """Rows per step of `events` (columns _COLUMNS) inside the merged `windows`."""
    length = int((windows[:, 1] - windows[:, 0]).sum()) if len(windows) else 0
    if length <= 0:
        raise GhsimError(f"{source}: the chosen window holds no time")
    per_step = lambda d: {k: v / NS_PER_S / steps for k, v in d.items()}  # noqa: E731
    return StepBreakdown(source, length / NS_PER_S / steps,
                         per_step(_exclusive(events, windows, mt.CATEGORY_ROWS, "category")),
                         per_step(_exclusive(events, windows, mt.PHASE_ROWS, "phase")),
                         _groups(events, windows, steps), steps, notes, gpu)


def with_step_time(b: StepBreakdown, step_s: float, why: str) -> StepBreakdown:
    """The breakdown of a step timed apart from its trace (a profiler lengthens the host's
    work, not the kernels'): the GPU rows stay, host gaps take the difference."""
    delta = step_s - b.step_s
    note = (f"step time {step_s * 1e3:.2f} ms ({why}); the trace's step is {b.step_s * 1e3:.2f} ms: "
            f"the {delta * 1e3:+.2f} ms go to host gaps")
    fix = lambda d: {**d, mt.HOST_GAPS: d[mt.HOST_GAPS] + delta}  # noqa: E731
    return dataclasses.replace(b, step_s=step_s, by_category=fix(b.by_category), by_phase=fix(b.by_phase),
                               notes=(*b.notes, note))


# -- a measured trace -------------------------------------------------------------------


def measured_events(trace: ev.TraceData, device: int, windows: np.ndarray) -> pd.DataFrame:
    """The device's kernels (with category and phase), copies and memsets as events."""
    k = trace.kernels[(trace.kernels["device"] == device).to_numpy()].sort_values("start_ns", kind="stable")
    cats = [KERNEL_CATEGORIES[i] for i in kernel_categories(k)]
    names = k["name"].astype(str).tolist()
    starts = k["start_ns"].to_numpy(np.int64)
    nvtx = trace.nvtx
    opt_starts = nvtx.loc[nvtx["name"].astype(str).str.startswith(mt.OPTIMIZER_ANNOTATION), "start_ns"]
    phases = mt.measured_phases(starts, names, [str(c) for c in cats], windows, opt_starts.to_numpy(np.int64))
    parts = [pd.DataFrame({"start_ns": starts, "end_ns": starts + k["dur_ns"].to_numpy(np.int64),
                           "category": [str(c) for c in cats], "phase": phases, "name": names})]
    for df, label in ((trace.memcpys, "memcpy"), (trace.memsets, "memset")):
        d = df[(df["device"] == device).to_numpy()]
        names = (label + " " + d["kind"].astype(str)).tolist() if label == "memcpy" else [label] * len(d)
        parts.append(pd.DataFrame({"start_ns": d["start_ns"].to_numpy(np.int64),
                                   "end_ns": (d["start_ns"] + d["dur_ns"]).to_numpy(np.int64),
                                   "category": mt.COPIES, "phase": "", "name": names}))
    return pd.concat(parts, ignore_index=True)


def measured_breakdown(trace: ev.TraceData, steps: str | None = None, nvtx: str | None = None,
                       device: int | None = None) -> StepBreakdown:
    """Rows per step of a measured trace: the ProfilerSteps (all, or --steps), or NVTX ranges
    (each range one step), else the whole trace as one step."""
    if not trace.has_timeline:
        raise GhsimError(f"{trace.source}: an nsys stats CSV has no timeline, so a step cannot be split into "
                         f"overlapping kernels, copies and gaps; compare the nsys SQLite export instead")
    notes = []
    if steps is None and nvtx is None and not trace.steps.empty:
        steps = "all"
    window: Window = select_window(trace, steps, nvtx)
    if window.whole_trace:
        notes.append("no ProfilerStep ranges: the whole trace is taken as one step")
    n = max(1, len(window.step_times_s)) if not window.whole_trace else 1
    chosen = device if device is not None else _busiest(trace, window)
    gpu = next((g.name for g in trace.gpus if g.id == chosen), "")
    return breakdown(measured_events(trace, chosen, _step_windows(trace, window)), window.pieces, n,
                     f"{trace.source} ({window.label}, device {chosen}{', ' + gpu if gpu else ''})", tuple(notes), gpu)


def _step_windows(trace: ev.TraceData, window: Window) -> np.ndarray:
    """Each ProfilerStep inside the window on its own (phases are read step by step), else the window."""
    st = trace.steps
    if window.whole_trace or st.empty:
        return window.pieces
    s, e = st["start_ns"].to_numpy(np.int64), st["end_ns"].to_numpy(np.int64)
    inside = iv.in_windows(s, window.pieces)
    return np.stack([s[inside], e[inside]], axis=1) if inside.any() else window.pieces


def _busiest(trace: ev.TraceData, window: Window) -> int:
    k = trace.kernels[iv.in_windows(trace.kernels["start_ns"].to_numpy(np.int64), window.pieces)]
    if k.empty:
        raise GhsimError(f"{trace.source}: no kernels in {window.label}")
    return int(k.groupby("device")["dur_ns"].sum().idxmax())


# -- ghsim's own timeline -------------------------------------------------------------

_KERNEL_NAMES = {str(c) for c in KERNEL_CATEGORIES}
_LIMIT_US = 1e15  # about 30 years: keeps nanoseconds inside int64
_HOST_RESOURCES = {"cpu", "loader", "host", "mem", "host issue", "layers"}


_STAGE_TRACK = re.compile(r"^(?:gpu|p2p)(\d+)")  # a pipeline timeline's per-stage tracks: gpu0, p2p0>1


def _device_of(resource: str) -> int:
    m = _STAGE_TRACK.match(resource)
    return int(m.group(1)) if m else 0


def simulated_events(chrome: Mapping[str, Any], source: str) -> tuple[pd.DataFrame, float]:
    """Device 0's GPU work of a ghsim Chrome trace (`ghsim simulate --trace`), and its step time."""
    other = chrome.get("otherData") if isinstance(chrome, Mapping) else None
    if not isinstance(other, Mapping) or other.get("generator") != "ghsim":
        raise GhsimError(f"{source}: not a timeline ghsim wrote (`ghsim simulate --trace FILE`); "
                         f"give ghsim's prediction first and the measured trace second")
    step = other.get("step_time_s")
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 < step < 1e9:
        raise GhsimError(f"{source}: otherData.step_time_s is not a positive number of seconds")
    events = chrome.get("traceEvents")
    if not isinstance(events, list):
        raise GhsimError(f"{source}: traceEvents is not an array")
    rows = []
    kernel_cats = _KERNEL_NAMES
    copy_cats = {str(Category.MEMCPY), str(Category.UM)}
    try:
        tracks = {e.get("tid"): str(e.get("args", {}).get("name")) for e in events
                  if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "thread_name"}
        for e in events:
            if not isinstance(e, dict) or e.get("ph") != "X":
                continue
            track = tracks.get(e.get("tid"), "")
            cat = str(e.get("cat"))
            if track in _HOST_RESOURCES or _device_of(track) != 0 or not (cat in kernel_cats or cat in copy_cats):
                continue
            args = e.get("args") or {}
            start = float(e["ts"]) + float(args.get("launch_gap_us", 0.0))  # the launch gap is idle
            end = float(e["ts"]) + float(e["dur"])
            phase = "" if cat in copy_cats else mt.SIMULATED_PHASE.get(str(args.get("phase", "")), mt.FWD)
            name, end = str(e.get("name")), max(start, end)
            # a composite op runs its kernels' categories one after another, in these parts
            span = end - start
            for part_cat, part in _parts(args.get("split"), mt.COPIES if cat in copy_cats else cat):
                rows.append((start, start + span * part, part_cat, phase, name))
                start += span * part
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        what = f"no {err.args[0]!r} field" if isinstance(err, KeyError) else \
            "a field has the wrong type" if isinstance(err, (TypeError, AttributeError)) else str(err)[:120]
        raise GhsimError(f"{source}: malformed event in the timeline: {what}") from None
    df = pd.DataFrame(rows, columns=list(_COLUMNS))
    times = df[["start_ns", "end_ns"]].to_numpy(float)
    if not (np.isfinite(times).all() and (np.abs(times) < _LIMIT_US).all()):
        raise GhsimError(f"{source}: an event's ts, dur or launch gap is not a finite time of plausible size")
    for col in ("start_ns", "end_ns"):
        df[col] = np.round(df[col].astype(float) * 1e3).astype(np.int64)
    return df, float(step)


def _parts(split: Any, category: str) -> list[tuple[str, float]]:
    """An op's (category, fraction) parts: its split when it has one, else all of it."""
    if not isinstance(split, Mapping) or not split:
        return [(category, 1.0)]
    parts = [(str(c), float(f)) for c, f in split.items()]
    total = sum(f for _, f in parts)
    if not all(c in _KERNEL_NAMES and 0 <= f < 1e9 for c, f in parts) or not 0 < total < 1e9:
        raise ValueError(f"bad split {dict(split)!r:.80}")
    return [(c, f / total) for c, f in parts]


def simulated_breakdown(chrome: Mapping[str, Any], source: str) -> StepBreakdown:
    events, step = simulated_events(chrome, source)
    notes = ()
    if not events.empty and set(events["category"]) <= {str(Category.OTHER), COMM}:
        notes = ("a pipeline timeline holds its stages' spans, not their kernels: compute shows as 'other'",)
    other = chrome["otherData"]
    what = " ".join(str(other[k]) for k in ("model", "hardware", "plan") if isinstance(other.get(k), str))
    hardware = other.get("hardware") if isinstance(other.get("hardware"), str) else ""
    return breakdown(events, np.array([[0, round(step * 1e9)]], np.int64), 1,
                     f"{source} ({what})" if what else source, notes, hardware)
