"""Memory per tier: replay each op's allocations in issue order and find the peaks.

PyTorch's caching allocator sees allocations in the order the host issues
ops, not the order the GPU runs them, so peaks are found in issue order
(torch.cuda.max_memory_allocated measures exactly this).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ghsim.graph.ops import Op


@dataclass(frozen=True)
class TierPeak:
    peak_bytes: float
    peak_op: int  # index of the op during which the peak occurs (-1: static only)
    breakdown: dict[str, float] = field(default_factory=dict)  # bytes by category at the peak
    curve: np.ndarray | None = None  # bytes held after each op, in issue order


def hbm_replay(ops: list[Op], static_total: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """HBM in use after each op and while it runs (its allocations and workspace on top of what
    was held before it), in issue order; and each op's workspace."""
    alloc = np.fromiter((o.hbm_alloc for o in ops), float, len(ops))
    free = np.fromiter((o.hbm_free for o in ops), float, len(ops))
    transient = np.fromiter((o.hbm_transient for o in ops), float, len(ops))
    after = static_total + np.cumsum(alloc - free)
    before = np.concatenate(([static_total], after[:-1]))
    return after, before + alloc + transient, transient


def hbm_peak(ops: list[Op], static: dict[str, float]) -> TierPeak:
    base = sum(static.values())
    after, during, transient = hbm_replay(ops, base)
    if len(ops) == 0:
        return TierPeak(base, -1, dict(static), after)
    i = int(during.argmax())
    breakdown = dict(static)
    # replicated layers share op objects: sum each distinct op's tags times its count
    counts = Counter(map(id, ops[:i]))
    distinct = {id(op): op for op in ops[:i]}
    for key, n in counts.items():
        for tag, nbytes in (distinct[key].hbm_by_tag or {}).items():
            breakdown[tag] = breakdown.get(tag, 0.0) + n * nbytes
    for tag, nbytes in (ops[i].hbm_by_tag or {}).items():
        if nbytes > 0:
            breakdown[tag] = breakdown.get(tag, 0.0) + nbytes
    if transient[i]:
        temp = ops[i].mem_tag or "temporaries"
        breakdown[temp] = breakdown.get(temp, 0.0) + transient[i]
    breakdown = {k: v for k, v in breakdown.items() if abs(v) > 0.5}
    return TierPeak(float(during[i]), i, breakdown, after)


def host_peak(ops: list[Op], static: dict[str, float]) -> TierPeak:
    delta = np.fromiter((o.host_alloc - o.host_free for o in ops), float, len(ops))
    base = sum(static.values())
    after = base + np.cumsum(delta)
    if len(ops) == 0 or after.max(initial=base) <= base:
        return TierPeak(base, -1, {k: v for k, v in static.items() if v}, after)
    i = int(after.argmax())
    breakdown = dict(static)
    for op in ops[: i + 1]:
        if op.host_alloc or op.host_free:
            tag = op.mem_tag or "host_buffers"
            breakdown[tag] = breakdown.get(tag, 0.0) + op.host_alloc - op.host_free
    return TierPeak(float(after[i]), i, {k: v for k, v in breakdown.items() if abs(v) > 0.5}, after)
