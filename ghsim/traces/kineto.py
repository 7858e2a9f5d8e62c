"""PyTorch profiler (Kineto) Chrome-trace JSON, plain or gzipped -> TraceData.

Two timestamp conventions exist:
- old (to 2023): integer microseconds since the epoch, no header base;
- new: float microseconds (nanosecond fraction) relative to the header's
  `baseTimeNanoseconds`, which may come after `traceEvents` in the file.
Floats are kept as text by the reader and converted to exact integer
nanoseconds here, so totals match the file to the nanosecond.

Only what a summary needs is kept, in compact arrays: GPU kernels, copies,
memsets, user annotations (CPU and GPU side), ProfilerStep#N ranges and
allocator [memory] events. Everything else (CPU ops, runtime calls, flows,
Python frames) is decoded one event at a time and dropped.
"""

from __future__ import annotations

import gzip
import lzma
import re
from array import array
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from pathlib import Path

import numpy as np

from ghsim.errors import GhsimError
from ghsim.traces import events as ev
from ghsim.traces.jsonstream import JsonStream, utf8

GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"  # xz packs our committed traces about a third smaller than gzip

KERNEL_CATS = frozenset({"kernel", "Kernel"})
MEMCPY_CATS = frozenset({"gpu_memcpy", "Memcpy", "memcpy"})
MEMSET_CATS = frozenset({"gpu_memset", "Memset", "memset"})
CPU_ANNOTATION_CATS = frozenset({"user_annotation"})
GPU_ANNOTATION_CATS = frozenset({"gpu_user_annotation"})
CUDA_DEVICE_TYPE = 1  # c10::DeviceType::CUDA in [memory] events
_LIMIT = 1 << 62      # ns; keeps base + relative time inside int64

_MEMCPY_NAME = re.compile(r"Memcpy\s+(\w+)(?:\s*\((\w+)\s*->\s*(\w+)\))?")
_KINDS = {"HtoD": "HtoD", "DtoH": "DtoH", "DtoD": "DtoD", "PtoP": "PtoP", "HtoH": "HtoH"}
_MEMORY = {"pinned": "pinned", "pageable": "pageable", "managed": "managed", "device": "device"}


def us_to_ns(value) -> int:
    """Kineto microseconds (int, or float kept as its JSON text) -> integer ns."""
    kind = type(value)
    if kind is int:
        return value * 1000
    if kind is str:
        whole, dot, frac = value.partition(".")
        if dot and len(frac) <= 3 and frac.isdigit() and whole.lstrip("-").isdigit():
            ns = abs(int(whole)) * 1000 + int(frac.ljust(3, "0"))
            return -ns if whole.startswith("-") else ns
        try:
            ns = Decimal(value) * 1000  # exponents, >3 decimals
        except InvalidOperation:
            raise ValueError(f"{value!r:.40} is not a number of microseconds") from None
        if not ns.is_finite():
            raise ValueError(f"{value!r:.40} is not a finite number of microseconds")
        return int(round(ns))
    if kind is float:
        return int(round(value * 1000))
    raise TypeError(f"expected a number of microseconds, got {value!r}")


def _int(value, default: int) -> int:
    return value if type(value) is int else default


@lru_cache(maxsize=4096)
def memcpy_kind(name: str) -> tuple[str, str]:
    """'Memcpy HtoD (Pinned -> Device)' -> ('HtoD', 'pinned')."""
    m = _MEMCPY_NAME.search(name)
    if not m:
        return "other", "unknown"
    kind = _KINDS.get(m.group(1), "other")
    host = m.group(2) if kind == "HtoD" else m.group(3) if kind == "DtoH" else None
    if host is None:
        return kind, "device" if kind in ("DtoD", "PtoP") else "unknown"
    return kind, _MEMORY.get(host.lower(), "unknown")


class _Collector:
    """Compact column buffers for the events a summary needs."""

    def __init__(self):
        self.names: dict[str, int] = {}
        self.k_name, self.k_start, self.k_dur = array("i"), array("q"), array("q")
        self.k_dev, self.k_stream = array("h"), array("q")
        self.c_kind, self.c_mem = [], []
        self.c_bytes, self.c_start, self.c_dur = array("q"), array("q"), array("q")
        self.c_dev, self.c_stream = array("h"), array("q")
        self.s_bytes, self.s_start, self.s_dur = array("q"), array("q"), array("q")
        self.s_dev, self.s_stream = array("h"), array("q")
        self.r_name, self.r_start, self.r_end, self.r_gpu = [], array("q"), array("q"), []
        self.m_ts, self.m_dev, self.m_alloc, self.m_res = array("q"), array("h"), array("q"), array("q")

    def event(self, e: dict) -> None:
        cat = e.get("cat")
        if type(cat) is str:
            if cat in KERNEL_CATS:
                return self._kernel(e)
            if cat in MEMCPY_CATS:
                return self._memcpy(e)
            if cat in MEMSET_CATS:
                return self._memset(e)
            if cat in CPU_ANNOTATION_CATS or cat in GPU_ANNOTATION_CATS:
                if e.get("ph") == "X":
                    return self._range(e, cat in GPU_ANNOTATION_CATS)
                return None
        name = e.get("name")
        if type(name) is str:
            if name.startswith("ProfilerStep#") and e.get("ph") == "X":
                return self._range(e, False)  # older torch: the step is a cpu_op
            if name == "[memory]":
                return self._memory(e)
        return None

    @staticmethod
    def _where(e: dict, args: dict) -> tuple[int, int]:
        return _int(args.get("device"), _int(e.get("pid"), 0)), _int(args.get("stream"), _int(e.get("tid"), -1))

    @staticmethod
    def _span(e: dict) -> tuple[int, int]:
        start, dur = us_to_ns(e["ts"]), us_to_ns(e["dur"])
        if dur < 0:
            raise ValueError(f"negative duration {e['dur']!r}")
        return start, dur

    def _kernel(self, e: dict) -> None:
        args = e.get("args") or {}
        start, dur = self._span(e)
        device, stream = self._where(e, args)
        name = e.get("name")
        name = name if type(name) is str else str(name)
        code = self.names.get(name)
        if code is None:
            code = self.names[name] = len(self.names)
        self.k_name.append(code); self.k_start.append(start); self.k_dur.append(dur)
        self.k_dev.append(device); self.k_stream.append(stream)

    def _memcpy(self, e: dict) -> None:
        args = e.get("args") or {}
        start, dur = self._span(e)
        device, stream = self._where(e, args)
        kind, memory = memcpy_kind(str(e.get("name", "")))
        self.c_kind.append(kind); self.c_mem.append(memory)
        self.c_bytes.append(_int(args.get("bytes"), 0)); self.c_start.append(start); self.c_dur.append(dur)
        self.c_dev.append(device); self.c_stream.append(stream)

    def _memset(self, e: dict) -> None:
        args = e.get("args") or {}
        start, dur = self._span(e)
        device, stream = self._where(e, args)
        self.s_bytes.append(_int(args.get("bytes"), 0)); self.s_start.append(start); self.s_dur.append(dur)
        self.s_dev.append(device); self.s_stream.append(stream)

    def _range(self, e: dict, on_gpu: bool) -> None:
        start, dur = self._span(e)
        self.r_name.append(utf8(str(e.get("name", "")))); self.r_gpu.append(on_gpu)
        self.r_start.append(start); self.r_end.append(start + dur)

    def _memory(self, e: dict) -> None:
        args = e.get("args") or {}
        if args.get("Device Type") != CUDA_DEVICE_TYPE:
            return
        self.m_ts.append(us_to_ns(e["ts"])); self.m_dev.append(_int(args.get("Device Id"), 0))
        self.m_alloc.append(_int(args.get("Total Allocated"), 0)); self.m_res.append(_int(args.get("Total Reserved"), 0))


def _gpus(props) -> tuple[ev.GpuInfo, ...]:
    if not isinstance(props, list):
        return ()
    out = []
    for p in props:
        if isinstance(p, dict) and type(p.get("id")) is int:
            out.append(ev.GpuInfo(p["id"], utf8(str(p.get("name", "unknown GPU"))), _int(p.get("numSms"), None),
                                  _int(p.get("totalGlobalMem"), None)))
    return tuple(out)


def _opener(path: Path):
    """gzip.open, lzma.open or open, by the file's first bytes."""
    with open(path, "rb") as f:
        head = f.read(len(XZ_MAGIC))
    if head.startswith(GZIP_MAGIC):
        return gzip.open
    return lzma.open if head == XZ_MAGIC else open


def load_kineto(path: str | Path) -> ev.TraceData:
    """Read a PyTorch profiler trace (.json, .json.gz or .json.xz) without loading it whole."""
    path = Path(path)
    opener = _opener(path)
    col = _Collector()
    header: dict = {}
    saw_array = False
    with opener(path, "rb") as raw:
        stream = JsonStream(raw, str(path))
        for what, key, value in stream:
            if what == "member":
                header[key] = value
                continue
            saw_array = True
            if type(value) is not dict:
                raise GhsimError(f"{path}: traceEvents element before byte {stream.offset} is not an object")
            try:
                col.event(value)
            except (KeyError, TypeError, ValueError, ArithmeticError, AttributeError) as e:
                what_event = value.get("cat", value.get("name", "event"))
                raise GhsimError(f"{path}: malformed {what_event!s:.40} event before byte {stream.offset}: "
                                 f"{_reason(e)}") from None
    if not saw_array:
        if "traceEvents" in header:
            if header["traceEvents"] != []:
                raise GhsimError(f"{path}: traceEvents is not an array")
        else:
            raise GhsimError(f"{path}: no traceEvents array (not a PyTorch profiler / Chrome trace)")
    return _assemble(path, col, header)


def _reason(error: Exception) -> str:
    """What is wrong with an event, without Python's internals: a missing field is named as
    such; a wrong type or value says what it got."""
    if isinstance(error, KeyError):
        return f"no {error.args[0]!r} field"
    if isinstance(error, (TypeError, AttributeError)):
        return f"a field has the wrong type ({str(error)[:160]})"
    return f"{str(error)[:200]}"


def _saw_events(col: _Collector) -> bool:
    return bool(len(col.k_start) or len(col.c_start) or len(col.s_start))


def _assemble(path: Path, col: _Collector, header: dict) -> ev.TraceData:
    if not _saw_events(col):
        raise GhsimError(f"{path}: no GPU activity (no kernel, gpu_memcpy or gpu_memset events); "
                         f"was the profiler run with ProfilerActivity.CUDA?")
    base = header.get("baseTimeNanoseconds", 0)
    if type(base) is not int or not 0 <= base < _LIMIT:
        raise GhsimError(f"{path}: baseTimeNanoseconds is not a plausible integer: {base!r:.40}")

    def ns(buf: array) -> np.ndarray:
        out = np.frombuffer(buf, dtype=np.int64) if len(buf) else np.zeros(0, np.int64)
        if out.size and (out.max() >= _LIMIT or out.min() <= -_LIMIT):
            raise GhsimError(f"{path}: timestamps out of range (beyond year 2116)")
        return out + np.int64(base)  # a new array; the buffer stays untouched

    def raw(buf: array, dtype) -> np.ndarray:
        return np.frombuffer(buf, dtype=dtype).copy() if len(buf) else np.zeros(0, dtype)

    names = [utf8(n) for n in col.names]
    kernels = ev.make_kernels(raw(col.k_name, np.int32), ns(col.k_start), raw(col.k_dur, np.int64),
                              raw(col.k_dev, np.int16), raw(col.k_stream, np.int64), name_categories=names)
    memcpys = ev.make_memcpys(col.c_kind, raw(col.c_bytes, np.int64), ns(col.c_start), raw(col.c_dur, np.int64),
                              raw(col.c_dev, np.int16), raw(col.c_stream, np.int64), col.c_mem)
    memsets = ev.make_memsets(raw(col.s_bytes, np.int64), ns(col.s_start), raw(col.s_dur, np.int64),
                              raw(col.s_dev, np.int16), raw(col.s_stream, np.int64))
    nvtx = ev.make_nvtx(col.r_name, ns(col.r_start), ns(col.r_end), on_gpu=np.array(col.r_gpu, dtype=bool))
    memory = ev.make_memory(ns(col.m_ts), raw(col.m_dev, np.int16), raw(col.m_alloc, np.int64), raw(col.m_res, np.int64))
    meta = {k: str(header[k])[:200] for k in ("schemaVersion", "traceName", "baseTimeNanoseconds") if k in header}
    return ev.TraceData(
        source=str(path), format="kineto-json",
        kernels=kernels.sort_values("start_ns", kind="stable").reset_index(drop=True),
        memcpys=memcpys.sort_values("start_ns", kind="stable").reset_index(drop=True),
        memsets=memsets.sort_values("start_ns", kind="stable").reset_index(drop=True),
        um_faults=ev.make_um_faults([], [], [], [], []), nvtx=nvtx, steps=ev.steps_from_nvtx(nvtx),
        memory=memory, gpus=_gpus(header.get("deviceProperties")), meta=meta,
    )
