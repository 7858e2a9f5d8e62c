"""Match a measured trace window to ghsim's prediction of the same plan, per step, category by category.

Both sides are reduced to the same per-step figures: GPU kernel time by the seven kernel
categories (traces/categories.py on the measured side, graph/ops.Category on the predicted
one), host<->device copies by direction (bytes and time), the GPU's idle time and the number
of kernels. `ghsim calibrate --trace` fits its overlay from these; anything that sets a
prediction beside a trace (`ghsim trace compare`, `validate --explain`) can read the same
table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ghsim.cost.overlay import COPY_DIRECTIONS  # what offload moves; DtoD copies are device work
from ghsim.errors import GhsimError
from ghsim.graph.ops import KERNEL_CATEGORIES, Category, Kind, Resource
from ghsim.traces import events as ev
from ghsim.traces.summary import TraceSummary, parse_steps, summarize

_COPY_KIND = {Kind.H2D: "HtoD", Kind.D2H: "DtoH"}
SMALL_GAP_S = 1e-5  # idle gaps shorter than this: the GPU front end between back-to-back kernels


@dataclass(frozen=True)
class CopyTotals:
    """Per step: bytes moved and seconds the copies took, in one direction."""

    bytes: float
    seconds: float
    count: float = 0.0

    @property
    def rate(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class StepFigures:
    """One step's figures, measured (averaged over a trace window) or predicted."""

    step_time_s: float | None  # None: an aggregate-only input has no timeline to time a step on
    kernel_s: Mapping[str, float]  # category -> kernel seconds per step
    kernel_count: float | None  # kernels per step (None where the prediction does not count them)
    gemm_count: float | None  # of which GEMM kernels: the layers' structure (depth, fused projections)
    copies: Mapping[str, CopyTotals]  # HtoD / DtoH
    idle_s: float | None = None  # GPU idle per step (measured) / waits on the compute stream (predicted)
    small_gap_s: float | None = None  # of which in gaps shorter than SMALL_GAP_S
    memory_kinds: tuple[str, ...] = ()  # host memory kinds the copies used (pinned, pageable)


@dataclass(frozen=True)
class MeasuredWindow:
    """A trace window reduced to per-step figures, and what the trace says about where it ran."""

    source: str
    label: str  # "steps 5-7"
    steps: int
    gpu_name: str | None
    figures: StepFigures
    step_times_s: tuple[float, ...]
    notes: tuple[str, ...] = field(default=())


def measure(trace: ev.TraceData, steps: str | None) -> MeasuredWindow:
    """Per-step figures of the window `steps` ("5-7"; None: every ProfilerStep, or the whole trace
    when it has none). The step time is the fastest step of the window: a profiler's flushes and
    a first step's allocations only lengthen steps."""
    if not trace.has_timeline:
        return _measure_aggregate(trace, steps)
    notes: list[str] = []
    try:
        s = summarize(trace, steps=steps or "all")
    except GhsimError:
        if steps:
            raise
        s = summarize(trace)  # one step recorded without a profiler schedule: all of it
        notes.append("the trace has no ProfilerStep ranges: its whole span is taken as one step")
    n = max(len(s.step_times_s), 1)
    if not s.kernel_time_s:
        raise GhsimError(f"{trace.source}: no GPU kernels in {s.window}: nothing to calibrate from")
    step = min(s.step_times_s) if s.step_times_s else (s.window_s or 0.0)
    gaps = s.idle_gaps
    small = sum(b.total_s for b in gaps.histogram if b.hi_s <= SMALL_GAP_S) / n if gaps else None
    figures = _per_step(s, n, step, (gaps.total_s / n) if gaps else None, small,
                        _copy_memory_kinds(trace, s.device))
    return MeasuredWindow(trace.source, s.window, n, s.gpu_name, figures, tuple(s.step_times_s),
                          tuple(notes) + tuple(s.notes))


def _measure_aggregate(trace: ev.TraceData, steps: str | None) -> MeasuredWindow:
    """An nsys stats CSV: totals over the whole capture, with no timeline to cut steps from. The
    user's --steps A-B says which steps the capture holds; totals are divided by their number."""
    if not steps:
        raise GhsimError(f"{trace.source}: an nsys stats CSV has totals only, no timeline; say which steps the "
                         f"capture holds with --steps A-B (its totals are divided by their number), or calibrate "
                         f"from the nsys SQLite export")
    lo, hi = parse_steps(steps)
    n = hi - lo + 1
    s = summarize(trace)
    if not s.kernel_time_s:
        raise GhsimError(f"{trace.source}: no GPU kernels in it: nothing to calibrate from")
    figures = _per_step(s, n, None)
    note = (f"aggregate-only input: its totals are taken as steps {lo}-{hi} ({n} steps); no step time, idle "
            f"gaps or launch gaps to fit")
    return MeasuredWindow(trace.source, f"steps {lo}-{hi} (totals / {n})", n, s.gpu_name, figures, (),
                          (note,) + tuple(s.notes))


def _per_step(s: TraceSummary, n: int, step: float | None, idle_s: float | None = None,
              small_gap_s: float | None = None, memory_kinds: tuple[str, ...] = ()) -> StepFigures:
    """A summary's kernel time by category, kernel counts and copies, divided by its `n` steps."""
    copies = {d: CopyTotals(s.memcpy[d].bytes / n, s.memcpy[d].time_s / n, s.memcpy[d].count / n)
              for d in COPY_DIRECTIONS}
    return StepFigures(step, {c: s.kernel_time_by_category_s.get(c, 0.0) / n for c in KERNEL_CATEGORIES},
                       s.kernel_count / n, s.kernel_count_by_category.get(Category.GEMM, 0) / n, copies,
                       idle_s, small_gap_s, memory_kinds)


def _copy_memory_kinds(trace: ev.TraceData, device: int | None) -> tuple[str, ...]:
    c = trace.memcpys
    rows = c[c["kind"].isin(COPY_DIRECTIONS).to_numpy() & ((c["device"] == device).to_numpy() if device is not None
                                                           else True)]
    return tuple(sorted(str(k) for k in set(rows["memory"]) if str(k) != "unknown"))


def predicted(report: Any) -> StepFigures:
    """The same figures from a StepReport (kernel time by category from its breakdown; copies and
    kernel counts from its kernel-level timeline, which is the whole step for one GPU without
    gradient accumulation)."""
    breakdown = report.time_breakdown_s
    copies = {d: CopyTotals(0.0, 0.0) for d in COPY_DIRECTIONS}
    count = gemms = None
    tl = report.timeline
    if tl is not None:
        sched = tl.schedule
        totals = {d: [0.0, 0.0, 0.0] for d in COPY_DIRECTIONS}
        kernels = gemm_kernels = 0
        for i, op in enumerate(tl.ops):
            direction = _COPY_KIND.get(op.kind)
            if direction:
                t = totals[direction]
                t[0] += op.bytes
                t[1] += float(sched.end[i] - sched.start[i])
                t[2] += max(op.kernels, 1)
            elif op.resource == Resource.GPU and op.category in KERNEL_CATEGORIES:
                kernels += op.kernels
                gemm_kernels += op.kernels if op.category == Category.GEMM else 0
        copies = {d: CopyTotals(*t) for d, t in totals.items()}
        whole_step = report.plan.get("pp", 1) == 1 and report.plan.get("grad_accum", 1) in (1, None)
        count, gemms = (float(kernels), float(gemm_kernels)) if whole_step else (None, None)
    waits = sum(v for k, v in breakdown.items() if str(k).startswith("wait_"))
    return StepFigures(report.step_time_s, {c: float(breakdown.get(c, 0.0)) for c in KERNEL_CATEGORIES}, count,
                       gemms, copies, waits, float(breakdown.get("wait_kernel_gaps", 0.0)))


@dataclass(frozen=True)
class CategoryMatch:
    category: str
    measured_s: float  # per step
    predicted_s: float

    @property
    def ratio(self) -> float | None:
        """Measured over predicted time; None where ghsim predicts none of it."""
        return self.measured_s / self.predicted_s if self.predicted_s > 0 else None


def match_categories(measured: StepFigures, prediction: StepFigures) -> list[CategoryMatch]:
    """Kernel time per step by category, measured beside predicted, in KERNEL_CATEGORIES order."""
    return [CategoryMatch(c, measured.kernel_s.get(c, 0.0), prediction.kernel_s.get(c, 0.0))
            for c in KERNEL_CATEGORIES]
