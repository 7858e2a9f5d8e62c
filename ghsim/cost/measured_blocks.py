"""GH200 layer times measured by a published profiler, as kernel-time corrections.

hardware_profiles/calibration/gh200_measured_blocks.toml holds Sailor's per-layer profile of OPT-350M on
GH200 (forward + backward of one decoder block, and of the LM head, by tensor-parallel degree and
micro-batch). For a plan whose decoder block is that block on those profiles, each profiled layer's
measured time per sequence (least squares over the GPU-bound micro-batches) replaces ghsim's: one factor
on that layer's compute kernels makes ghsim's layer (its kernels x factor + its own tensor-parallel
collectives) take the measured time. Every other op (the embedding, the loss, the optimizer, all
communication) and every other plan (another shape, framework, math, TP degree or GPU) keeps the H100
microbenchmark prices. A calibration overlay the user gives (`--calibration`) is a fit to the user's own
run and takes precedence.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from ghsim.cost.overlay import SHAPE_KEYS, Corrections
from ghsim.errors import GhsimError
from ghsim.graph.ops import Category, Kind, Op
from ghsim.tomlio import read_toml, repo_root

if TYPE_CHECKING:
    from ghsim.cost.calibration import Calibration
    from ghsim.graph.step import LayerTemplates
    from ghsim.hardware import Hardware
    from ghsim.model import ModelSpec
    from ghsim.cost.compute import CostModel
    from ghsim.plan import Plan

TABLE = repo_root() / "hardware_profiles" / "calibration" / "gh200_measured_blocks.toml"
# the kernels a factor scales: a layer's compute (collectives keep ghsim's link model)
SCALED = (Category.GEMM, Category.ATTENTION, Category.ELEMENTWISE, Category.NORM_REDUCTION)


@lru_cache(maxsize=1)
def _table() -> dict:
    return read_toml(TABLE)


def applies(model: "ModelSpec", hw: "Hardware", plan: "Plan") -> bool:
    """Is the plan's decoder block the profiled one, on the profiled part, at a profiled TP degree?"""
    a = _table()["applies"]
    return (hw.name in a["hardware"] and plan.framework.value == a["framework"]
            and plan.precision.value in a["precision"] and plan.seq == a["seq"]
            and f"tp{plan.tp}" in _table() and not plan.sequence_parallel and plan.lora_rank == 0
            and not plan.compile and all(getattr(model, k) == a[k] for k in SHAPE_KEYS))


def note(model: "ModelSpec", hw: "Hardware", plan: "Plan", calibration: "Calibration") -> str:
    """What the report says when the profile prices the plan's layers ("" otherwise)."""
    if calibration.overlay is not None or not applies(model, hw, plan):
        return ""
    return (f"decoder block and LM head timed on GH200 by Sailor's published per-layer profile "
            f"({TABLE.relative_to(repo_root())}), not by the H100 microbenchmarks")


def gpu_bound_points(tp: int, layer: str) -> list[tuple[int, float]]:
    """(micro-batch, forward + backward seconds) of one profiled layer ("block", "head") where the
    profiled GPU ran it back to back (from the table's gpu_bound_from_micro_batch up)."""
    t = _table()
    rows, start = t[f"tp{tp}"][layer], t["applies"]["gpu_bound_from_micro_batch"]
    points = [(mb, f + b) for mb, f, b in zip(rows["micro_batch"], rows["forward_s"], rows["backward_s"]) if mb >= start]
    if not points:
        raise GhsimError(f"{TABLE} [tp{tp}.{layer}]: no point from micro-batch {start}")
    return points


def layer_prices(ops: Iterable[Op], price: Callable[[Op], float]) -> tuple[float, float]:
    """ghsim's seconds for a layer's ops (`price`: a rank's, collectives on its links): its compute
    kernels, and its collectives."""
    kernels = comm = 0.0
    for op in ops:
        if op.kind == Kind.COLLECTIVE:
            comm += price(op)
        elif op.category in SCALED:
            kernels += price(op)
    return kernels, comm


def profiled_layers(templates: "LayerTemplates") -> dict[str, tuple[Op, ...]]:
    """ghsim's ops of each profiled layer, from a rank's layer templates."""
    head = set(_table()["layers"]["head"])
    return {"block": (*templates.fwd, *templates.bwd),
            "head": tuple(op for op in (*templates.loss_fwd, *templates.loss_bwd) if op.name in head)}


def corrections(model: "ModelSpec", hw: "Hardware", plan: "Plan", cost: "CostModel", price: Callable[[Op], float],
                templates_at: Callable[["Plan"], "LayerTemplates"]) -> Corrections | None:
    """Per-op factors for a plan the profile covers (None otherwise). `cost`: the rank's cost model (an
    overlay's corrections there take precedence); `price`: the rank's price of an op (RankPricing.price);
    `templates_at(plan)` builds the rank's layer templates of a plan. A layer's factor: at each GPU-bound profiled micro-batch, like
    with like, (measured time - ghsim's collectives) / ghsim's kernels at that micro-batch; the median
    over them, applied at any micro-batch (the ratio holds within 4% from 8 to 128 sequences)."""
    if cost.corrections is not None or not applies(model, hw, plan):
        return None
    ratios: dict[str, list[float]] = {}
    names: dict[str, set[str]] = {}
    layers_at: dict[int, dict[str, tuple[Op, ...]]] = {}  # block and head share their micro-batches: built once
    for layer in ("block", "head"):
        for mb, measured in gpu_bound_points(plan.tp, layer):
            if mb not in layers_at:
                layers_at[mb] = profiled_layers(templates_at(plan.with_(micro_batch=mb)))
            ops = layers_at[mb][layer]
            kernels, comm = layer_prices(ops, price)
            if kernels > 0:
                ratios.setdefault(layer, []).append(max(measured - comm, 0.0) / kernels)
                names.setdefault(layer, set()).update(op.name for op in ops if op.category in SCALED)
    return Corrections(by_name={name: float(np.median(ratios[layer])) for layer in ratios for name in names[layer]})
