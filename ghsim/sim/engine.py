"""The event engine: ops on in-order resources, with dependencies and a host issue thread.

It knows nothing of transformers. An op names the resource it runs on, the ops it
waits for, its duration, and what it costs the host thread that issues it.

Why one pass in issue order is an exact discrete-event simulation here: every
resource ghsim models is an in-order queue (a CUDA stream, a copy engine's
stream, a pool of CPU workers taking jobs first come first served) and ops are
issued by one host thread in program order. An op therefore starts at the latest
of (its dependencies' ends, the time the host issued it, the time a server of its
queue comes free, the start of the op before it in the same queue), and no
later event can change that. A min-heap per resource holds its servers' free
times, so a pool of N workers runs N ops at once and never more.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Resource:
    name: str
    servers: int = 1  # ops it can run at once (1 for a stream or link direction)


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
    earlier tasks that must end first; issue_cost: host-thread seconds to issue it
    (kernel launches); host_waits: the host blocks until it ends (a sync, or CPU
    work on the main thread).
    """
    n = len(duration)
    start = [0.0] * n
    end = [0.0] * n
    issued = [0.0] * n
    servers = [[0.0] * r.servers for r in resources]  # free times, kept as heaps
    last_start = [0.0] * len(resources)
    host = 0.0
    for i in range(n):
        host += issue_cost[i]
        issued[i] = host
        ready = host
        for d in deps[i]:
            if d >= i:
                raise ValueError(f"task {i} depends on task {d}, which is not issued before it")
            if end[d] > ready:
                ready = end[d]
        r = resource_of[i]
        free = servers[r]
        s = free[0] if free[0] > ready else ready
        if last_start[r] > s:
            s = last_start[r]
        e = s + duration[i]
        heapq.heapreplace(free, e)
        last_start[r] = s
        start[i] = s
        end[i] = e
        if host_waits[i] and e > host:
            host = e
    makespan = max(max(end, default=0.0), host)
    return Schedule(np.array(start), np.array(end), np.array(issued), makespan)
