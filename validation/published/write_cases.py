"""Write a published folder's runnable cases, one cases/<name>/case.toml each (used by its make_cases.py)."""

from __future__ import annotations

from pathlib import Path


def write_cases(folder: Path, cases: dict[str, str]) -> None:
    for name, text in cases.items():
        path = folder / "cases" / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "case.toml").write_text(text)
