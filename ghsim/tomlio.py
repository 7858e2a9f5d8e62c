"""Read TOML and JSON input files and write output files, turning every failure into a GhsimError."""

from __future__ import annotations

import copy
import functools
import json
import os
import math
import tomllib
from pathlib import Path
from typing import Any

from ghsim.errors import GhsimError


def _refuse_non_finite(token: str) -> float:
    """TOML's nan/inf and JSON's NaN/Infinity: no ghsim input may be one (a NaN step time
    would print as a number and make JSON that is not JSON)."""
    raise ValueError(f"{token} is not a finite number")


@functools.lru_cache(maxsize=256)
def _parsed(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    with open(path, "rb") as f:
        return tomllib.load(f, parse_float=_finite_toml_float)


def _finite_toml_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        _refuse_non_finite(text)
    return value


def read_toml(path: Path) -> dict[str, Any]:
    """The file's tables (a fresh copy: callers may change it). Parsed once per version of the file:
    one command reads every hardware profile and model file to name node kinds and models, and
    parsing them each time cost more than simulating the step."""
    try:
        st = os.stat(path)
        return copy.deepcopy(_parsed(str(path), st.st_mtime_ns, st.st_size))
    except FileNotFoundError:
        raise GhsimError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise GhsimError(f"{path}: malformed TOML: {e}") from None
    except ValueError as e:  # a nan or inf value
        raise GhsimError(f"{path}: {e}") from None
    except UnicodeDecodeError:
        raise GhsimError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise GhsimError(f"{path}: cannot read: {e.strerror or e}") from None


def read_json(path: Path) -> Any:
    try:
        with open(path, "rb") as f:
            return json.load(f, parse_constant=_refuse_non_finite)
    except FileNotFoundError:
        raise GhsimError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GhsimError(f"{path}: malformed JSON: {e}") from None
    except ValueError as e:  # NaN or Infinity
        raise GhsimError(f"{path}: {e}") from None
    except RecursionError:
        raise GhsimError(f"{path}: JSON nested too deeply") from None
    except OSError as e:
        raise GhsimError(f"{path}: cannot read: {e.strerror or e}") from None


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
