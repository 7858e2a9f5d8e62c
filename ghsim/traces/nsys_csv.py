"""`nsys stats --format csv` reports -> an aggregate-only TraceData.

Reads cuda_gpu_kern_sum, cuda_gpu_mem_time_sum and cuda_gpu_mem_size_sum
(and the pre-2023 names gpukernsum, gpumemtimesum, gpumemsizesum), whether
as separate files (`nsys stats -o PREFIX` writes PREFIX_<report>.csv; the
sibling reports of the file given are read too) or concatenated in one
stdout capture with "** ... (report):" banners between them.

Columns are found by name, units from the header ("Total Time (ns)",
"Total (MB)"; old size reports are in KiB without a unit). These reports
are totals per kernel name / copy kind: there is no timeline, so a summary
of them has no busy fraction, idle gaps, steps or windows.
"""

from __future__ import annotations

import csv
import math
import io
import re
from dataclasses import dataclass
from pathlib import Path

from ghsim.errors import GhsimError
from ghsim.traces import events as ev

REPORTS = ("cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum",
           "gpukernsum", "gpumemtimesum", "gpumemsizesum")

_TIME_UNITS = {"ns": 1, "us": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_SIZE_UNITS = {"b": 1, "kb": 1_000, "mb": 1_000_000, "gb": 1_000_000_000,
               "kib": 1024, "mib": 1 << 20, "gib": 1 << 30}
_UNIT = re.compile(r"^(.*?)\s*\(([^)]*)\)\s*$")

# "[CUDA memcpy Host-to-Device]" (2023+) or "[CUDA memcpy HtoD]" (older).
_OPERATION_KINDS = {
    "host-to-device": "HtoD", "htod": "HtoD", "device-to-host": "DtoH", "dtoh": "DtoH",
    "device-to-device": "DtoD", "dtod": "DtoD", "peer-to-peer": "PtoP", "ptop": "PtoP",
    "host-to-host": "HtoH", "htoh": "HtoH",
}


@dataclass
class _Table:
    header: list[str]
    rows: list[list[str]]
    line: int


def _split_tables(text: str) -> list[_Table]:
    """CSV blocks separated by blank lines or banner lines."""
    tables, block, start = [], [], 0
    lines = text.splitlines()
    for i, line in enumerate(lines + [""]):
        stripped = line.strip()
        if not stripped or stripped.startswith("**") or stripped.startswith("Processing [") \
                or stripped.startswith("SKIPPED") or stripped.startswith("WARNING") or stripped.startswith("NOTICE"):
            if block:
                parsed = list(csv.reader(io.StringIO("\n".join(block))))
                if parsed and len(parsed[0]) > 1:
                    tables.append(_Table([h.strip() for h in parsed[0]], parsed[1:], start + 1))
            block = []
            continue
        if not block:
            start = i
        block.append(line)
    return tables


def _column(header: list[str], *names: str) -> tuple[int, str] | None:
    """Index and unit of the first column whose name (unit stripped) is one of names."""
    for i, h in enumerate(header):
        m = _UNIT.match(h)
        base, unit = (m.group(1), m.group(2)) if m else (h, "")
        if base.strip().lower() in names:
            return i, unit.strip().lower()
    return None


def _number(text: str, where: str) -> float:
    t = text.strip().replace("\u202f", "").replace(" ", "")
    if t.count(",") == 1 and "." not in t:
        t = t.replace(",", ".")  # a decimal comma from a non-English locale
    else:
        t = t.replace(",", "")   # thousands separators
    try:
        v = float(t)
    except ValueError:
        raise GhsimError(f"{where}: not a number: {text!r:.40}") from None
    if not math.isfinite(v):
        raise GhsimError(f"{where}: not a finite number: {text!r:.40}")
    return v


_CELL_LIMIT = 1e18  # ns, bytes or counts: beyond it a cell is damaged (int64 holds 9.2e18)


def _non_negative(text: str, where: str, row: int, scale: float = 1) -> float:
    """A time, size or count in its unit (times `scale`): a negative or absurd one is a damaged
    export, not a number to add."""
    v = _number(text, where)
    if v < 0:
        raise GhsimError(f"{where}: row {row}: negative value {text.strip()!r:.40} (a time, size or count)")
    if v * scale > _CELL_LIMIT:
        raise GhsimError(f"{where}: row {row}: implausible value {text.strip()!r:.40}")
    return v * scale


def _kind(operation: str) -> str:
    op = operation.strip().strip('"').lower()
    if "memset" in op:
        return "memset"
    m = re.search(r"memcpy\s+([\w-]+)", op.replace("unified ", ""))
    kind = _OPERATION_KINDS.get(m.group(1), "other") if m else "other"
    if "unified" in op and kind in ("HtoD", "DtoH", "DtoD"):
        return "UM_" + kind
    return kind


def _classify(table: _Table) -> str | None:
    h = table.header
    if _column(h, "name") and _column(h, "total time") and _column(h, "instances"):
        return "kern"
    if _column(h, "operation") and _column(h, "total time"):
        return "mem_time"
    if _column(h, "operation") and _column(h, "total"):
        return "mem_size"
    return None


def _files(path: Path) -> list[Path]:
    """The file given, plus its sibling reports when named PREFIX_<report>.csv."""
    for report in REPORTS:
        if path.stem.endswith("_" + report):
            prefix = path.stem[: -len(report)]
            siblings = [path.with_name(prefix + r + path.suffix) for r in REPORTS]
            return [path] + [s for s in siblings if s != path and s.exists()]
    return [path]


def looks_like_stats_csv(head: str) -> bool:
    h = head.lower()
    return ("total time" in h and ("instances" in h or "operation" in h)) or ("operation" in h and "total" in h)


def load_nsys_csv(path: str | Path) -> ev.TraceData:
    path = Path(path)
    kern_rows: dict[str, list[int]] = {}        # name -> [total ns, instances]
    mem: dict[str, list[float]] = {}            # kind -> [bytes, ns, count by time, count by size]
    seen = set()
    for file in _files(path):
        try:
            text = file.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise GhsimError(f"{file}: cannot read ({e.strerror})") from None
        try:
            tables = _split_tables(text)
        except csv.Error as e:  # e.g. a field longer than the csv module allows: not an nsys report
            raise GhsimError(f"{file}: malformed CSV ({e})") from None
        for table in tables:
            what = _classify(table)
            if what is None:
                continue
            seen.add(what)
            where = f"{file}, table at line {table.line}"
            if what == "kern":
                _read_kernels(table, where, kern_rows)
            else:
                _read_memops(table, where, what, mem)
    if not seen:
        raise GhsimError(f"{path}: no nsys stats table found (expected cuda_gpu_kern_sum, cuda_gpu_mem_time_sum "
                         f"or cuda_gpu_mem_size_sum CSV, or their older names gpukernsum/gpumemtimesum/gpumemsizesum)")
    return _assemble(path, kern_rows, mem, seen)


def _read_kernels(table: _Table, where: str, out: dict[str, list[int]]) -> None:
    name_i, _ = _column(table.header, "name")
    time_i, unit = _column(table.header, "total time")
    inst_i, _ = _column(table.header, "instances")
    scale = _TIME_UNITS.get(unit or "ns")
    if scale is None:
        raise GhsimError(f"{where}: unknown time unit '{unit}'")
    for n, row in enumerate(table.rows, start=1):
        if len(row) <= max(name_i, time_i, inst_i):
            raise GhsimError(f"{where}: row {n} has {len(row)} columns, header has {len(table.header)}")
        entry = out.setdefault(row[name_i], [0, 0])
        entry[0] += int(round(_non_negative(row[time_i], where, n, scale)))
        entry[1] += int(_non_negative(row[inst_i], where, n))


def _read_memops(table: _Table, where: str, what: str, out: dict[str, list[float]]) -> None:
    op_i, _ = _column(table.header, "operation")
    count = _column(table.header, "count", "operations")
    if what == "mem_time":
        val_i, unit = _column(table.header, "total time")
        scale, slot = _TIME_UNITS.get(unit or "ns"), 1
    else:
        val_i, unit = _column(table.header, "total")
        scale, slot = _SIZE_UNITS.get(unit or "kib"), 0  # unit-less size reports were KiB
    if scale is None:
        raise GhsimError(f"{where}: unknown unit '{unit}'")
    for n, row in enumerate(table.rows, start=1):
        if len(row) <= max(op_i, val_i):
            raise GhsimError(f"{where}: row {n} has {len(row)} columns, header has {len(table.header)}")
        entry = out.setdefault(_kind(row[op_i]), [0.0, 0.0, 0.0, 0.0])
        entry[slot] += _non_negative(row[val_i], where, n, scale)
        if count is not None and len(row) > count[0]:
            entry[2 if what == "mem_time" else 3] += _non_negative(row[count[0]], where, n)


def _assemble(path: Path, kern_rows, mem, seen) -> ev.TraceData:
    if not kern_rows and not mem:
        raise GhsimError(f"{path}: no GPU activity (the nsys stats tables are empty)")
    names = list(kern_rows)
    kernels = ev.make_kernels(names, [0] * len(names), [kern_rows[n][0] for n in names],
                              [0] * len(names), [0] * len(names), [kern_rows[n][1] for n in names])
    copies = {k: v for k, v in mem.items() if k != "memset"}
    kinds = list(copies)
    memcpys = ev.make_memcpys(kinds, [int(round(copies[k][0])) for k in kinds], [0] * len(kinds),
                              [int(round(copies[k][1])) for k in kinds], [0] * len(kinds), [0] * len(kinds),
                              count=[int(copies[k][2] or copies[k][3]) for k in kinds])
    ms = mem.get("memset")
    memsets = ev.make_memsets([int(round(ms[0]))] if ms else [], [0] if ms else [], [int(round(ms[1]))] if ms else [],
                              [0] if ms else [], [0] if ms else [], [int(ms[2] or ms[3])] if ms else [])
    parts = ev.empty_trace_parts()
    missing = [r for r, key in (("kernel summary", "kern"), ("memops by time", "mem_time"),
                                ("memops by size", "mem_size")) if key not in seen]
    meta = {"reports": ",".join(sorted(seen))}
    if missing:
        meta["missing"] = ", ".join(missing)
    return ev.TraceData(
        source=str(path), format="nsys-stats-csv", kernels=kernels, memcpys=memcpys, memsets=memsets,
        um_faults=parts["um_faults"], nvtx=parts["nvtx"], steps=parts["steps"], memory=parts["memory"],
        has_timeline=False, meta=meta,
    )
