"""The one in-memory form every trace importer produces.

Columnar on purpose: a training trace holds 1e5-1e7 GPU events, so each
event kind is a pandas DataFrame of fixed-width columns (int64 nanoseconds,
small ints, categorical names) rather than a list of objects. All times are
integer nanoseconds on the trace's own clock; durations are never negative.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

# Copy directions. The four a summary reports, then the rest a trace can hold.
# UM_* are unified-memory page migrations (nsys copyKind 11-13), kept apart
# from explicit copies because they cost differently and mean something else.
DIRECTIONS = ("HtoD", "DtoH", "DtoD", "PtoP")
UM_DIRECTIONS = ("UM_HtoD", "UM_DtoH", "UM_DtoD")
COPY_KINDS = DIRECTIONS + ("HtoH",) + UM_DIRECTIONS + ("other",)

# Host-side memory kind of a copy, when the trace says.
HOST_MEMORY_KINDS = ("pinned", "pageable", "managed", "device", "unknown")


@dataclass(frozen=True)
class GpuInfo:
    """What the trace says about one GPU (None where it does not say)."""

    id: int
    name: str
    sm_count: int | None = None
    total_memory_bytes: int | None = None
    memory_bandwidth_bytes_per_s: int | None = None
    clock_hz: int | None = None


@dataclass(frozen=True)
class TraceData:
    """Everything ghsim reads from one trace file.

    kernels   name (categorical), start_ns, dur_ns, device, stream, count,
              optional short_name and category columns
    memcpys   kind (one of COPY_KINDS), bytes, start_ns, dur_ns, device,
              stream, memory (one of HOST_MEMORY_KINDS), count
    memsets   bytes, start_ns, dur_ns, device, stream, count
    um_faults side ("cpu"/"gpu"), start_ns, dur_ns, device, faults
    nvtx      name, start_ns, end_ns, domain, on_gpu (ranges only, not marks)
    steps     step (the N of ProfilerStep#N), start_ns, end_ns
    memory    ts_ns, device, allocated, reserved (allocator totals over time)

    `count` is 1 for timeline events; an aggregate-only input (nsys stats
    CSV) has one row per name with the instance count there, start_ns 0 and
    has_timeline False.
    """

    source: str
    format: str
    kernels: pd.DataFrame
    memcpys: pd.DataFrame
    memsets: pd.DataFrame
    um_faults: pd.DataFrame
    nvtx: pd.DataFrame
    steps: pd.DataFrame
    memory: pd.DataFrame
    gpus: tuple[GpuInfo, ...] = ()
    has_timeline: bool = True
    meta: Mapping[str, str] = field(default_factory=dict)

    def memory_peaks(self) -> dict[int, tuple[int, int]]:
        """Peak (allocated, reserved) bytes per CUDA device over the trace."""
        if self.memory.empty:
            return {}
        peaks = self.memory.groupby("device")[["allocated", "reserved"]].max()
        return {int(d): (int(r.allocated), int(r.reserved)) for d, r in peaks.iterrows()}


def _ints(values, dtype) -> np.ndarray:
    return np.asarray(values, dtype=dtype) if len(values) else np.zeros(0, dtype=dtype)


def _names(values, categories: Sequence[str] | None = None) -> pd.Categorical:
    """Names as a categorical; from codes when the caller already interned them."""
    if categories is not None:
        return pd.Categorical.from_codes(_ints(values, np.int32), categories=pd.Index(categories, dtype=object))
    return pd.Categorical(list(values) if not isinstance(values, np.ndarray) else values)


def _fixed(values, allowed: Sequence[str]) -> pd.Categorical:
    return pd.Categorical(list(values) if not isinstance(values, np.ndarray) else values, categories=list(allowed))


def make_kernels(name, start_ns, dur_ns, device, stream, count=None, *,
                 name_categories: Sequence[str] | None = None, category=None) -> pd.DataFrame:
    """Kernel table; `name` is strings, or int codes into `name_categories`."""
    n = len(start_ns)
    cols = {
        "name": _names(name, name_categories),
        "start_ns": _ints(start_ns, np.int64),
        "dur_ns": _ints(dur_ns, np.int64),
        "device": _ints(device, np.int16),
        "stream": _ints(stream, np.int64),
        "count": _ints(count if count is not None else np.ones(n, np.int64), np.int64),
    }
    if category is not None:
        from ghsim.traces.categories import CATEGORIES
        cols["category"] = _fixed(category, CATEGORIES)
    return pd.DataFrame(cols)


def make_memcpys(kind, nbytes, start_ns, dur_ns, device, stream, memory=None, count=None) -> pd.DataFrame:
    n = len(start_ns)
    return pd.DataFrame({
        "kind": _fixed(kind, COPY_KINDS),
        "bytes": _ints(nbytes, np.int64),
        "start_ns": _ints(start_ns, np.int64),
        "dur_ns": _ints(dur_ns, np.int64),
        "device": _ints(device, np.int16),
        "stream": _ints(stream, np.int64),
        "memory": _fixed(memory if memory is not None else ["unknown"] * n, HOST_MEMORY_KINDS),
        "count": _ints(count if count is not None else np.ones(n, np.int64), np.int64),
    })


def make_memsets(nbytes, start_ns, dur_ns, device, stream, count=None) -> pd.DataFrame:
    n = len(start_ns)
    return pd.DataFrame({
        "bytes": _ints(nbytes, np.int64),
        "start_ns": _ints(start_ns, np.int64),
        "dur_ns": _ints(dur_ns, np.int64),
        "device": _ints(device, np.int16),
        "stream": _ints(stream, np.int64),
        "count": _ints(count if count is not None else np.ones(n, np.int64), np.int64),
    })


def make_um_faults(side, start_ns, dur_ns, device, faults) -> pd.DataFrame:
    return pd.DataFrame({
        "side": _fixed(side, ("cpu", "gpu")),
        "start_ns": _ints(start_ns, np.int64),
        "dur_ns": _ints(dur_ns, np.int64),
        "device": _ints(device, np.int16),
        "faults": _ints(faults, np.int64),
    })


def make_nvtx(name, start_ns, end_ns, domain=None, on_gpu=None) -> pd.DataFrame:
    n = len(start_ns)
    return pd.DataFrame({
        "name": pd.Series(list(name), dtype=object),
        "start_ns": _ints(start_ns, np.int64),
        "end_ns": _ints(end_ns, np.int64),
        "domain": pd.Series(list(domain) if domain is not None else [""] * n, dtype=object),
        "on_gpu": _ints(on_gpu if on_gpu is not None else np.zeros(n, bool), bool),
    })


def make_steps(step, start_ns, end_ns) -> pd.DataFrame:
    df = pd.DataFrame({
        "step": _ints(step, np.int64),
        "start_ns": _ints(start_ns, np.int64),
        "end_ns": _ints(end_ns, np.int64),
    })
    return df.sort_values("step", kind="stable").reset_index(drop=True)


def make_memory(ts_ns, device, allocated, reserved) -> pd.DataFrame:
    return pd.DataFrame({
        "ts_ns": _ints(ts_ns, np.int64),
        "device": _ints(device, np.int16),
        "allocated": _ints(allocated, np.int64),
        "reserved": _ints(reserved, np.int64),
    })


def empty_trace_parts() -> dict[str, pd.DataFrame]:
    """Empty tables for every event kind, for importers that lack some."""
    return {
        "kernels": make_kernels([], [], [], [], []),
        "memcpys": make_memcpys([], [], [], [], [], []),
        "memsets": make_memsets([], [], [], [], []),
        "um_faults": make_um_faults([], [], [], [], []),
        "nvtx": make_nvtx([], [], []),
        "steps": make_steps([], [], []),
        "memory": make_memory([], [], [], []),
    }


def steps_from_nvtx(nvtx: pd.DataFrame) -> pd.DataFrame:
    """ProfilerStep#N ranges among NVTX/annotation ranges, one per step number.

    PyTorch can emit the same step both as a CPU range and a GPU-projected
    one; the CPU range (the step as the training loop saw it) wins.
    """
    if nvtx.empty:
        return make_steps([], [], [])
    numbers = nvtx["name"].str.extract(r"^ProfilerStep#(\d+)$", expand=False)
    hits = nvtx[numbers.notna()].assign(step=numbers[numbers.notna()].astype(np.int64))
    hits = hits.sort_values(["step", "on_gpu", "start_ns"], kind="stable").drop_duplicates("step")
    return make_steps(hits["step"].to_numpy(), hits["start_ns"].to_numpy(), hits["end_ns"].to_numpy())
