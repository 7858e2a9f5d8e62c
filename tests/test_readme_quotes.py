"""The outputs README.md and examples/README.md quote are what the commands print now
(examples/regenerate_readme.py writes them; issue 17 item 13). The cheap quotes are checked
on every run; the expensive ones (minutes) only when marked slow tests run with GHSIM_README_ALL=1."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "regenerate_readme.py"
spec = importlib.util.spec_from_file_location("regenerate_readme", SCRIPT)
regen = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = regen  # dataclasses look their module up there
spec.loader.exec_module(regen)


@pytest.mark.parametrize("quote", [q for q in regen.QUOTES if q.cheap], ids=lambda q: q.name)
def test_cheap_quotes_are_current(quote):
    assert regen.stale(quote) is None


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("GHSIM_README_ALL") != "1", reason="minutes: set GHSIM_README_ALL=1")
@pytest.mark.parametrize("quote", [q for q in regen.QUOTES if not q.cheap], ids=lambda q: q.name)
def test_expensive_quotes_are_current(quote):
    assert regen.stale(quote) is None


def test_every_quote_has_its_markers():
    for q in regen.QUOTES:
        assert regen.quoted(q) is not None


def test_a_stale_quote_is_caught(monkeypatch):
    first = next(q for q in regen.QUOTES if q.cheap)
    monkeypatch.setattr(regen, "run", lambda q: regen.quoted(q).replace("fits", "fits?", 1))
    assert "is stale" in regen.stale(first)
    monkeypatch.setattr(regen, "run", lambda q: regen.TIMINGS.sub("in 99.9 s", regen.quoted(q)))
    assert regen.stale(first) is None  # timings are masked
