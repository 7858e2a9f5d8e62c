"""Interval arithmetic on int64 nanosecond arrays: union, coverage, gaps.

Everything is vectorised over events; loops run only over window pieces
(a handful of steps or NVTX ranges), so a million kernels cost a sort.
"""

from __future__ import annotations

import numpy as np


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of [start, end) intervals as sorted, disjoint, non-touching blocks."""
    if len(starts) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(starts, kind="stable")
    s = np.asarray(starts, np.int64)[order]
    e = np.maximum.accumulate(np.asarray(ends, np.int64)[order])
    # A block starts wherever an interval begins after everything before it has ended.
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > e[:-1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(s) - 1]
    return s[first], e[last]


def _cumulative(bs: np.ndarray, be: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Length of the blocks' union that lies before each x."""
    lens = be - bs
    before = np.r_[0, np.cumsum(lens)]
    j = np.searchsorted(bs, x, side="right") - 1
    jc = np.maximum(j, 0)
    partial = np.where(j >= 0, np.clip(x - bs[jc], 0, lens[jc]), 0) if len(bs) else np.zeros_like(x)
    return np.where(j >= 0, before[jc], 0) + partial


def covered(bs: np.ndarray, be: np.ndarray, windows: np.ndarray) -> int:
    """Total length of merged blocks inside the (merged) windows, an (n, 2) array."""
    if len(bs) == 0 or len(windows) == 0:
        return 0
    return int((_cumulative(bs, be, windows[:, 1]) - _cumulative(bs, be, windows[:, 0])).sum())


def gaps(bs: np.ndarray, be: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """Lengths of the idle stretches inside the windows (leading and trailing included)."""
    out = []
    for a, b in windows:
        lo = np.searchsorted(be, a, side="right")
        hi = np.searchsorted(bs, b, side="left")
        s = np.maximum(bs[lo:hi], a)
        e = np.minimum(be[lo:hi], b)
        edges_start = np.r_[a, e]
        edges_end = np.r_[s, b]
        g = edges_end - edges_start
        out.append(g[g > 0])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def in_windows(points: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """Mask of points inside some window [a, b)."""
    if len(windows) == 0:
        return np.zeros(len(points), bool)
    i = np.searchsorted(windows[:, 0], points, side="right") - 1
    ic = np.maximum(i, 0)
    return (i >= 0) & (points < windows[ic, 1])


def as_windows(starts, ends) -> np.ndarray:
    """Merged (n, 2) window array from interval bounds."""
    s, e = merge(np.asarray(starts, np.int64), np.asarray(ends, np.int64))
    return np.stack([s, e], axis=1) if len(s) else np.zeros((0, 2), np.int64)
