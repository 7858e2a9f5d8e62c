"""The event engine: ops on in-order resources, with dependencies and a host issue thread.

It knows nothing of transformers. An op names the resource it runs on, the ops it
waits for, its duration (the caller prices it), and what it costs the host thread
that issues it.

Why one pass in issue order is an exact discrete-event simulation here: every
resource ghsim models is an in-order queue (a CUDA stream, a copy engine's
stream, a pool of CPU workers taking jobs first come first served) and ops are
issued by one host thread in program order. An op therefore starts at the latest
of (its dependencies' ends, the time the host issued it, the time a server of its
queue comes free, the start of the op before it in the same queue), and no
later event can change that. A min-heap per resource holds its servers' free
times, so a pool of N workers runs N ops at once and never more.

Shared processors: a resource may be slowed by others (a GPU compute stream
by communication kernels, which hold some of its SMs). An op on it then runs
at (1 - slowdown) of its rate while any of those resources is busy with work
issued before it; work issued after it is not seen (a kernel already running
keeps its SMs), which keeps the pass single and in issue order.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class Resource:
    name: str
    servers: int = 1  # ops it can run at once (1 for a stream or link direction)
    slowed_by: tuple[str, ...] = ()  # resources whose busy time takes part of this one's processors
    slowdown: float = 0.0  # fraction of this resource's rate lost while any of them is busy


@dataclass(frozen=True)
class Schedule:
    start: np.ndarray  # seconds
    end: np.ndarray
    issue: np.ndarray  # when the host thread issued each task
    makespan: float


def run(
    resources: Sequence[Resource],
    resource_of: Sequence[int],
    duration: Sequence[float],
    deps: Sequence[tuple[int, ...]],
    issue_cost: Sequence[float],
    host_waits: Sequence[bool],
) -> Schedule:
    """Simulate tasks given in issue order, as parallel sequences (one entry per task).

    resource_of: index into `resources`; duration: seconds on it; deps: indices of
    earlier tasks that must end first (0 <= d < the task's own index); issue_cost:
    host-thread seconds to issue it (kernel launches); host_waits: the host blocks until
    it ends (a sync, or CPU work on the main thread).
    """
    # the loop runs once per op of every plan a search simulates: it reads per-task values
    # through zip and appends its results (a dependency on a later task is then out of range)
    start: list[float] = []
    end: list[float] = []
    issued: list[float] = []
    # a one-server queue is a float (its free time); a pool keeps its servers' free times in a heap
    single = [r.servers == 1 for r in resources]
    free_at = [0.0] * len(resources)
    servers = [[0.0] * r.servers for r in resources]
    last_start = [0.0] * len(resources)
    slowdown = [r.slowdown for r in resources]
    spans_of, busy_slowing, slows = _sharing(resources, single)
    slowed_until = [0.0] * len(resources)  # the last end of work on any resource slowing this one
    host = 0.0
    add_start, add_end, add_issued = start.append, end.append, issued.append
    try:
        for r, work, task_deps, cost, waits in zip(resource_of, duration, deps, issue_cost, host_waits):
            host += cost
            add_issued(host)
            ready = host
            for d in task_deps:
                if end[d] > ready:
                    ready = end[d]
            if single[r]:  # in order, one at a time: after the op before it
                s = free_at[r] if free_at[r] > ready else ready
            else:
                free = servers[r]
                s = free[0] if free[0] > ready else ready
                if last_start[r] > s:
                    s = last_start[r]
            e = s + work
            # (most ops start after every slowing stream has gone idle: nothing to look up)
            if slowed_until[r] > s and work > 0:
                e = _shared_end(s, work, slowdown[r], busy_slowing[r])
            spans = spans_of[r]
            if spans is not None:
                spans[0].append(s)
                spans[1].append(e)
                for q in slows[r]:
                    if e > slowed_until[q]:
                        slowed_until[q] = e
            if single[r]:
                free_at[r] = e
            else:
                heapq.heapreplace(free, e)
                last_start[r] = s
            add_start(s)
            add_end(e)
            if waits and e > host:
                host = e
    except IndexError:
        _reject_later_deps(deps, len(end))
        raise
    makespan = max(max(end, default=0.0), host)
    return Schedule(np.array(start), np.array(end), np.array(issued), makespan)


def _sharing(resources: Sequence[Resource], single: list[bool]) -> tuple[list, list, list]:
    """Who slows whom: each resource's busy spans (starts, ends, one server) if it slows another
    (else None), the spans of whatever slows each resource, and whom each one slows."""
    names = {r.name: k for k, r in enumerate(resources)}
    slowing = [[names[x] for x in r.slowed_by if x in names] if r.slowdown > 0 else [] for r in resources]
    slows = [[r for r, ks in enumerate(slowing) if k in ks] for k in range(len(resources))]  # whom k slows
    spans_of = [([], [], single[k]) if slows[k] else None for k in range(len(resources))]
    return spans_of, [[spans_of[k] for k in ks] for ks in slowing], slows


def _reject_later_deps(deps: Sequence[tuple[int, ...]], i: int) -> None:
    """Raise if task i depends on a task not issued before it."""
    for d in deps[i] if i < len(deps) else ():
        if d >= i:
            raise ValueError(f"task {i} depends on task {d}, which is not issued before it")


def distinct(items: Sequence) -> tuple[list, np.ndarray]:
    """The distinct objects of `items` (replicated layers share op objects), and which of them
    each item is: per-op work is then done once per distinct op and indexed. Items must hash
    and compare by identity, as ops do (graph/ops.Op): the dicts then run at C speed."""
    row_of = {x: r for r, x in enumerate(dict.fromkeys(items))}
    return list(row_of), np.fromiter(map(row_of.__getitem__, items), np.intp, len(items))


def run_ops(resources: Sequence[Resource], ops: Sequence, deps: Sequence[tuple[int, ...]],
            duration: Callable[[Any], float], issue_cost: Callable[[Any], float], lead_gap: Callable[[Any], float],
            distinct_ops: tuple[list, np.ndarray] | None = None) -> tuple[Schedule, np.ndarray]:
    """run() for op objects (anything with .resource and .host_waits): each distinct op is asked
    its duration, its issue cost and its lead gap (idle stream before its kernels, run ahead of
    its duration) once. `distinct_ops`: distinct(ops), if the caller has it. Returns the
    schedule and the lead gap of every op."""
    index = {r.name: k for k, r in enumerate(resources)}
    ds, rows = distinct_ops or distinct(ops)
    gap = np.array([lead_gap(o) for o in ds], float)
    busy = np.array([duration(o) for o in ds], float) + gap

    def per_op(values, dtype=float) -> list:
        return np.array(values, dtype)[rows].tolist()

    sched = run(resources, per_op([index[o.resource] for o in ds], int), busy[rows].tolist(), deps,
                per_op([issue_cost(o) for o in ds]), per_op([o.host_waits for o in ds], bool))
    return sched, gap[rows]


def _shared_end(start: float, work: float, slowdown: float,
                busy: list[tuple[list[float], list[float], bool]]) -> float:
    """End of `work` seconds begun at `start`, run at (1 - slowdown) while any busy interval covers it."""
    rate = 1.0 - slowdown
    only = None  # the one resource busy after `start`, if one server
    for spans in busy:
        starts, ends, single_server = spans
        if single_server and (not ends or ends[-1] <= start):
            continue  # idle since before `start`
        if only is not None or not single_server:
            only = False
            break
        only = spans
    if only:
        # the common case in a few steps: the sweep's first span (`only`'s first ending after
        # `start`; one server: ends never decrease) already holds all of the work
        starts, ends, _ = only
        k = bisect_right(ends, start)
        if starts[k] <= start and work <= (ends[k] - start) * rate:
            return start + work / rate
    return _sweep(start, work, rate, _overlapping(start, start + work / rate, busy))


def _overlapping(start: float, horizon: float, busy: list[tuple[list[float], list[float], bool]]
                 ) -> list[tuple[float, float]]:
    """The busy spans over [start, horizon), clipped to begin at `start`, in order."""
    spans = []
    for starts, ends, single_server in busy:
        if not single_server:
            k = 0
        elif ends and ends[-1] > start:  # one server: ends never decrease
            k = bisect_right(ends, start)
        else:
            continue  # idle since before `start`
        while k < len(starts) and starts[k] < horizon:
            if ends[k] > start:
                spans.append((max(starts[k], start), ends[k]))
            k += 1
    spans.sort()
    return spans


def _sweep(start: float, work: float, rate: float, spans: list[tuple[float, float]]) -> float:
    """End of `work` begun at `start`, at `rate` inside the ordered spans and at full rate outside."""
    t, left = start, work
    for a, b in spans:
        if b <= t:
            continue
        if a > t:
            if left <= a - t:
                return t + left
            left -= a - t
            t = a
        if left <= (b - t) * rate:
            return t + left / rate
        left -= (b - t) * rate
        t = b
    return t + left
