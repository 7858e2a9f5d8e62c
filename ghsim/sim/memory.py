"""Memory per tier: replay each op's allocations in issue order and find the peaks.

PyTorch's caching allocator sees allocations in the order the host issues
ops, not the order the GPU runs them, so peaks are found in issue order
(torch.cuda.max_memory_allocated measures exactly this).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ghsim.graph.ops import Op
from ghsim.sim.engine import distinct


@dataclass(frozen=True)
class TierPeak:
    peak_bytes: float
    peak_op: int  # index of the op during which the peak occurs (-1: static only)
    breakdown: dict[str, float] = field(default_factory=dict)  # bytes by category at the peak
    curve: np.ndarray | None = None  # bytes held after each op, in issue order


def hbm_replay(ops: list[Op], static_total: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """HBM in use after each op and while it runs (its allocations and workspace on top of what
    was held before it), in issue order; and each op's workspace."""
    return _replay(ops, static_total, distinct(ops))


def _replay(ops: list[Op], static_total: float, distinct_ops: tuple[list[Op], np.ndarray]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # each distinct op's effects read once (replicated layers share op objects), then indexed
    ds, rows = distinct_ops
    effects = np.array([(o.hbm_alloc, o.hbm_free, o.hbm_transient) for o in ds], float).reshape(-1, 3)[rows]
    alloc, free, transient = effects.T
    after = static_total + np.cumsum(alloc - free)
    before = np.concatenate(([static_total], after[:-1]))
    return after, before + alloc + transient, transient


def hbm_peak(ops: list[Op], static: dict[str, float]) -> TierPeak:
    base = sum(static.values())
    ds, rows = distinct_ops = distinct(ops)
    after, during, transient = _replay(ops, base, distinct_ops)
    if len(ops) == 0:
        return TierPeak(base, -1, dict(static), after)
    i = int(during.argmax())
    breakdown = dict(static)
    # replicated layers share op objects: sum each distinct op's tags times its count (in the
    # order the ops first appear)
    counts = np.bincount(rows[:i], minlength=len(ds))
    for k in np.flatnonzero(counts).tolist():
        n = int(counts[k])
        for tag, nbytes in (ds[k].hbm_by_tag or {}).items():
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
    """Host memory after each op, from what is held all step (`static`), and its peak: an op's
    allocations, then its temporaries (`host_transient`) while it runs."""
    ds, rows = distinct(ops)
    effects = np.array([(o.host_alloc - o.host_free, o.host_transient) for o in ds], float).reshape(-1, 2)[rows]
    delta, transient = effects.T
    base = sum(static.values())
    after = base + np.cumsum(delta)
    during = after + transient
    if len(ops) == 0 or during.max(initial=base) <= base:
        return TierPeak(base, -1, {k: v for k, v in static.items() if v}, after)
    i = int(during.argmax())
    breakdown = dict(static)
    moves = np.array([bool(o.host_alloc or o.host_free) for o in ds], bool)[rows[: i + 1]]
    for op in map(ops.__getitem__, np.flatnonzero(moves).tolist()):  # in issue order
        tag = op.mem_tag or "host_buffers"
        breakdown[tag] = breakdown.get(tag, 0.0) + op.host_alloc - op.host_free
    if transient[i]:
        tag = ops[i].mem_tag or "host_temporaries"
        breakdown[tag] = breakdown.get(tag, 0.0) + float(transient[i])
    return TierPeak(float(during[i]), i, {k: v for k, v in breakdown.items() if abs(v) > 0.5}, after)
