"""Every hardware figure names its source; every catalog model has a sane shape."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROFILES = sorted((ROOT / "hardware_profiles").glob("*.toml"))
MODELS = sorted((ROOT / "models").glob("*.toml"))

REQUIRED_SECTIONS = (
    "gpu",
    "gpu.peak_tflops",
    "memory.hbm",
    "memory.host",
    "host_link",
    "unified_memory",
    "cpu",
    "gpu_link",
    "network",
    "launch",
)
MODEL_INT_KEYS = ("hidden_size", "intermediate_size", "num_layers", "num_attention_heads", "vocab_size")


def _load(path: Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def _walk(node: dict, prefix: str = ""):
    """Yield (dotted key, value) for every leaf; a {value, source} table is one leaf."""
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and "value" in value:
            yield dotted, value
        elif isinstance(value, dict):
            yield from _walk(value, dotted + ".")
        else:
            yield dotted, value


def _section(d: dict, dotted: str):
    node = d
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def test_there_are_profiles_and_models():
    names = {p.stem for p in PROFILES}
    assert {"gh200-96gb", "gh200-144gb", "h100-sxm", "h100-pcie", "h200-sxm"} <= names
    assert len(MODELS) >= 10


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_profile_every_number_is_sourced(path: Path):
    d = _load(path)
    assert d.get("name") == path.stem
    assert d.get("calibration") in {"h100", "h200", "a100"}, "calibration names a measured efficiency set"
    for section in REQUIRED_SECTIONS:
        assert isinstance(_section(d, section), dict), f"missing [{section}]"
    for key, value in _walk(d):
        if isinstance(value, dict):
            assert set(value) >= {"value", "source"}, f"{key}: needs value and source"
            v = value["value"]
            assert isinstance(v, (int, float)) and not isinstance(v, bool), f"{key}: value must be a number"
            assert v >= 0, f"{key}: negative"
            src = value["source"]
            assert isinstance(src, str) and src.strip(), f"{key}: empty source"
        elif isinstance(value, bool) or isinstance(value, str):
            continue
        else:
            pytest.fail(f"{path.name}: '{key}' = {value!r} is a bare number; write {{ value, source }}")


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_profile_peaks_are_positive(path: Path):
    peaks = _load(path)["gpu"]["peak_tflops"]
    for dtype in ("fp32", "tf32", "bf16", "fp16", "fp8"):
        assert peaks[dtype]["value"] > 0, dtype
    hbm = _load(path)["memory"]["hbm"]
    assert hbm["capacity_gb"]["value"] > 0 and hbm["bandwidth_gbps"]["value"] > 0


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_model_shape(path: Path):
    d = _load(path)
    assert d.get("name") == path.stem
    assert isinstance(d.get("source"), str) and d["source"].strip()
    for key in MODEL_INT_KEYS:
        v = d.get(key)
        assert isinstance(v, int) and not isinstance(v, bool) and v > 0, f"{key} = {v!r}"
    heads = d["num_attention_heads"]
    kv = d.get("num_kv_heads", heads)
    assert isinstance(kv, int) and kv > 0 and heads % kv == 0
    if "head_dim" in d:
        assert isinstance(d["head_dim"], int) and d["head_dim"] > 0
    else:
        assert d["hidden_size"] % heads == 0, "hidden_size must divide by num_attention_heads (or give head_dim)"
    assert d.get("mlp", "swiglu") in {"swiglu", "gelu"}
    assert d.get("norm", "rmsnorm") in {"rmsnorm", "layernorm"}
    assert d.get("position", "rope") in {"rope", "learned"}
    if "sliding_window" in d:
        assert isinstance(d["sliding_window"], int) and d["sliding_window"] > 0
        assert d.get("sliding_window_pattern") in {"all", "alternate"}
    if "moe" in d:
        m = d["moe"]
        for key in ("num_experts", "experts_per_token", "expert_intermediate_size"):
            assert isinstance(m.get(key), int) and m[key] > 0, key
        assert m["experts_per_token"] <= m["num_experts"]


def test_model_aliases_are_unique():
    seen: dict[str, str] = {}
    for path in MODELS:
        for alias in [path.stem, *_load(path).get("aliases", [])]:
            assert alias not in seen, f"{alias} in {path.name} and {seen[alias]}"
            seen[alias] = path.name
    assert "llama-70b" in seen
