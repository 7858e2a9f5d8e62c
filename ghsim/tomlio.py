"""Read TOML and JSON input files and write output files, turning every failure into a GhsimError."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from ghsim.errors import GhsimError


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise GhsimError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise GhsimError(f"{path}: malformed TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise GhsimError(f"{path}: cannot read: {e}") from None


def read_json(path: Path) -> Any:
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except FileNotFoundError:
        raise GhsimError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GhsimError(f"{path}: malformed JSON: {e}") from None
    except OSError as e:
        raise GhsimError(f"{path}: cannot read: {e}") from None


def write_text(path: Path | str, text: str) -> Path:
    """Write a file; an unwritable path (or a missing folder) is a one-line error."""
    path = Path(path)
    try:
        path.write_text(text)
    except OSError as e:
        raise GhsimError(f"{path}: cannot write: {e.strerror or e}") from None
    return path


def sourced(table: dict[str, Any], key: str, where: str) -> float:
    """The value of a sourced number `{value = x, source = "..."}` (a bare number is refused)."""
    if key not in table:
        raise GhsimError(f"{where}: missing field '{key}'")
    entry = table[key]
    if not isinstance(entry, dict) or "value" not in entry or not entry.get("source"):
        raise GhsimError(f"{where}: field '{key}' must be {{ value = ..., source = \"...\" }}")
    value = entry["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GhsimError(f"{where}: field '{key}' value must be a number, got {value!r}")
    return float(value)


def repo_root() -> Path:
    """The checkout holding models/ and hardware_profiles/ (ghsim is installed editable)."""
    return Path(__file__).resolve().parent.parent
