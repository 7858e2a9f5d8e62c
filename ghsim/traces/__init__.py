"""Real traces in: importers, one in-memory form (TraceData), and the summary.

Public entry points:
    load_trace(path) -> TraceData                     any supported file, by content
    summarize(trace, steps=, nvtx=, device=, top=)     -> TraceSummary
    summarize_intervals(kernels, copies, steps_s=...)  -> TraceSummary of a simulated timeline
    categorize(kernel_name) -> one of CATEGORIES
"""

from ghsim.traces.categories import CATEGORIES, categorize
from ghsim.traces.events import COPY_KINDS, DIRECTIONS, UM_DIRECTIONS, GpuInfo, TraceData
from ghsim.traces.kineto import load_kineto
from ghsim.traces.loader import load_trace
from ghsim.traces.nsys import load_nsys_sqlite
from ghsim.traces.nsys_csv import load_nsys_csv
from ghsim.traces.summary import (
    CopyInterval,
    CopyStat,
    GapBin,
    IdleGaps,
    KernelInterval,
    KernelStat,
    TraceSummary,
    summarize,
    summarize_intervals,
)

__all__ = [
    "CATEGORIES", "COPY_KINDS", "DIRECTIONS", "UM_DIRECTIONS", "CopyInterval", "CopyStat", "GapBin", "GpuInfo",
    "IdleGaps", "KernelInterval", "KernelStat", "TraceData", "TraceSummary", "categorize", "load_kineto",
    "load_nsys_csv", "load_nsys_sqlite", "load_trace", "summarize", "summarize_intervals",
]
