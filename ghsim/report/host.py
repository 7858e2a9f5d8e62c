"""What the host side did in a simulated step: bytes per link direction, busy time per resource,
CPU optimizer time, and how much of it the GPU waited for (the report's "offload" section)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ghsim.report.breakdown import HOST_SIDE
from ghsim.graph import ops as K
from ghsim.graph.offload import OffloadSetup
from ghsim.graph.ops import Category, Phase
from ghsim.hardware import Hardware
from ghsim.plan import Plan
from ghsim.report.step_report import Stall
from ghsim.sim.memory import TierPeak

if TYPE_CHECKING:
    from ghsim.graph.unified_memory import UnifiedMemoryUse


@dataclass(frozen=True)
class HostTraffic:
    """Bytes each way over the host link, busy seconds of the copy engines and host cores,
    and seconds of CPU optimizer work, in some stretch of simulated work."""

    bytes_h2d: float = 0.0
    bytes_d2h: float = 0.0
    busy_s: tuple[float, float, float] = (0.0, 0.0, 0.0)  # per HOST_SIDE: h2d, d2h, cpu
    cpu_optimizer_s: float = 0.0

    @staticmethod
    def of(ops: list, start: np.ndarray, end: np.ndarray) -> "HostTraffic":
        dur = (end - start).tolist()
        moved = {K.H2D: 0.0, K.D2H: 0.0}
        busy = dict.fromkeys(HOST_SIDE, 0.0)
        cpu_optimizer = 0.0
        data = Phase.DATA  # read once: a member read off its enum class is slow (graph/ops.py)
        for op, d in zip(ops, dur):
            if op.kind in moved and op.phase != data:
                moved[op.kind] += op.bytes
            if op.resource in busy:
                busy[op.resource] += d
            if op.kind == K.OPT_CPU:
                cpu_optimizer += d
        return HostTraffic(moved[K.H2D], moved[K.D2H], tuple(busy.values()), cpu_optimizer)

    def __add__(self, other: "HostTraffic") -> "HostTraffic":
        return HostTraffic(self.bytes_h2d + other.bytes_h2d, self.bytes_d2h + other.bytes_d2h,
                           tuple(a + b for a, b in zip(self.busy_s, other.busy_s)),
                           self.cpu_optimizer_s + other.cpu_optimizer_s)

    def times(self, k: int) -> "HostTraffic":
        """The same work done k times."""
        return HostTraffic(self.bytes_h2d * k, self.bytes_d2h * k, tuple(b * k for b in self.busy_s),
                           self.cpu_optimizer_s * k)


def traffic_section(traffic: HostTraffic, breakdown: dict[str, float], plan: Plan, setup: OffloadSetup,
                    hw: Hardware) -> dict[str, Any]:
    """The report's "offload" section; `setup` is the plan's offload, resolved."""
    exposed = breakdown.get(Stall.WAIT_TRANSFER, 0.0) + breakdown.get(Category.MEMCPY, 0.0)
    link = hw.host_link
    summary = (f"{setup.schedule.value} schedule over {link.kind}: {traffic.bytes_d2h / 1e9:.2f} GB down, "
               f"{traffic.bytes_h2d / 1e9:.2f} GB up; CPU optimizer {traffic.cpu_optimizer_s * 1e3:.1f} ms; "
               f"GPU waits {exposed * 1e3:.1f} ms on transfers, {breakdown.get(Stall.WAIT_CPU, 0.0) * 1e3:.1f} ms on the CPU")
    return {
        "schedule": setup.schedule.value,
        "targets": sorted(plan.offload),
        "cpu_share": setup.cpu_share,
        "pinned": setup.pinned,
        "host_link": link.kind,
        "bytes_h2d": traffic.bytes_h2d,
        "bytes_d2h": traffic.bytes_d2h,
        "busy_s": dict(zip(HOST_SIDE, traffic.busy_s)),
        "cpu_optimizer_s": traffic.cpu_optimizer_s,
        "exposed_transfer_s": exposed,
        "summary": summary,
    }


def per_node(peak: TierPeak, gpus_on_node: int) -> TierPeak:
    """A per-GPU host peak as the node sees it: every GPU of the node holds the same."""
    if gpus_on_node == 1:
        return peak
    curve = None if peak.curve is None else np.asarray(peak.curve) * gpus_on_node
    return TierPeak(peak.peak_bytes * gpus_on_node, peak.peak_op,
                    {k: v * gpus_on_node for k, v in peak.breakdown.items()}, curve)


def unified_memory_section(um: "UnifiedMemoryUse", breakdown: dict[str, float], step_time: float) -> dict[str, Any]:
    stall = breakdown.get(Stall.UM_MIGRATION, 0.0)
    share = stall / step_time if step_time > 0 else 0.0
    if um.active:
        summary = (f"demand {um.demand_peak_bytes / 1e9:.1f} GB > HBM {um.hbm_capacity_bytes / 1e9:.0f} GB: "
                   f"{um.spilled_bytes / 1e9:.1f} GB spilled, {um.migrated_bytes / 1e9:.1f} GB migrated per step "
                   f"({stall * 1e3:.1f} ms, {share * 100:.0f}% of the step with the GPU stalled)"
                   + (f", {um.in_place_bytes / 1e9:.1f} GB read in place" if um.in_place_bytes else ""))
    else:
        summary = (f"demand {um.demand_peak_bytes / 1e9:.1f} GB fits in HBM "
                   f"{um.hbm_capacity_bytes / 1e9:.0f} GB: no page migration after the first step")
    return {**um.to_dict(), "migration_s": stall, "migration_share": share, "summary": summary}
