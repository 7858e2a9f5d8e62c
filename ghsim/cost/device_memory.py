"""What nvidia-smi shows for a GPU's memory, from the allocated peak ghsim predicts.

ghsim's memory replay predicts the peak of live tensors (torch.cuda.max_memory_allocated). Published
runs often report nvidia-smi's memory.used instead: the device total, which adds what the caching
allocator holds beyond live tensors and the CUDA context. Comparing one with the other mixes two
quantities, so a measurement of that kind is compared with this (figures and their sources:
hardware_profiles/calibration/device_memory.toml). NCCL's buffers are left out: no per-communicator
figure that holds across GPUs was found (the table says why).
"""

from __future__ import annotations

from functools import lru_cache

from ghsim.tomlio import read_toml, repo_root, sourced

TABLE = repo_root() / "hardware_profiles" / "calibration" / "device_memory.toml"


@lru_cache(maxsize=4)
def _figure(section: str, key: str) -> float:
    return sourced(read_toml(TABLE).get(section, {}), key, f"{TABLE} [{section}]")


def device_total_bytes(allocated_peak_bytes: float) -> float:
    """nvidia-smi memory.used at a step's allocated peak: caching-allocator reserve + CUDA context."""
    return allocated_peak_bytes * _figure("caching_allocator", "reserve_ratio") + _figure("cuda_context", "context_bytes")
