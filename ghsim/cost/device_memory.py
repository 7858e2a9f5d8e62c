"""What nvidia-smi shows for a GPU's memory, from the allocated peak ghsim predicts.

ghsim's memory replay predicts the peak of live tensors (torch.cuda.max_memory_allocated). Published
runs often report nvidia-smi's memory.used instead: the device total, which adds what the caching
allocator holds beyond live tensors, the CUDA context and NCCL's buffers. Comparing one with the other
mixes two quantities, so a measurement of that kind is compared with this (figures and their sources:
hardware_profiles/calibration/device_memory.toml).
"""

from __future__ import annotations

from functools import lru_cache

from ghsim.graph.collectives import Group
from ghsim.graph.ops import Resource
from ghsim.tomlio import read_toml, repo_root, sourced

TABLE = repo_root() / "hardware_profiles" / "calibration" / "device_memory.toml"


@lru_cache(maxsize=16)
def _figure(section: str, key: str) -> float:
    return sourced(read_toml(TABLE).get(section, {}), key, f"{TABLE} [{section}]")


def device_total_bytes(allocated_peak_bytes: float, nccl_bytes: float = 0.0) -> float:
    """nvidia-smi memory.used at a step's allocated peak: caching-allocator reserve + CUDA context
    + NCCL's buffers (`nccl_bytes`: nccl_buffer_bytes of the plan's communicators)."""
    return (allocated_peak_bytes * _figure("caching_allocator", "reserve_ratio")
            + _figure("cuda_context", "context_bytes") + nccl_bytes)


def _ring_bytes(group: Group) -> float:
    """One rank's FIFOs for a ring communicator: per channel one receiving and one sending connection.
    Within a node (NVLink) the receiver holds all three protocols' FIFOs; across nodes (GPUDirect RDMA)
    the receiver holds all three and the sender LL128 + Simple (LL in host memory)."""
    if group.size < 2:
        return 0.0
    ll, ll128, simple = (_figure("nccl", k) for k in ("ll_buffer_bytes", "ll128_buffer_bytes", "simple_buffer_bytes"))
    if group.nodes == 1:
        return _figure("nccl", "nvlink_ring_channels") * (ll + ll128 + simple)
    return _figure("nccl", "net_ring_channels") * ((ll + ll128 + simple) + (ll128 + simple))


def _p2p_bytes(group: Group) -> float:
    """Pipeline send/recv: a FIFO of NCCL_STEPS (8) chunks per channel, each way, to each neighbouring stage
    (NCCL src/include/device.h line 26, as device_memory.toml's p2p chunk figures cite it)."""
    if group.size < 2:
        return 0.0
    chunk = _figure("nccl", "p2p_nvlink_chunk_bytes" if group.nodes == 1 else "p2p_net_chunk_bytes")
    peers = 2 if group.size > 2 else 1  # the stages before and after (the first and last have one)
    return peers * 2 * _figure("nccl", "p2p_channels_per_peer") * 8 * chunk


def nccl_buffer_bytes(groups: dict[str, Group]) -> float:
    """NCCL's device buffers of one rank, over the communicators the plan creates (graph/parallel.Layout.groups):
    rings for the tensor- and data-parallel groups, send/recv FIFOs for the pipeline. Not counted: the
    expert-parallel all-to-all's per-peer FIFOs (no figure per peer was checked)."""
    return (sum(_ring_bytes(groups[name]) for name in (Resource.TP, Resource.DP) if name in groups)
            + (_p2p_bytes(groups[Resource.PP]) if Resource.PP in groups else 0.0))
