"""Hardware: one GPU part and the node around it, from hardware_profiles/*.toml.

Every figure in a profile is a sourced number (see docs/formats.md); here they
are converted to SI units (bytes, bytes/s, FLOP/s, seconds).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ghsim.errors import GhsimError
from ghsim.tomlio import read_toml, repo_root, sourced

PROFILES_DIR = repo_root() / "hardware_profiles"
GB = 1e9
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class MemoryTier:
    name: str  # "hbm" | "host"
    kind: str  # HBM3, HBM3e, LPDDR5X, DDR5
    capacity_bytes: float
    bandwidth: float  # bytes/s


@dataclass(frozen=True)
class HostLink:
    kind: str  # pcie-gen5-x16 | nvlink-c2c
    h2d_pinned: float  # bytes/s
    d2h_pinned: float
    h2d_pageable: float
    d2h_pageable: float
    bidirectional_total: float
    latency_s: float
    gpu_reads_host_in_place: bool
    in_place_read: float
    gpus_sharing: int

    @property
    def is_c2c(self) -> bool:
        return self.kind.startswith("nvlink-c2c")


@dataclass(frozen=True)
class UnifiedMemory:
    supported: bool
    page_size_bytes: float
    fault_batch_latency_s: float
    migration: float  # bytes/s
    access_in_place: bool


@dataclass(frozen=True)
class Cpu:
    model: str
    cores: int
    adamw_params_per_s: float
    page_size_kb: float = 4.0  # the OS's base page: what a first touch of fresh host memory faults in


@dataclass(frozen=True)
class Link:
    kind: str
    bandwidth: float  # bytes/s per GPU per direction
    latency_s: float
    per_peer: float = 0.0  # bytes/s between one GPU pair on a switchless mesh (0: any pair gets `bandwidth`)


@dataclass(frozen=True)
class Hardware:
    name: str
    description: str
    calibration: str
    gpu_model: str
    sm_count: int
    peak_flops: dict[str, float]  # dense FLOP/s by dtype
    hbm: MemoryTier
    host: MemoryTier
    host_link: HostLink
    unified_memory: UnifiedMemory
    cpu: Cpu
    gpu_link: Link
    gpus_per_node: int
    network: Link
    kernel_launch_s: float
    cuda_graph_kernel_s: float
    price_per_gpu_hour: float
    # host seconds per launched op relative to the calibration's (x86) host: Grace's launch path
    host_path_factor: float = 1.0
    # host seconds per tensor-parallel collective call (torch.distributed on the training thread);
    # 0: no measurement for this host, the call is not priced
    tp_collective_call_s: float = 0.0
    source_file: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # what the user said about their host (--host-cores, --host-memory-gb) as profile overrides: a
    # node of the same superchip that node_profile_for picks instead carries them too
    user_overrides: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "gpu": self.gpu_model,
            "hbm_capacity_bytes": self.hbm.capacity_bytes,
            "hbm_bandwidth_Bps": self.hbm.bandwidth,
            "host_capacity_bytes": self.host.capacity_bytes,
            "host_link": self.host_link.kind,
            "peak_tflops": {k: v / 1e12 for k, v in self.peak_flops.items()},
            "calibration": self.calibration,
        }


def _table(d: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    t = d.get(key)
    if not isinstance(t, dict):
        raise GhsimError(f"{where}: missing table [{key}]")
    return t


def _bool(d: dict[str, Any], key: str, where: str, default: bool | None = None) -> bool:
    v = d.get(key, default)
    if not isinstance(v, bool):
        raise GhsimError(f"{where}: '{key}' must be true or false")
    return v


@dataclass(frozen=True)
class _Profile:
    """Reads sourced, non-negative figures of one profile file (`where`, for the error messages)."""

    where: str

    def figure(self, t: dict[str, Any], key: str, section: str) -> float:
        v = sourced(t, key, f"{self.where} [{section}]")
        if v < 0:
            raise GhsimError(f"{self.where} [{section}]: '{key}' must not be negative")
        return v

    def optional(self, t: dict[str, Any], key: str, section: str) -> float:
        """A figure the profile may leave out (0 then)."""
        return self.figure(t, key, section) if key in t else 0.0


def hardware_from_dict(d: dict[str, Any], where: str) -> Hardware:
    gpu = _table(d, "gpu", where)
    peaks = _table(gpu, "peak_tflops", where + " [gpu]")
    mem = _table(d, "memory", where)
    hbm_t = _table(mem, "hbm", where + " [memory]")
    host_t = _table(mem, "host", where + " [memory]")
    link_t = _table(d, "host_link", where)
    um_t = _table(d, "unified_memory", where)
    cpu_t = _table(d, "cpu", where)
    gl_t = _table(d, "gpu_link", where)
    net_t = _table(d, "network", where)
    launch_t = _table(d, "launch", where)
    f = _Profile(where)
    peak_flops = {dt: f.figure(peaks, dt, "gpu.peak_tflops") * 1e12 for dt in DTYPES}
    if any(v <= 0 for v in peak_flops.values()):
        raise GhsimError(f"{where} [gpu.peak_tflops]: every peak must be positive")
    gpus_per_node = _count(gl_t, "gpus_per_node", f"{where} [gpu_link]")
    price = d.get("price_per_gpu_hour_usd")
    return Hardware(
        name=str(d.get("name", Path(where).stem)),
        description=str(d.get("description", "")),
        calibration=str(d.get("calibration", "")),
        gpu_model=str(gpu.get("model", "")),
        sm_count=int(f.figure(gpu, "sm_count", "gpu")),
        peak_flops=peak_flops,
        hbm=_memory_tier(f, "hbm", hbm_t, "HBM"),
        host=_memory_tier(f, "host", host_t, "DRAM"),
        host_link=_host_link(f, link_t),
        unified_memory=_unified_memory(f, um_t),
        cpu=Cpu(
            model=str(cpu_t.get("model", "")),
            cores=int(f.figure(cpu_t, "cores", "cpu")),
            adamw_params_per_s=f.figure(cpu_t, "adamw_params_per_s", "cpu"),
            page_size_kb=_defaulted(f, cpu_t, "page_size_kb", "cpu", 4.0, lambda v: 1 <= v < math.inf,
                                    "at least 1 (KiB)"),
        ),
        gpu_link=_link(f, gl_t, "gpu_link", per_peer=True),
        gpus_per_node=gpus_per_node,
        network=_link(f, net_t, "network", per_peer=False),
        kernel_launch_s=f.figure(launch_t, "kernel_launch_us", "launch") * 1e-6,
        cuda_graph_kernel_s=f.figure(launch_t, "cuda_graph_kernel_us", "launch") * 1e-6,
        host_path_factor=_defaulted(f, launch_t, "host_path_factor", "launch", 1.0, lambda v: 0 < v < math.inf,
                                    "a positive finite number"),
        tp_collective_call_s=_defaulted(f, launch_t, "tp_collective_call_us", "launch", 0.0,
                                        lambda v: 0 <= v < math.inf, "a non-negative finite number (us)") * 1e-6,
        price_per_gpu_hour=(
            sourced(d, "price_per_gpu_hour_usd", where) if price is not None else 0.0
        ),
        source_file=where,
        raw=d,
    )


def _defaulted(f: _Profile, t: dict[str, Any], key: str, section: str, default: float,
               valid: Callable[[float], bool], must: str) -> float:
    """A figure the profile may leave out (`default` then: x86 Linux's 4 KiB page, the calibration
    host's launch path, no price for an unmeasured host cost), refused when it is not `valid`."""
    if key not in t:
        return default
    v = f.figure(t, key, section)
    if not valid(v):
        raise GhsimError(f"{f.where} [{section}]: '{key}' must be {must}")
    return v


def _memory_tier(f: _Profile, name: str, t: dict[str, Any], default_kind: str) -> MemoryTier:
    section = f"memory.{name}"
    return MemoryTier(name, str(t.get("kind", default_kind)), f.figure(t, "capacity_gb", section) * GB,
                      f.figure(t, "bandwidth_gbps", section) * GB)


def _host_link(f: _Profile, t: dict[str, Any]) -> HostLink:
    def gbps(key: str) -> float:
        return f.figure(t, key, "host_link") * GB

    return HostLink(
        kind=str(t.get("kind", "pcie")),
        h2d_pinned=gbps("h2d_pinned_gbps"),
        d2h_pinned=gbps("d2h_pinned_gbps"),
        h2d_pageable=gbps("h2d_pageable_gbps"),
        d2h_pageable=gbps("d2h_pageable_gbps"),
        bidirectional_total=gbps("bidirectional_total_gbps"),
        latency_s=f.figure(t, "latency_us", "host_link") * 1e-6,
        gpu_reads_host_in_place=_bool(t, "gpu_reads_host_in_place", f.where, False),
        in_place_read=f.optional(t, "in_place_read_gbps", "host_link") * GB,
        gpus_sharing=_count(t, "gpus_sharing_host_link", f"{f.where} [host_link]"),
    )


def _unified_memory(f: _Profile, t: dict[str, Any]) -> UnifiedMemory:
    return UnifiedMemory(
        supported=_bool(t, "supported", f.where, False),
        page_size_bytes=f.figure(t, "page_size_kb", "unified_memory") * 1024,
        fault_batch_latency_s=f.figure(t, "fault_batch_latency_us", "unified_memory") * 1e-6,
        migration=f.figure(t, "migration_gbps", "unified_memory") * GB,
        access_in_place=_bool(t, "access_in_place", f.where, False),
    )


def _link(f: _Profile, t: dict[str, Any], section: str, per_peer: bool) -> Link:
    """A GPU-to-GPU link: within a node (`per_peer`: its per-peer bandwidth, when given) or the network."""
    return Link(
        kind=str(t.get("kind", "")),
        bandwidth=f.figure(t, "bandwidth_gbps", section) * GB,
        latency_s=f.figure(t, "latency_us", section) * 1e-6,
        per_peer=f.optional(t, "per_peer_bandwidth_gbps", section) * GB if per_peer else 0.0,
    )


def apply_overrides(d: dict[str, Any], overrides: dict[str, Any], where: str) -> dict[str, Any]:
    """A copy of profile dict `d` with dotted-key overrides ("cpu.cores" = {value, source})."""
    out = copy.deepcopy(d)
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node = out
        for p in parents:
            if not isinstance(node.get(p), dict):
                raise GhsimError(f"{where}: override '{dotted}' names no section of the profile")
            node = node[p]
        if leaf not in node:
            raise GhsimError(f"{where}: override '{dotted}' names no field of the profile")
        node[leaf] = value
    return out


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml"))


def load_hardware(name_or_path: str, overrides: dict[str, Any] | None = None) -> Hardware:
    """A profile name (`ghsim hardware` lists them) or a path to a profile TOML."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = PROFILES_DIR / f"{name_or_path}.toml"
        if not path.exists():
            raise GhsimError(
                f"unknown hardware '{name_or_path}' (known: {', '.join(profile_names())}; "
                "or pass a path to a profile .toml)"
            )
    d = read_toml(path)
    if not overrides:
        return hardware_from_dict(d, str(path))
    hw = hardware_from_dict(apply_overrides(d, overrides, str(path)), str(path))
    return replace(hw, user_overrides=dict(overrides))


def _count(table: dict[str, Any], key: str, where: str) -> int:
    """A sourced topology count `{ value = n, source = "..." }` (1 when the profile leaves it out)."""
    if key not in table:
        return 1
    v = sourced(table, key, where)
    if v != int(v) or v < 1:
        raise GhsimError(f"{where}: '{key}' must be a positive integer")
    return int(v)


@dataclass(frozen=True)
class NodeChoice:
    """The profile a plan runs on once its --gpus-per-node is read, and the one line that says why."""

    hardware: Hardware
    note: str | None


def same_gpu_node_kinds(hw: Hardware) -> list[Hardware]:
    """Other profiles of the same GPU and host link (e.g. gh200-96gb and gh200-96gb-quad), by node size."""
    same = []
    for name in profile_names():
        if name == hw.name:
            continue
        other = load_hardware(name, hw.user_overrides)
        if (other.gpu_model, other.hbm.capacity_bytes, other.host_link.kind) == (
                hw.gpu_model, hw.hbm.capacity_bytes, hw.host_link.kind):
            same.append(other)
    return sorted(same, key=lambda h: h.gpus_per_node)


def bigger_node_hint(hw: Hardware) -> str:
    """' (for a 4-GPU node use --hardware gh200-96gb-quad)' where such a profile exists, else ''."""
    bigger = [h for h in same_gpu_node_kinds(hw) if h.gpus_per_node > hw.gpus_per_node]
    if not bigger:
        return ""
    return f" (for a {bigger[0].gpus_per_node}-GPU node of the same GPU use --hardware {bigger[0].name})"


def node_profile_for(hw: Hardware, gpus: int, gpus_per_node: int) -> NodeChoice:
    """Read --gpus-per-node against the profile's node size.

    A single-superchip profile asked for several GPUs per node means the multi-GPU node of the
    same superchip (gh200-96gb with --gpus-per-node 4 is the quad GH200 node): that profile is
    taken and a note says so. Several single-superchip nodes without --gpus-per-node stay
    nodes on the network, and a note names the multi-GPU node profile. Otherwise the profile
    is kept.
    """
    bigger = [h for h in same_gpu_node_kinds(hw) if h.gpus_per_node > hw.gpus_per_node]
    if gpus_per_node > hw.gpus_per_node:
        fit = [h for h in bigger if h.gpus_per_node >= gpus_per_node]
        if not fit:
            raise GhsimError(f"--gpus-per-node {gpus_per_node} exceeds the {hw.gpus_per_node} GPU(s) "
                             f"a {hw.name} node has{bigger_node_hint(hw)}")
        pick = fit[0]
        return NodeChoice(pick, f"{hw.name} is a {hw.gpus_per_node}-GPU node; --gpus-per-node {gpus_per_node} "
                                f"reads as {pick.name} ({pick.gpus_per_node} GPUs per node on {pick.gpu_link.kind})")
    if gpus_per_node == 0 and hw.gpus_per_node == 1 and gpus > 1 and bigger:
        return NodeChoice(hw, f"{gpus} x {hw.name} = {gpus} one-GPU nodes on {hw.network.kind}; for "
                              f"{bigger[0].gpus_per_node}-GPU nodes on {bigger[0].gpu_link.kind} use "
                              f"--hardware {bigger[0].name}")
    return NodeChoice(hw, None)


def assumed_figures(hw: Hardware) -> list[str]:
    """Dotted keys of the profile's figures whose source says they are assumptions, not measured or published."""
    found: list[str] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict) and "source" in value and "value" in value:
                if str(value["source"]).lower().startswith("assumption"):
                    found.append(prefix + key)
            elif isinstance(value, dict):
                walk(value, f"{prefix}{key}.")

    walk(hw.raw, "")
    return found


def has_fp8(hw: Hardware) -> bool:
    """FP8 Tensor Cores run at twice the bf16 rate (Hopper); a profile whose fp8 figure is the
    bf16 one (A100: "not supported in hardware", it falls back to 16-bit) has none."""
    return hw.peak_flops["fp8"] > hw.peak_flops["bf16"]


_CHIP = re.compile(r"\b[ABH]\d{3}\b")  # A100, H100, H200, B200: the GPU chip in a product name


def gpu_chips(name: str) -> set[str]:
    """The GPU chips a product or device name mentions ("NVIDIA H100 80GB HBM3" -> {"H100"})."""
    return set(_CHIP.findall(name or ""))
