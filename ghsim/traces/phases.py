"""Trace events -> the rows ghsim predicts: a kernel's category (categories.py) and its
training phase (forward, backward, optimizer), so a measured trace and a simulated
timeline can be held side by side.

A measured PyTorch trace does not label phases; they are read from the kernel sequence of
each step: backward starts at the first kernel whose name says it is a backward one (the
loss's backward, `*_backward_*`, `bprop`, `dgrad`: the loss is the forward's last op, so
its gradient is backward's first), and the optimizer at the first optimizer-category
kernel after the `Optimizer.step` annotation (PyTorch emits it on the CPU; the GPU catches
up later), else after backward. Nothing shape-based: profiler kernel events carry grids,
not problem shapes.
"""

from __future__ import annotations

import re

import numpy as np

from ghsim.graph.ops import KERNEL_CATEGORIES, Category

FWD, BWD, OPT = "forward", "backward", "optimizer"
PHASES = (FWD, BWD, OPT)
COPIES, HOST_GAPS = "copies", "host gaps"
COMPUTE_CATEGORIES = tuple(c for c in KERNEL_CATEGORIES if c != Category.COMMUNICATION)

# the rows of the two views; each view's rows add up to the step
CATEGORY_ROWS = tuple(str(c) for c in COMPUTE_CATEGORIES) + (str(Category.COMMUNICATION), COPIES, HOST_GAPS)
PHASE_ROWS = PHASES + (str(Category.COMMUNICATION), COPIES, HOST_GAPS)

_BACKWARD_KERNEL = re.compile(r"backward|bprop|_bwd|bwd_|dgrad|wgrad", re.IGNORECASE)
OPTIMIZER_ANNOTATION = "Optimizer.step"

# a simulated op's phase (graph.ops.Phase, graph.pipeline.PipelineSegment) -> the row's phase
SIMULATED_PHASE = {"fwd": FWD, "final_fwd": FWD, "data": FWD, "": FWD,
                   "bwd": BWD, "final_bwd": BWD, "recompute": BWD, "opt": OPT}


def is_backward_kernel(name: str) -> bool:
    return bool(_BACKWARD_KERNEL.search(name))


def measured_phases(starts: np.ndarray, names: list[str], categories: list[str],
                    steps: np.ndarray, optimizer_starts: np.ndarray) -> np.ndarray:
    """The phase of every kernel of a measured trace (object array of PHASES).

    starts: kernel start times (ns), sorted; steps: (n, 2) step windows; optimizer_starts:
    start times of the `Optimizer.step` annotations (may be empty). Kernels outside every
    step get the forward phase (they are cut away by the caller's window anyway).
    """
    out = np.full(len(starts), FWD, dtype=object)
    known = {n: is_backward_kernel(n) for n in set(names)}  # a trace repeats a few hundred names
    backward = np.fromiter((known[n] for n in names), bool, len(names))
    optimizer = np.array([c == Category.OPTIMIZER for c in categories], bool)
    for a, b in steps:
        lo, hi = np.searchsorted(starts, a), np.searchsorted(starts, b)
        if lo == hi:
            continue
        idx = np.arange(lo, hi)
        bwd_hits = idx[backward[lo:hi]]
        bwd_at = starts[bwd_hits[0]] if len(bwd_hits) else b
        anno = optimizer_starts[(optimizer_starts >= a) & (optimizer_starts < b)]
        after = max(bwd_at, anno.min()) if len(anno) else bwd_at
        opt_hits = idx[optimizer[lo:hi] & (starts[lo:hi] >= after)]
        opt_at = starts[opt_hits[0]] if len(opt_hits) else (anno.min() if len(anno) else b)
        s = starts[lo:hi]
        out[lo:hi] = np.where(s >= opt_at, OPT, np.where(s >= bwd_at, BWD, FWD))
    return out
