"""Host time the training libraries spend outside kernels, measured per module
(hardware_profiles/calibration/library_overheads.toml, each figure sourced)."""

from __future__ import annotations

from functools import lru_cache

from ghsim.tomlio import read_toml, repo_root, sourced

TABLE = repo_root() / "hardware_profiles" / "calibration" / "library_overheads.toml"


@lru_cache(maxsize=1)
def sdpa_fallback_rate() -> float:
    """PyTorch SDPA's rate at a head dimension its cuDNN kernels do not take, relative to theirs."""
    t = read_toml(TABLE).get("pytorch_sdpa", {})
    return sourced(t, "fallback_rate", f"{TABLE} [pytorch_sdpa]")


@lru_cache(maxsize=1)
def zero3_hook_seconds() -> tuple[float, float]:
    """DeepSpeed ZeRO-3's host seconds per module with parameters: (forward, backward)."""
    t = read_toml(TABLE).get("deepspeed_zero3", {})
    where = f"{TABLE} [deepspeed_zero3]"
    return sourced(t, "hook_fwd_s", where), sourced(t, "hook_bwd_s", where)
