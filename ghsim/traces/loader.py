"""Pick the importer for a trace file from its first bytes, not its name."""

from __future__ import annotations

from pathlib import Path

from ghsim.errors import GhsimError
from ghsim.traces.events import TraceData
from ghsim.traces.kineto import GZIP_MAGIC, XZ_MAGIC, load_kineto
from ghsim.traces.nsys import SQLITE_MAGIC, load_nsys_sqlite
from ghsim.traces.nsys_csv import load_nsys_csv, looks_like_stats_csv

NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


def load_trace(path: str | Path) -> TraceData:
    """Read an nsys SQLite export, an `nsys stats` CSV or a PyTorch profiler trace.

    Raises GhsimError (one line, naming the file) for anything else.
    """
    path = Path(path)
    if not path.exists():
        raise GhsimError(f"{path}: no such file")
    if path.is_dir():
        raise GhsimError(f"{path}: is a directory, expected a trace file")
    if path.suffix in NSYS_REPORT_SUFFIXES:
        raise GhsimError(f"{path}: binary Nsight Systems report; convert it first with "
                         f"`nsys export --type sqlite {path.name}`")
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise GhsimError(f"{path}: cannot read ({e.strerror})") from None
    if not head:
        raise GhsimError(f"{path}: empty file")
    if head.startswith(SQLITE_MAGIC):
        return load_nsys_sqlite(path)
    if head.startswith(GZIP_MAGIC) or head.startswith(XZ_MAGIC):
        return load_kineto(path)
    text = head.decode("latin-1").lstrip("\xef\xbb\xbf \t\r\n")
    if text[:1] in ("{", "["):
        return load_kineto(path)
    if looks_like_stats_csv(text):
        return load_nsys_csv(path)
    if path.suffix in (".sqlite", ".db"):
        raise GhsimError(f"{path}: not an SQLite database (expected an `nsys export --type sqlite` file)")
    raise GhsimError(f"{path}: unrecognised trace format (expected an nsys SQLite export, an `nsys stats` "
                     f"CSV, or a PyTorch profiler JSON trace, optionally gzip- or xz-compressed)")
