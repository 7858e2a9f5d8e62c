"""Host-side costs: copies over the host link, work on the host CPU, unified-memory paging.

Host links differ in kind, not only in rate (DESIGN.md, modeling notes):

- PCIe moves data per direction at a pinned or a (much lower) pageable rate,
  and both directions together are capped below twice one direction
  (`bidirectional_total`); several GPUs may sit behind one link
  (`gpus_sharing_host_link`, a PCIe switch) and an x86 node's host memory
  bandwidth is shared by all its GPUs.
- NVLink-C2C is asymmetric (H2D faster than D2H), coherent, and each GPU has
  its own Grace and LPDDR5X, so host bandwidth is per GPU, not per node.

`HostSide` turns those figures into per-GPU rates for one plan: every GPU of a
data-parallel plan runs the same schedule at the same time (each offloads its
own shard), so the GPUs that share a link or a host divide it evenly:

- x86 node: one host for all its GPUs. The plan's GPUs on the node
  (`node_gpus`) split its cores and its memory bandwidth; the GPUs behind one
  PCIe switch (`link_sharers`) split that link.
- GH200 node: one Grace per Hopper. A profile's CPU figure covers every
  superchip of the node (`gpus_per_node` of them), so each GPU gets one
  superchip's share whatever the plan uses; its LPDDR5X bandwidth and C2C link
  are its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ghsim.graph.ops import Kind
from ghsim.graph.optimizer import CpuAdam

if TYPE_CHECKING:
    from ghsim.cost.calibration import Calibration
    from ghsim.hardware import Hardware
    from ghsim.plan import Plan

# Bytes one fp32 AdamW update streams through host memory: read param, grad, m, v
# (16 B), write param, m, v (12 B). The profiles derive adamw_params_per_s from the
# same count, so casts priced at adamw_rate * 28 B/s see the same achieved bandwidth.
ADAMW_BYTES_PER_PARAM = 28
# The NVIDIA UVM driver services GPU page faults in batches of up to 256
# (open-gpu-kernel-modules, uvm_gpu_replayable_faults.c: uvm_perf_fault_batch_count).
UM_FAULTS_PER_BATCH = 256



@dataclass(frozen=True)
class HostSide:
    hw: "Hardware"
    link_sharers: int = 1  # GPUs of the plan copying over one host link at once
    node_gpus: int = 1  # GPUs of the plan on one node (they share an x86 host's CPU and memory)
    torch_adam_per_thread: float = 0.0  # measured torch CPU AdamW params/s per thread; 0: none applies

    @staticmethod
    def of(hw: "Hardware", plan: "Plan | None" = None, cal: "Calibration | None" = None) -> "HostSide":
        node = 1
        if plan is not None:
            per_node = plan.gpus_per_node or hw.gpus_per_node
            node = max(1, min(plan.gpus, per_node))
        sharers = max(1, min(hw.host_link.gpus_sharing, node))
        per_thread = 0.0
        # The calibration host's torch AdamW measurement carries over to x86 hosts only
        # (it was taken on an x86 VM); Grace keeps its profile figure.
        if cal is not None and cal.optimizer_cpu_params_per_s > 0 and cal.optimizer_cpu_threads > 0 \
                and "grace" not in hw.cpu.model.lower():
            per_thread = cal.optimizer_cpu_params_per_s / cal.optimizer_cpu_threads
        return HostSide(hw, sharers, node, per_thread)

    # --- the link ---------------------------------------------------------------
    def host_memory_rate(self) -> float:
        """Host memory bandwidth one GPU's copies and CPU work can draw on."""
        if self.hw.host_link.is_c2c:  # one Grace socket per Hopper: the profile figure is per socket
            return self.hw.host.bandwidth
        return self.hw.host.bandwidth / self.node_gpus

    def link_rate(self, direction: str, pinned: bool = True, duplex: bool = False) -> float:
        """Bytes/s of one GPU's copies in one direction.

        duplex: the schedule keeps the other direction busy at the same time, so
        both share `bidirectional_total` (max-min fair: each gets at least half).
        """
        link = self.hw.host_link
        if direction == Kind.H2D:
            rate, other = (link.h2d_pinned, link.d2h_pinned) if pinned else (link.h2d_pageable, link.d2h_pageable)
        else:
            rate, other = (link.d2h_pinned, link.h2d_pinned) if pinned else (link.d2h_pageable, link.h2d_pageable)
        if duplex and link.bidirectional_total > 0:
            total = link.bidirectional_total
            rate = min(rate, max(total / 2, total - other))
        return min(rate / self.link_sharers, self.host_memory_rate())

    def copy_time(self, nbytes: float, direction: str, pinned: bool = True, duplex: bool = False,
                  transfers: int = 1) -> float:
        """Seconds for `transfers` copies moving `nbytes` in all (each pays the link latency)."""
        if nbytes <= 0:
            return 0.0
        return max(1, transfers) * self.hw.host_link.latency_s + nbytes / self.link_rate(direction, pinned, duplex)

    # --- the CPU ----------------------------------------------------------------
    @property
    def cpu_sharers(self) -> int:
        """GPUs whose offload work one profile's CPU figure is split over."""
        if self.hw.host_link.is_c2c:  # one Grace per superchip: a fixed share of the node's CPUs
            return max(1, self.hw.gpus_per_node, self.node_gpus)
        return self.node_gpus

    def cpu_adamw_rate(self, impl: str = CpuAdam.VECTOR) -> float:
        """fp32 AdamW params/s one GPU's share of the host sustains.

        Vectorized CPU-Adam (DeepSpeed, GraceAdam) runs at the profile's figure,
        which is bandwidth-derived; torch's CPU AdamW runs at the measured
        per-thread rate times the cores, never above the profile's figure.
        """
        profile = self.hw.cpu.adamw_params_per_s
        rate = profile
        if impl == CpuAdam.TORCH and self.torch_adam_per_thread > 0:
            rate = min(profile, self.torch_adam_per_thread * self.hw.cpu.cores)
        return rate / self.cpu_sharers

    def cpu_optimizer_time(self, params: float, impl: str = CpuAdam.VECTOR) -> float:
        return params / self.cpu_adamw_rate(impl) if params > 0 else 0.0

    def cpu_stream_rate(self) -> float:
        """Bytes/s host cores sustain on a streaming pass (a cast, an accumulation)."""
        return min(self.cpu_adamw_rate(CpuAdam.VECTOR) * ADAMW_BYTES_PER_PARAM, self.host_memory_rate())

    def cpu_bytes_time(self, nbytes: float) -> float:
        return nbytes / self.cpu_stream_rate() if nbytes > 0 else 0.0

    # --- unified memory ---------------------------------------------------------
    def um_fault_time(self, nbytes: float) -> float:
        """Pages brought in on GPU faults: fault-batch service plus the migration itself."""
        if nbytes <= 0:
            return 0.0
        um = self.hw.unified_memory
        batches = math.ceil(nbytes / (um.page_size_bytes * UM_FAULTS_PER_BATCH))
        return batches * um.fault_batch_latency_s + nbytes / (um.migration / self.link_sharers)

    def um_in_place_time(self, nbytes: float) -> float:
        """Host-resident pages read in place over a coherent link (no migration)."""
        link = self.hw.host_link
        if nbytes <= 0:
            return 0.0
        if not (link.gpu_reads_host_in_place and link.in_place_read > 0):
            return math.inf
        return nbytes / min(link.in_place_read / self.link_sharers, self.host_memory_rate())
