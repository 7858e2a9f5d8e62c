"""Where a compute stream's time goes over a window of a simulated timeline: kernels by
category, copies and unified-memory stalls on it, and what it waited for in its gaps. The one
breakdown every report uses: a one-GPU step is the window [0, step time) of its kernel-level
run; a pipeline stage sums the windows of its micro-batches' forward, backward and optimizer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ghsim.graph.ops import COPY, CPU, KERNEL_CATEGORIES, UM, Category, Op, Phase, Resource
from ghsim.report.step_report import Stall, Timeline

HOST_SIDE = (Resource.H2D, Resource.D2H, Resource.CPU)  # offload's copy engines and host cores
# streams whose ops do not hold up the compute stream's spans: gradient reductions, memory
# markers, and offload's copies and CPU work (timed apart: after backward, in the optimizer)
NOT_COMPUTE = (Resource.DP, Resource.MEM, Resource.LOADER, Resource.HOST) + HOST_SIDE


@dataclass(frozen=True)
class Segment:
    """A window of a kernel-level run: its length, where its time went, its kernel-busy time."""

    seconds: float
    breakdown: dict[str, float]
    kernel_busy: float


# where a compute-stream op's time goes: its kernels' categories, or a copy
_STREAM_CATEGORIES = KERNEL_CATEGORIES + (Category.MEMCPY, Stall.UM_MIGRATION)
_NOT_KERNEL = {COPY: Category.MEMCPY, UM: Stall.UM_MIGRATION}  # the rest: Category.OTHER


@dataclass(frozen=True)
class OpColumns:
    """What window() and run_microbatch() ask of every op, as arrays (built once per run)."""

    on_gpu: np.ndarray  # on the compute stream
    side: np.ndarray  # on another stream (not the compute stream, not the memory markers)
    kernel: np.ndarray  # a GPU kernel category (counts toward kernel-busy time)
    cpu: np.ndarray  # host-core work
    not_compute: np.ndarray  # does not hold up the compute stream's spans (NOT_COMPUTE)
    host_side: np.ndarray  # offload copies and CPU work
    opt_phase: np.ndarray
    dp_bwd: np.ndarray  # a backward gradient reduction
    shares: np.ndarray  # (ops, _STREAM_CATEGORIES): how a compute-stream op's busy time splits

    @staticmethod
    def of(distinct: list[Op], rows: np.ndarray) -> "OpColumns":
        """Columns of the ops `distinct[rows]`."""
        col = {c: k for k, c in enumerate(_STREAM_CATEGORIES)}
        # members read once: a read off the enum class is slow in Python 3.11 (graph/ops.py)
        gpu, mem, dp, opt, bwd, other = Resource.GPU, Resource.MEM, Resource.DP, Phase.OPT, Phase.BWD, Category.OTHER
        flags, shares = [], []
        for op in distinct:
            r = op.resource
            flags.append((r == gpu, r not in (gpu, mem), op.category in KERNEL_CATEGORIES, op.category == CPU,
                          r in NOT_COMPUTE, r in HOST_SIDE, op.phase == opt, r == dp and op.phase == bwd))
            share = [0.0] * len(col)
            if op.category in KERNEL_CATEGORIES:  # composite ops split over the categories of their kernels
                for cat, part in op.split or ((op.category, 1.0),):
                    share[col[cat]] += part
            else:
                share[col[_NOT_KERNEL.get(op.category, other)]] = 1.0
            shares.append(share)
        f = np.array(flags, bool).reshape(-1, 8)[rows]
        return OpColumns(*f.T, shares=np.array(shares).reshape(-1, len(col))[rows])


def window(tl: Timeline, a: float, b: float, cols: OpColumns) -> Segment:
    """Where the compute stream's time in [a, b) went (kernels by category, and what it waited for)."""
    ops, sched = tl.ops, tl.schedule
    start, end = sched.start, sched.end
    lead = tl.lead_gap if tl.lead_gap is not None else np.zeros(len(ops))
    body = start + lead  # kernels run after their launch gap; the gap is idle
    out: dict[str, float] = {}
    on_cpu = Coverage(start[cols.cpu], end[cols.cpu])  # host cores (one in-order pool): an offloaded optimizer

    def wait(key: str, x: float, y: float) -> None:
        """The stream idles over [x, y) for `key`; while host cores work, for them (as on one GPU)."""
        cpu_s = on_cpu.over(x, y) if key.startswith("wait_") and key != Stall.WAIT_CPU else 0.0
        if cpu_s:
            out[Stall.WAIT_CPU] = out.get(Stall.WAIT_CPU, 0.0) + cpu_s
        out[key] = out.get(key, 0.0) + y - x - cpu_s

    # the compute stream's ops in the window, in order (one stream: they never overlap)
    g = np.flatnonzero(cols.on_gpu & (end > a) & (start < b))
    s, e = np.maximum(start[g], a), np.minimum(end[g], b)
    cursor = np.maximum.accumulate(np.concatenate(([a], e)))  # cursor[k]: where the stream was before op k
    for k in np.flatnonzero(s > cursor[:-1]):
        wait(_waited_for(int(g[k]), tl), float(cursor[k]), float(s[k]))
    s = np.maximum(s, cursor[:-1])
    runs = e > s
    idle = np.where(runs, np.clip(np.minimum(body[g], e) - s, 0.0, None), 0.0)
    if idle.any():
        out[Stall.WAIT_KERNEL_GAPS] = float(idle.sum())
    for cat, t in zip(_STREAM_CATEGORIES, np.where(runs, e - s - idle, 0.0) @ cols.shares[g]):
        if t:
            out[cat] = out.get(cat, 0.0) + float(t)
    last = float(cursor[-1])
    if b > last:  # the window ends on another stream: a collective, a copy or the CPU
        ending = np.flatnonzero(cols.side & (end > a) & (end <= b + 1e-12))
        key = ops[int(ending[np.argmax(end[ending])])].category if len(ending) else Stall.WAIT_OTHER
        key = {CPU: Stall.WAIT_CPU, COPY: Stall.WAIT_TRANSFER}.get(key, key)
        key = key if key in KERNEL_CATEGORIES or key.startswith("wait_") else Stall.WAIT_OTHER
        wait(key, last, b)
    # kernel-busy time: kernels of every stream (communication too), overlaps counted once
    lo, hi = np.maximum(body, a), np.minimum(end, b)
    busy = cols.kernel & (hi > lo)
    return Segment(b - a, out, _union_length(lo[busy], hi[busy]))


def _waited_for(i: int, timeline: Timeline) -> str:
    """What the GPU stream's op i waited for, when it started after the stream went idle."""
    sched = timeline.schedule
    start = sched.start[i]
    for d in timeline.deps[i]:
        if abs(sched.end[d] - start) < 1e-12:
            cat = timeline.ops[d].category
            if cat == Category.COMMUNICATION:  # a collective on another stream (several GPUs)
                return Category.COMMUNICATION
            return Stall.WAIT_CPU if cat == CPU else Stall.WAIT_TRANSFER if cat == COPY else Stall.WAIT_OTHER
    if abs(sched.issue[i] - start) < 1e-12:
        return Stall.WAIT_HOST_LAUNCH
    return Stall.WAIT_OTHER


class Coverage:
    """Time covered by disjoint, ordered intervals, asked of many spans (prefix sums, no scan per span)."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray):
        if len(starts) > 1 and (starts[1:] < ends[:-1]).any():  # not one in-order stream: merge overlaps
            order = np.argsort(starts, kind="stable")
            starts, ends = starts[order], np.maximum.accumulate(ends[order])
            first = np.concatenate(([True], starts[1:] > ends[:-1]))  # where a merged interval begins
            starts, ends = starts[first], np.append(ends[np.flatnonzero(first)[1:] - 1], ends[-1])
        self.starts, self.ends = starts, ends
        self.before = np.concatenate(([0.0], np.cumsum(ends - starts)))  # covered before interval k

    def upto(self, t: float) -> float:
        k = int(np.searchsorted(self.starts, t, side="right"))  # intervals starting at or before t
        return float(self.before[k - 1] + min(t, self.ends[k - 1]) - self.starts[k - 1]) if k else 0.0

    def over(self, x: float, y: float) -> float:
        if len(self.starts) == 0 or y <= x:
            return 0.0
        return self.upto(y) - self.upto(x)


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by intervals [starts, ends)."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    holes = s[1:] - e[:-1]
    return float(e[-1] - s[0] - holes[holes > 0].sum())
