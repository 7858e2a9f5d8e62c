"""Unified memory (--unified-memory): allocations beyond HBM spill to host memory and page back.

Every allocation is managed memory. While the step's demand fits in HBM nothing
moves after the first step (a LoRA fine-tune: "little UM activity"). When it
does not, the driver keeps the most recently touched pages in HBM (LRU
eviction) and the step splits into two phases that touch different data:

- compute (forward and backward): parameters, gradients, activations; the
  optimizer states are cold and are what gets evicted first;
- optimizer: parameters, gradients and both AdamW moments.

With overflow O = demand - HBM, each phase finds up to O of its own data
evicted by the other phase and must bring it back: min(W_phase, O) bytes per
phase per step. If a phase's own working set W exceeds HBM it also thrashes
within itself: W - HBM more bytes per sweep (forward, backward).

How a page comes back depends on the link (hostlink.HostSide):
- PCIe: the GPU faults; the driver services faults in batches and migrates
  the pages; kernels wait, and the GPU shows idle while the copies run
  (nsys: "Unified memory memcpy HtoD", GPU idle gaps).
- NVLink-C2C (access_in_place): data the phase streams through once (the
  optimizer's moments) is read in place over C2C; data a phase reuses (weights
  read by every GEMM tile) is migrated by the access counters.

Migrations are placed where the data is first touched: spread over the
forward layers for the compute phase, before the optimizer for its phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ghsim.graph import ops as K
from ghsim.graph.offload import BWD, FWD, New, Rewriter, find_runs
from ghsim.graph.ops import UM, Op, OpGraph
from ghsim.hardware import Hardware
from ghsim.sim.memory import TierPeak, hbm_replay



@dataclass(frozen=True)
class UnifiedMemoryUse:
    demand_peak_bytes: float  # what the step would need resident
    hbm_capacity_bytes: float
    spilled_bytes: float  # held in host memory at the peak
    compute_working_set_bytes: float
    optimizer_working_set_bytes: float
    migrated_bytes: float  # paged to the GPU per step (faults or access counters)
    in_place_bytes: float  # read in place over a coherent link per step
    # where the migrations go: bytes before each forward (and backward) layer of every
    # micro-batch, and before the optimizer (read in place or migrated)
    per_forward_layer_bytes: float = 0.0
    per_backward_layer_bytes: float = 0.0
    optimizer_bytes: float = 0.0
    optimizer_in_place: bool = False

    @property
    def active(self) -> bool:
        return self.migrated_bytes > 0 or self.in_place_bytes > 0

    def to_dict(self) -> dict[str, float]:
        return {
            "demand_peak_bytes": self.demand_peak_bytes,
            "hbm_capacity_bytes": self.hbm_capacity_bytes,
            "spilled_bytes": self.spilled_bytes,
            "compute_working_set_bytes": self.compute_working_set_bytes,
            "optimizer_working_set_bytes": self.optimizer_working_set_bytes,
            "migrated_bytes": self.migrated_bytes,
            "in_place_bytes": self.in_place_bytes,
        }


# fragments the compute phase does not touch: evicted first when the step overflows HBM
COLD_IN_COMPUTE = ("optimizer_states", "master_params")


def unified_memory_use(final: OpGraph, static: dict[str, float], hw: Hardware, microbatches: int
                       ) -> UnifiedMemoryUse:
    """What overflows HBM and must come back each step, from the kernel-level graph of the step's
    last micro-batch (the one holding the most: earlier micro-batches' gradients, the optimizer)
    and what HBM holds all step (`static`); every one of the step's `microbatches` migrates alike."""
    ops = final.ops
    capacity = hw.hbm.capacity_bytes
    _, demand, _ = hbm_replay(ops, sum(static.values()))  # HBM in use while each op runs
    peak = float(demand.max()) if len(demand) else sum(static.values())
    is_opt = _optimizer_ops(ops)
    cold_in_compute = sum(static.get(k, 0.0) for k in COLD_IN_COMPUTE)
    w_compute = float(demand[~is_opt].max()) - cold_in_compute if (~is_opt).any() else 0.0
    w_opt = float(demand[is_opt].max()) if is_opt.any() else 0.0
    overflow = max(0.0, peak - capacity)
    if overflow <= 0:
        return UnifiedMemoryUse(peak, capacity, 0.0, w_compute, w_opt, 0.0, 0.0)
    runs = find_runs(final)
    fwd_layers = microbatches * sum(1 for r in runs if r.direction == FWD and r.layer >= 0)
    bwd_layers = microbatches * sum(1 for r in runs if r.direction == BWD and r.layer >= 0)
    back_compute = min(w_compute, overflow)  # evicted by the optimizer phase, touched again in forward
    thrash = max(0.0, w_compute - capacity)  # per sweep, when the compute phase alone does not fit
    back_opt = min(w_opt, overflow) if is_opt.any() else 0.0
    in_place = hw.unified_memory.access_in_place and hw.host_link.gpu_reads_host_in_place
    per_fwd = (back_compute + thrash) / fwd_layers if fwd_layers else 0.0
    per_bwd = thrash / bwd_layers if bwd_layers and thrash > 0 else 0.0
    migrated = per_fwd * fwd_layers + per_bwd * bwd_layers + (0.0 if in_place else back_opt)
    return UnifiedMemoryUse(peak, capacity, overflow, w_compute, w_opt, migrated, back_opt if in_place else 0.0,
                            per_fwd, per_bwd, back_opt, in_place)


def _optimizer_ops(ops: list[Op]) -> np.ndarray:
    return np.fromiter((o.phase == "opt" and o.resource == "gpu" for o in ops), bool, len(ops))


def apply_unified_memory(graph: OpGraph, um: UnifiedMemoryUse, price: Callable[[Op], float]
                         ) -> tuple[OpGraph, list[int]]:
    """The micro-batch's graph with its page migrations placed where the data is first touched
    (before each forward and backward layer, before the optimizer), and where each op moved to."""
    if not um.active:
        return graph, list(range(len(graph)))
    runs = find_runs(graph)
    rw = Rewriter(graph)
    for direction, nbytes, name, phase in ((FWD, um.per_forward_layer_bytes, "um.migrate.fwd", "fwd"),
                                           (BWD, um.per_backward_layer_bytes, "um.migrate.bwd", "bwd")):
        if nbytes <= 0:
            continue
        op = _um_op(name, nbytes, phase, in_place=False)
        op.duration = price(op)
        for r in runs:
            if r.direction == direction and r.layer >= 0:
                rw.insert_before(r.first, New(op, [], r.layer, graph.microbatch[r.first]))
    is_opt = _optimizer_ops(graph.ops)
    if um.optimizer_bytes > 0 and is_opt.any():
        first_opt = int(np.flatnonzero(is_opt)[0])
        # the optimizer streams its moments once: read in place where the link allows it
        op = _um_op("um.optimizer", um.optimizer_bytes, "opt", in_place=um.optimizer_in_place)
        op.duration = price(op)
        rw.insert_before(first_opt, New(op, [], -1, graph.microbatch[first_opt]))
    out = rw.build()
    return out, rw.mapping


def _um_op(name: str, nbytes: float, phase: str, in_place: bool) -> Op:
    # An in-place read stretches the kernel that makes it (busy, as nsys shows it);
    # a fault migration stalls the stream (idle GPU, UM memcpy rows).
    return Op(name=name, category="other" if in_place else UM, kind=K.UM_MIGRATE, resource="gpu", bytes=nbytes,
              kernels=0, phase=phase, variant="in_place" if in_place else "fault")


def resident_peak(peak: TierPeak, capacity: float) -> TierPeak:
    """HBM as the GPU holds it under unified memory: at most its capacity; the rest sits on the host
    (shown as a negative "spilled_to_host" entry, so the breakdown still sums to the peak)."""
    if peak.peak_bytes <= capacity:
        return peak
    breakdown = {**peak.breakdown, "spilled_to_host": capacity - peak.peak_bytes}
    curve = None if peak.curve is None else np.minimum(peak.curve, capacity)
    return TierPeak(capacity, peak.peak_op, breakdown, curve)
