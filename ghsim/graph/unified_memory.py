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

This module places the migrations in the graph (apply_unified_memory); the replay
that decides how much spills and comes back is sim/unified_memory.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ghsim.graph import ops as K
from ghsim.graph.offload.rewrite import BWD, FWD, New, Rewriter, find_runs
from ghsim.graph.ops import UM, Category, Op, OpGraph, Phase, Resource

_OPT, _GPU = Phase.OPT, Resource.GPU  # read per op below (see graph/ops.py on member reads)


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


def gpu_optimizer_mask(ops: list[Op]) -> np.ndarray:
    """Which ops are the optimizer's work on the compute stream."""
    return np.fromiter((o.phase == _OPT and o.resource == _GPU for o in ops), bool, len(ops))


def apply_unified_memory(graph: OpGraph, um: UnifiedMemoryUse) -> tuple[OpGraph, list[int]]:
    """The micro-batch's graph with its page migrations placed where the data is first touched
    (before each forward and backward layer, before the optimizer), and where each op moved to."""
    if not um.active:
        return graph, list(range(len(graph)))
    runs = find_runs(graph)
    rw = Rewriter(graph)
    for direction, nbytes, name, phase in ((FWD, um.per_forward_layer_bytes, "um.migrate.fwd", Phase.FWD),
                                           (BWD, um.per_backward_layer_bytes, "um.migrate.bwd", Phase.BWD)):
        if nbytes <= 0:
            continue
        op = _um_op(name, nbytes, phase, in_place=False)
        for r in runs:
            if r.direction == direction and r.layer >= 0:
                rw.insert_before(r.first, New(op, [], r.layer, graph.microbatch[r.first]))
    is_opt = gpu_optimizer_mask(graph.ops)
    if um.optimizer_bytes > 0 and is_opt.any():
        first_opt = int(np.flatnonzero(is_opt)[0])
        # the optimizer streams its moments once: read in place where the link allows it
        op = _um_op("um.optimizer", um.optimizer_bytes, Phase.OPT, in_place=um.optimizer_in_place)
        rw.insert_before(first_opt, New(op, [], -1, graph.microbatch[first_opt]))
    out = rw.build()
    return out, rw.mapping


def _um_op(name: str, nbytes: float, phase: str, in_place: bool) -> Op:
    # An in-place read stretches the kernel that makes it (busy, as nsys shows it);
    # a fault migration stalls the stream (idle GPU, UM memcpy rows).
    return Op(name=name, category=Category.OTHER if in_place else UM, kind=K.UM_MIGRATE, resource=Resource.GPU, bytes=nbytes,
              kernels=0, phase=phase, variant="in_place" if in_place else "fault")
