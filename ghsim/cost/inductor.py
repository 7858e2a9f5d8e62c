"""What torch.compile's fused regions cost: one measured curve (fixed time + bytes / rate) per
region kind, microbenchmarked compiled on one GPU (hardware_profiles/calibration/inductor_regions.toml,
each figure sourced) and carried to another part by the ratio of HBM bandwidths, as the other
memory-bound curves are (cost/compute.py)."""

from __future__ import annotations

from functools import lru_cache

from ghsim.tomlio import read_toml, repo_root, sourced

TABLE = repo_root() / "hardware_profiles" / "calibration" / "inductor_regions.toml"


@lru_cache(maxsize=64)
def region_curve(region: str) -> tuple[float, float] | None:
    """(fixed seconds, bytes per second at the measuring GPU's HBM bandwidth) of a region kind,
    or None where none was measured."""
    table = read_toml(TABLE).get(region)
    if table is None:
        return None
    where = f"{TABLE} [{region}]"
    return sourced(table, "fixed_s", where), sourced(table, "rate_Bps", where)


@lru_cache(maxsize=1)
def measured_hbm_Bps() -> float:
    """HBM bandwidth of the GPU the regions were measured on (its profile's figure)."""
    return sourced(read_toml(TABLE).get("measured_on", {}), "hbm_Bps", f"{TABLE} [measured_on]")
