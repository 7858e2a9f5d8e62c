"""What spills under unified memory and comes back each step, from the replay of HBM use
(graph/unified_memory.py says how it is modeled and places the migrations in the graph)."""

from __future__ import annotations

import numpy as np

from ghsim.graph.offload.rewrite import BWD, FWD, find_runs
from ghsim.graph.ops import OpGraph
from ghsim.graph.unified_memory import UnifiedMemoryUse, gpu_optimizer_mask
from ghsim.hardware import Hardware
from ghsim.sim.memory import TierPeak, hbm_replay

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
    is_opt = gpu_optimizer_mask(ops)
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


def resident_peak(peak: TierPeak, capacity: float) -> TierPeak:
    """HBM as the GPU holds it under unified memory: at most its capacity; the rest sits on the host
    (shown as a negative "spilled_to_host" entry, so the breakdown still sums to the peak)."""
    if peak.peak_bytes <= capacity:
        return peak
    breakdown = {**peak.breakdown, "spilled_to_host": capacity - peak.peak_bytes}
    curve = None if peak.curve is None else np.minimum(peak.curve, capacity)
    return TierPeak(capacity, peak.peak_op, breakdown, curve)
