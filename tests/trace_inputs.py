"""Where the trace tests find real traces written by other people.

In order: $GHSIM_SHARED_TRACES, ../shared/traces (the shared folder cloned beside the repo),
then tests/data/traces, which commits a small sample: the Pipit SAXPY nsys export with the
tables ghsim does not read dropped (MIT, see its README), so the nsys tests always run. A
trace found nowhere skips its test with a reason that says what it needs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SHARED = Path(os.environ.get("GHSIM_SHARED_TRACES", HERE.parent.parent / "shared" / "traces"))
COMMITTED = HERE / "data" / "traces"
NEEDS = (f"needs the shared traces: clone the shared/ folder beside the repo ({SHARED}) "
         f"or set GHSIM_SHARED_TRACES to a folder holding them")


def find(name: str) -> Path | None:
    for folder in (SHARED, COMMITTED):
        if (folder / name).exists():
            return folder / name
    return None


def trace_path(name: str) -> Path:
    """The path of a real trace, or a skip naming what is missing and how to get it."""
    path = find(name)
    if path is None:
        pytest.skip(f"{name}: {NEEDS}")
    return path
