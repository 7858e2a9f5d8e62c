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

from ghsim.cost.library_overheads import superoffload_worker_pace
from ghsim.graph.ops import Kind
from ghsim.cost.cpu_optimizer import (
    ADAMW_STREAM_BYTES,
    cpu_optimizer_rate,
    curve_of,
    per_thread_bandwidth,
    foreach_norm_bandwidth,
)
from ghsim.graph.optimizer import resolve_cpu_optimizer
from ghsim.plan import DEEPSPEED_SUB_GROUP, CpuOptimizer, OffloadSchedule

if TYPE_CHECKING:
    from ghsim.cost.calibration import Calibration
    from ghsim.hardware import Hardware
    from ghsim.plan import Plan

# SuperOffload's default `cpuadam_cores_perc`: the share of a rank's cores its CPU-Adam worker
# process is pinned to; the training process keeps the rest (deepspeed 0.19.8,
# runtime/zero/offload_config.py; measured: validation/measured_libraries/README.md).
SUPEROFFLOAD_CPU_ADAM_CORES = 0.8
# The NVIDIA UVM driver services GPU page faults in batches of up to 256
# (open-gpu-kernel-modules, uvm_gpu_replayable_faults.c: uvm_perf_fault_batch_count).
UM_FAULTS_PER_BATCH = 256



@dataclass(frozen=True)
class HostSide:
    hw: "Hardware"
    link_sharers: int = 1  # GPUs of the plan copying over one host link at once
    node_gpus: int = 1  # GPUs of the plan on one node (they share an x86 host's CPU and memory)
    optimizer_threads: int = 0  # threads one GPU's CPU optimizer runs on; 0: all of its cores
    main_threads: int = 0  # threads the training process's own host work (casts, sums) runs on
    # SuperOffload on an x86 host: the CPU AdamW runs in DeepSpeed's spawned worker process, handed
    # each sub-group through a queue (cost/library_overheads.py prices the hand-off and the worker's
    # pace, measured on x86). Not applied on Grace (C2C), where it is unmeasured and the published
    # GH200 runs (SuperOffload paper and blog) have SuperOffload ahead of ZeRO-Offload, which the
    # x86 pace would contradict
    worker_process: bool = False
    sub_group: float = DEEPSPEED_SUB_GROUP  # parameters handed to the worker at once (sub_group_size)
    # FSDP2 (fully_shard): the optimizer steps DTensors, each paying DTensor's dispatch on the host
    dtensor: bool = False

    @staticmethod
    def of(hw: "Hardware", plan: "Plan | None" = None, cal: "Calibration | None" = None) -> "HostSide":
        node = 1
        if plan is not None:
            per_node = plan.gpus_per_node or hw.gpus_per_node
            node = max(1, min(plan.gpus, per_node))
        sharers = max(1, min(hw.host_link.gpus_sharing, node))
        side = HostSide(hw, sharers, node)
        if plan is None:
            return side
        opt, main = optimizer_threads(plan, side.cores_per_gpu, node)
        worker = plan.offload_schedule == OffloadSchedule.SUPEROFFLOAD and not hw.host_link.is_c2c
        return HostSide(hw, sharers, node, opt, main, worker, plan.sub_group_size, plan.fsdp2)

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

    @property
    def cores_per_gpu(self) -> int:
        return max(1, self.hw.cpu.cores // self.cpu_sharers)

    def _stream_bandwidth(self, threads: int) -> float:
        """Bytes/s `threads` threads of one GPU's share of the host stream. The profile's
        adamw_params_per_s is bandwidth-derived at 28 B per update, so x 28 is the host's."""
        share = self.hw.cpu.adamw_params_per_s * ADAMW_STREAM_BYTES / self.cpu_sharers
        return min(share, max(1, threads) * per_thread_bandwidth())

    @property
    def adam_threads(self) -> int:
        """Threads one GPU's CPU optimizer runs on."""
        return self.optimizer_threads or self.cores_per_gpu

    def cpu_adamw_rate(self, impl: str = CpuOptimizer.DEEPSPEED, tensors: tuple[float, ...] = ()) -> float:
        """AdamW params/s of `impl` on the threads one GPU's CPU optimizer gets, over tensors of the
        given sizes ((elements, count) pairs, flattened; cost/cpu_optimizer.py)."""
        threads = self.adam_threads
        rate = cpu_optimizer_rate(CpuOptimizer(impl), threads, self._stream_bandwidth(threads), tensors)
        return rate * superoffload_worker_pace()[0] if self.worker_process else rate

    def cpu_optimizer_time(self, params: float, impl: str = CpuOptimizer.DEEPSPEED,
                           tensors: tuple[float, ...] = ()) -> float:
        if params <= 0:
            return 0.0
        handoff = superoffload_worker_pace()[1] * params / self.sub_group if self.worker_process else 0.0
        dispatch = curve_of(CpuOptimizer(impl)).dispatch_seconds_per_param(
            tensors, self.adam_threads) if self.dtensor else 0.0
        return params / self.cpu_adamw_rate(impl, tensors) + params * dispatch + handoff

    def cpu_stream_rate(self) -> float:
        """Bytes/s the training process's own host work (a cast, an accumulation) streams."""
        return min(self._stream_bandwidth(self.main_threads or self.cores_per_gpu), self.host_memory_rate())

    def cpu_bytes_time(self, nbytes: float, foreach_norm: bool = False) -> float:
        rate = min(foreach_norm_bandwidth(), self.host_memory_rate()) if foreach_norm else self.cpu_stream_rate()
        return nbytes / rate if nbytes > 0 else 0.0

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


def optimizer_threads(plan: "Plan", cores_per_gpu: int, node_gpus: int) -> tuple[int, int]:
    """Threads of one GPU's CPU optimizer and of its training process's host work.

    torchrun sets OMP_NUM_THREADS=1 when it starts several ranks on a node (and no value is set),
    so torch's CPU optimizers then run on one thread per rank; DeepSpeedCPUAdam's OpenMP threads
    share the node's cores; SuperOffload pins its CPU-Adam worker to cpuadam_cores_perc of them.
    A stated --cpu-threads wins (capped at the cores one GPU has).
    """
    impl = resolve_cpu_optimizer(plan)
    if plan.offload_schedule == OffloadSchedule.SUPEROFFLOAD:
        # superoffload_utils.py _set_cpu_affinity: the worker gets the last cores, all but
        # int((1 - perc) x cores). The training process's call pins only its main thread: torch's
        # OpenMP threads, started during initialisation, keep every core, so its host passes do
        # not slow down (the traces: the clip's mul_ of 1e9 fp32 takes 60 ms with 16 cores, 63 ms
        # with 3 and 72-88 ms with 1)
        pinned_main = int((1 - (plan.cpu_cores_share or SUPEROFFLOAD_CPU_ADAM_CORES)) * cores_per_gpu)
        opt, main = max(1, cores_per_gpu - pinned_main), cores_per_gpu
    elif impl != CpuOptimizer.DEEPSPEED and node_gpus > 1:
        opt = main = 1
    else:
        opt = main = cores_per_gpu
    if plan.cpu_threads:
        opt = min(plan.cpu_threads, cores_per_gpu)
    return opt, main
