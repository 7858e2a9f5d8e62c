"""Nsight Systems SQLite exports (`nsys export --type sqlite`) -> TraceData.

The export schema moves between nsys releases (2022: EXPORT_META_DATA, no
ENUM_* tables; 2024: META_DATA_EXPORT, ENUM_* tables, greenContextId; tables
gaining columns, columns added by hand after export). So nothing here is
positional: tables are looked up by name, columns through PRAGMA table_info,
and enum values through the ENUM_* tables when the file carries them.
"""

from __future__ import annotations

import functools
import sqlite3
from typing import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from ghsim.errors import GhsimError
from ghsim.traces import events as ev

SQLITE_MAGIC = b"SQLite format 3\x00"

KERNEL_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL")
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
NVTX_TABLE = "NVTX_EVENTS"
GPU_TABLES = ("TARGET_INFO_GPU", "TARGET_INFO_CUDA_GPU")
UM_CPU_FAULT_TABLE = "CUDA_UM_CPU_PAGE_FAULT_EVENTS"
UM_GPU_FAULT_TABLE = "CUDA_UM_GPU_PAGE_FAULT_EVENTS"
UM_COUNTER_TABLE = "CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER"
# CUpti_ActivityUnifiedMemoryCounterKind values.
UM_COUNTER_TRANSFERS = {1: "UM_HtoD", 2: "UM_DtoH", 8: "UM_DtoD"}
UM_COUNTER_CPU_FAULTS, UM_COUNTER_GPU_FAULTS = 3, 4

# CUPTI / nsys copyKind values, used when ENUM_CUDA_MEMCPY_OPER is absent.
DEFAULT_COPY_KINDS = {
    1: "HtoD", 2: "DtoH", 8: "DtoD", 9: "HtoH", 10: "PtoP",
    11: "UM_HtoD", 12: "UM_DtoH", 13: "UM_DtoD",
}
# ENUM_CUDA_MEMCPY_OPER symbol suffix -> our kind.
_COPY_SYMBOLS = {
    "HTOD": "HtoD", "DTOH": "DtoH", "DTOD": "DtoD", "HTOH": "HtoH", "PTOP": "PtoP",
    "UVM_HTOD": "UM_HtoD", "UVM_DTOH": "UM_DtoH", "UVM_DTOD": "UM_DtoD",
}
# nsys memory kinds (srcKind/dstKind), used when ENUM_CUDA_MEM_KIND is absent.
DEFAULT_MEM_KINDS = {0: "pageable", 1: "pinned", 2: "device", 3: "device", 4: "managed",
                     5: "device", 6: "managed"}
_MEM_SYMBOLS = {"PAGEABLE": "pageable", "PINNED": "pinned", "DEVICE": "device", "ARRAY": "device",
                "MANAGED": "managed", "DEVICE_STATIC": "device", "MANAGED_STATIC": "managed"}

# NVTX_EVENTS.eventType values that are not ranges: category, mark, thread
# name, domain create/destroy. Everything else with an end time is a range.
NVTX_NON_RANGE_TYPES = (33, 34, 39, 75, 76)
NVTX_DOMAIN_CREATE = 75


def is_sqlite(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(16) == SQLITE_MAGIC


class _Db:
    """A read-only connection that knows which tables and columns exist."""

    def __init__(self, path: Path):
        self.path = path
        uri = f"file:{path.resolve().as_posix()}?mode=ro&immutable=1"
        self.conn = sqlite3.connect(uri, uri=True)
        self.tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")}
        self._columns: dict[str, set[str]] = {}

    def columns(self, table: str) -> set[str]:
        if table not in self._columns:
            self._columns[table] = {r[1] for r in self.conn.execute(f"PRAGMA table_info([{table}])")}
        return self._columns[table]

    def first_table(self, names) -> str | None:
        return next((t for t in names if t in self.tables), None)

    def pick(self, table: str, *candidates: str) -> str | None:
        cols = self.columns(table)
        return next((c for c in candidates if c in cols), None)

    def rows(self, sql: str, params=()) -> list[tuple]:
        return self.conn.execute(sql, params).fetchall()

    def int_columns(self, table: str, exprs: list[str], order: str = "start") -> list[np.ndarray]:
        """Integer columns of a table as int64 arrays, read in batches (no list of row tuples)."""
        cursor = self.conn.execute(f"SELECT {', '.join(exprs)} FROM [{table}] ORDER BY {order}")
        batches = []
        while True:
            rows = cursor.fetchmany(200_000)
            if not rows:
                break
            batches.append(np.array(rows, dtype=np.int64).reshape(len(rows), len(exprs)))
        block = np.concatenate(batches) if batches else np.zeros((0, len(exprs)), np.int64)
        return [block[:, i] for i in range(len(exprs))]

    def strings(self, ids) -> dict[int, str]:
        """StringIds lookups for just the ids in use."""
        ids = [int(i) for i in ids if i is not None]
        if not ids or "StringIds" not in self.tables:
            return {}
        out: dict[int, str] = {}
        for lo in range(0, len(ids), 900):  # SQLite's bound-parameter limit
            chunk = ids[lo:lo + 900]
            marks = ",".join("?" * len(chunk))
            out.update(self.rows(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", chunk))
        return out

    def enum(self, table: str) -> dict[int, str]:
        if table not in self.tables or not {"id", "name"} <= self.columns(table):
            return {}
        return {int(i): str(n) for i, n in self.rows(f"SELECT id, name FROM [{table}]") if i is not None and n is not None}


_TIME_LIMIT_NS = 1 << 62  # beyond year 2116 from the epoch: a damaged cell (INT64_MAX), not a time


def _durations(db: _Db, table: str, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """end - start of every row; a row ending before it starts or outside any plausible time is a
    damaged export, refused with what is wrong rather than summarized as if sound."""
    bad = (start < 0) | (start >= _TIME_LIMIT_NS) | (end >= _TIME_LIMIT_NS)
    if bad.any():
        i = int(np.argmax(bad))
        raise GhsimError(f"{db.path}: {table}: {int(bad.sum())} rows have a start or end outside any plausible "
                         f"time (first: start {int(start[i])}, end {int(end[i])} ns)")
    backwards = end < start
    if backwards.any():
        i = int(np.argmax(backwards))
        raise GhsimError(f"{db.path}: {table}: {int(backwards.sum())} rows end before they start "
                         f"(first: start {int(start[i])}, end {int(end[i])} ns)")
    return end - start


def _or(column: str | None, fallback: int) -> str:
    """SQL for a column with NULLs (or a missing column) replaced by a constant."""
    return f"COALESCE({column}, {fallback})" if column else str(fallback)


def _interned(db: _Db, ids: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """StringIds ids -> (codes, unique names) without building N Python strings."""
    uniq, inverse = np.unique(ids, return_inverse=True)
    lookup = db.strings(uniq.tolist())
    names = [lookup.get(int(i), f"<string {int(i)}>") for i in uniq]
    codes, categories = pd.factorize(pd.Series(names, dtype=object))
    return codes[inverse].astype(np.int32), list(categories)


def _read_kernels(db: _Db, table: str) -> pd.DataFrame:
    for col in ("start", "end"):
        if col not in db.columns(table):
            raise GhsimError(f"{db.path}: unknown schema: {table} has no '{col}' column")
    name_col = db.pick(table, "demangledName", "shortName", "mangledName", "name")
    short_col = db.pick(table, "shortName") or name_col
    start, end, device, stream, name_ids, short_ids = db.int_columns(table, [
        "start", "COALESCE(end, start)", _or(db.pick(table, "deviceId", "device"), 0),
        _or(db.pick(table, "streamId", "stream"), 0), _or(name_col, 0), _or(short_col, 0)])
    codes, names = _interned(db, name_ids)
    short_codes, short_names = _interned(db, short_ids)
    df = ev.make_kernels(codes, start, _durations(db, table, start, end), device, stream, name_categories=names)
    df["short_name"] = pd.Categorical.from_codes(short_codes, categories=pd.Index(short_names, dtype=object))
    return df


def _enum_map(db: _Db, table: str, prefix: str, symbols: dict[str, str], defaults: dict[int, str],
              unknown: str) -> dict[int, str]:
    """Enum codes to ghsim's names: the export's own enum table where it has one, else the defaults."""
    mapping = dict(defaults)
    for i, symbol in db.enum(table).items():
        mapping[i] = symbols.get(symbol.removeprefix(prefix), unknown)
    return mapping


def _copy_kind_map(db: _Db) -> dict[int, str]:
    return _enum_map(db, "ENUM_CUDA_MEMCPY_OPER", "CUDA_MEMCPY_KIND_", _COPY_SYMBOLS, DEFAULT_COPY_KINDS, "other")


def _mem_kind_map(db: _Db) -> dict[int, str]:
    return _enum_map(db, "ENUM_CUDA_MEM_KIND", "CUDA_MEMOPR_MEMORY_KIND_", _MEM_SYMBOLS, DEFAULT_MEM_KINDS, "unknown")


def _read_memcpys(db: _Db) -> pd.DataFrame:
    table = MEMCPY_TABLE
    if table not in db.tables:
        return ev.make_memcpys([], [], [], [], [], [])
    kind_col = db.pick(table, "copyKind", "memcpyKind", "kind")
    bytes_col = db.pick(table, "bytes", "size")
    if kind_col is None or bytes_col is None or not {"start", "end"} <= db.columns(table):
        raise GhsimError(f"{db.path}: unknown schema: {table} lacks start/end/bytes/copyKind columns")
    start, end, device, stream, nbytes, kind_ids, src, dst = db.int_columns(table, [
        "start", "COALESCE(end, start)", _or(db.pick(table, "deviceId", "device"), 0),
        _or(db.pick(table, "streamId", "stream"), 0), _or(bytes_col, 0), _or(kind_col, 0),
        _or(db.pick(table, "srcKind"), -1), _or(db.pick(table, "dstKind"), -1)])
    kind = pd.Series(kind_ids).map(_copy_kind_map(db)).fillna("other").to_numpy(dtype=object)
    # The host side of a copy says pinned or pageable: the source of an HtoD, the target of a DtoH.
    host = np.where(np.isin(kind, ("HtoD", "UM_HtoD")), src, np.where(np.isin(kind, ("DtoH", "UM_DtoH")), dst, -1))
    memory = pd.Series(host).map(_mem_kind_map(db)).fillna("unknown").to_numpy(dtype=object)
    memory[np.isin(kind, ("DtoD", "PtoP"))] = "device"
    return ev.make_memcpys(kind, nbytes, start, _durations(db, table, start, end), device, stream, memory)


def _read_memsets(db: _Db) -> pd.DataFrame:
    table = MEMSET_TABLE
    if table not in db.tables or not {"start", "end", "bytes"} <= db.columns(table):
        return ev.make_memsets([], [], [], [], [])
    start, end, device, stream, nbytes = db.int_columns(table, [
        "start", "COALESCE(end, start)", _or(db.pick(table, "deviceId", "device"), 0),
        _or(db.pick(table, "streamId", "stream"), 0), "COALESCE(bytes, 0)"])
    return ev.make_memsets(nbytes, start, _durations(db, table, start, end), device, stream)


def _read_um_faults(db: _Db, um_rows: Callable[[], tuple[np.ndarray, ...]]) -> pd.DataFrame:
    parts = []
    table = UM_CPU_FAULT_TABLE
    if table in db.tables and "start" in db.columns(table):
        (start,) = db.int_columns(table, ["start"])
        n = len(start)
        parts.append(ev.make_um_faults(["cpu"] * n, start, np.zeros(n), np.full(n, -1), np.ones(n)))
    table = UM_GPU_FAULT_TABLE
    if table in db.tables and {"start", "end"} <= db.columns(table):
        start, end, device, faults = db.int_columns(table, [
            "start", "COALESCE(end, start)", _or(db.pick(table, "deviceId"), 0),
            _or(db.pick(table, "numberOfPageFaults"), 1)])
        parts.append(ev.make_um_faults(["gpu"] * len(start), start, np.maximum(end - start, 0), device, faults))
    if not any(len(p) for p in parts) and _has_um_counters(db):
        kind, start, end, value, device = um_rows()
        for side, code in (("cpu", UM_COUNTER_CPU_FAULTS), ("gpu", UM_COUNTER_GPU_FAULTS)):
            sel = kind == code
            parts.append(ev.make_um_faults([side] * int(sel.sum()), start[sel], np.maximum(end - start, 0)[sel],
                                           device[sel], value[sel]))
    parts = [p for p in parts if len(p)]
    if not parts:
        return ev.make_um_faults([], [], [], [], [])
    return pd.concat(parts, ignore_index=True).sort_values("start_ns", kind="stable").reset_index(drop=True)


def _has_um_counters(db: _Db) -> bool:
    return UM_COUNTER_TABLE in db.tables and {"start", "counterKind", "value"} <= db.columns(UM_COUNTER_TABLE)


def _um_counter_rows(db: _Db) -> tuple[np.ndarray, ...]:
    """Older exports keep UM transfers and faults as CUPTI unified-memory counter records."""
    table = UM_COUNTER_TABLE
    end_expr = "COALESCE(end, start)" if "end" in db.columns(table) else "start"
    kind, start, end, value, src, dst, dev = db.int_columns(table, [
        "COALESCE(counterKind, 0)", "start", end_expr, "COALESCE(value, 0)", _or(db.pick(table, "srcId"), -1),
        _or(db.pick(table, "dstId"), -1), _or(db.pick(table, "deviceId"), -1)])
    end = np.maximum(end, start)
    # The GPU end of a transfer: the destination of an HtoD, the source of anything else.
    device = np.where(dev >= 0, dev, np.where(kind == 1, dst, src))
    return kind, start, end, value, np.maximum(device, 0)


def _read_um_counter_copies(um_rows: Callable[[], tuple[np.ndarray, ...]]) -> pd.DataFrame:
    kind, start, end, value, device = um_rows()
    sel = np.isin(kind, list(UM_COUNTER_TRANSFERS))
    kinds = [UM_COUNTER_TRANSFERS[int(k)] for k in kind[sel]]
    return ev.make_memcpys(kinds, value[sel], start[sel], (end - start)[sel], device[sel],
                           np.zeros(int(sel.sum()), np.int64), ["managed"] * len(kinds))


def _read_nvtx(db: _Db) -> pd.DataFrame:
    table = NVTX_TABLE
    cols = db.columns(table) if table in db.tables else set()
    if not {"start", "end"} <= cols:
        return ev.make_nvtx([], [], [])
    event_type = "eventType" if "eventType" in cols else "NULL"
    text = "text" if "text" in cols else "NULL"
    text_id = "textId" if "textId" in cols else "NULL"
    domain = "domainId" if "domainId" in cols else "NULL"
    rows = db.rows(f"SELECT start, end, {event_type}, {text}, {text_id}, {domain} FROM [{table}] ORDER BY start")
    domains = {r[5]: r[3] for r in rows if r[2] == NVTX_DOMAIN_CREATE and r[3] is not None}
    ranges = [r for r in rows if r[1] is not None and r[2] not in NVTX_NON_RANGE_TYPES and r[1] >= r[0]]
    strings = db.strings({r[4] for r in ranges if r[3] is None and r[4] is not None})
    names = [r[3] if r[3] is not None else strings.get(r[4], "") for r in ranges]
    return ev.make_nvtx(names, [r[0] for r in ranges], [r[1] for r in ranges],
                        [domains.get(r[5], "") if r[5] else "" for r in ranges])


def _read_gpus(db: _Db) -> tuple[ev.GpuInfo, ...]:
    table = db.first_table(GPU_TABLES)
    if table is None:
        return ()
    cols = db.columns(table)
    want = ("id", "name", "smCount", "totalMemory", "memoryBandwidth", "clockRate")
    select = ", ".join(c if c in cols else "NULL" for c in want)
    gpus = {}
    for gid, name, sms, mem, bw, clock in db.rows(f"SELECT {select} FROM [{table}]"):
        gid = int(gid or 0)
        gpus.setdefault(gid, ev.GpuInfo(gid, str(name or "unknown GPU"), sms, mem, bw, clock))
    return tuple(gpus[k] for k in sorted(gpus))


def _read_meta(db: _Db) -> dict[str, str]:
    table = db.first_table(("META_DATA_EXPORT", "EXPORT_META_DATA"))
    if table is None or not {"name", "value"} <= db.columns(table):
        return {}
    return {str(n): str(v) for n, v in db.rows(f"SELECT name, value FROM [{table}]") if n is not None}


def load_nsys_sqlite(path: str | Path) -> ev.TraceData:
    """Read an nsys SQLite export. Raises GhsimError for anything unreadable."""
    path = Path(path)
    if not is_sqlite(path):
        raise GhsimError(f"{path}: not an SQLite database (expected an `nsys export --type sqlite` file)")
    try:
        db = _Db(path)
        try:
            return _load(db)
        finally:
            db.conn.close()
    except sqlite3.Error as e:
        raise GhsimError(f"{path}: corrupt or truncated SQLite database ({e})") from None
    except (ValueError, TypeError, OverflowError) as e:
        # A readable database whose cells are not what the schema promises.
        raise GhsimError(f"{path}: unexpected value in an nsys table ({e})") from None


def _load(db: _Db) -> ev.TraceData:
    kernel_table = db.first_table(KERNEL_TABLES)
    if kernel_table is None and MEMCPY_TABLE not in db.tables and MEMSET_TABLE not in db.tables:
        raise GhsimError(f"{db.path}: unknown schema: no kernel table (CUPTI_ACTIVITY_KIND_KERNEL) "
                         f"and no memcpy/memset tables; was the profile taken with --trace=cuda?")
    kernels = _read_kernels(db, kernel_table) if kernel_table else ev.make_kernels([], [], [], [], [])
    memcpys = _read_memcpys(db)
    um_rows = functools.cache(lambda: _um_counter_rows(db))  # read once, if at all
    if not memcpys["kind"].isin(ev.UM_DIRECTIONS).any() and _has_um_counters(db):
        memcpys = pd.concat([memcpys, _read_um_counter_copies(um_rows)], ignore_index=True)
        memcpys = memcpys.sort_values("start_ns", kind="stable").reset_index(drop=True)
    memsets = _read_memsets(db)
    if kernels.empty and memcpys.empty and memsets.empty:
        raise GhsimError(f"{db.path}: no GPU activity (no kernels, memcpys or memsets recorded)")
    nvtx = _read_nvtx(db)
    return ev.TraceData(
        source=str(db.path), format="nsys-sqlite",
        kernels=kernels, memcpys=memcpys, memsets=memsets,
        um_faults=_read_um_faults(db, um_rows), nvtx=nvtx, steps=ev.steps_from_nvtx(nvtx),
        memory=ev.make_memory([], [], [], []), gpus=_read_gpus(db), meta=_read_meta(db),
    )
