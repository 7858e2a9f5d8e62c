"""What torchao's float8 training costs beyond its GEMMs: the eager dynamic casts' measured rates (one
PyTorch op per step of amax, scale and cast) and the rowwise recipe's scaled-GEMM rate relative to
tensorwise (hardware_profiles/calibration/fp8_casts.toml)."""

from __future__ import annotations

from functools import lru_cache

from ghsim.graph.torchao_fp8 import CAST
from ghsim.tomlio import read_toml, repo_root, sourced

TABLE = repo_root() / "hardware_profiles" / "calibration" / "fp8_casts.toml"


@lru_cache(maxsize=32)
def _figure(section: str, key: str) -> float:
    return sourced(read_toml(TABLE).get(section, {}), key, f"{TABLE} [{section}]")


def cast_rate(variant: str, hbm_Bps: float) -> float:
    """Bytes per second (ideal bytes) of a cast variant on a part with `hbm_Bps` of HBM bandwidth."""
    recipe, src = variant[len(CAST):].split(":")
    return _figure("eager", f"{recipe}_{src}_Bps") * hbm_Bps / _figure("measured_on", "hbm_Bps")


def rowwise_gemm_factor() -> float:
    """A rowwise-scaled FP8 GEMM's time over a tensorwise one's at the same shape."""
    return _figure("gemm", "rowwise_over_tensorwise")
