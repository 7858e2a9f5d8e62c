"""Evaluate one candidate plan: simulate it, or screen it from a few small simulations.

A step's time and memory are affine in the number of decoder layers (every layer
is the same op template) and, past the first micro-batch, in the number of
micro-batches (gradient accumulation repeats the same ops; pipeline schedules
add a fixed bubble). So the search simulates the plan on the same model cut
to 2*pp and 4*pp layers, with 2*pp and 3*pp micro-batches, and extrapolates
bilinearly: four small simulations instead of one that is `layers x
micro-batches` long. tests/test_search_screen.py holds the extrapolation to
the full simulation within 1%.

The HBM peak is the largest of a few moments of the step, each affine in the
layer count, so it is convex in it and extrapolating from fewer layers can only
under-estimate it: a screened "does not fit" is proven, a screened "fits" is
confirmed by a full simulation whenever the analytic estimate puts the plan
near or over capacity, and always for the plans the search reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

from ghsim.cost.calibration import Calibration
from ghsim.errors import GhsimError
from ghsim.graph.ops import KERNEL_CATEGORIES, Category
from ghsim.hardware import GB, Hardware
from ghsim.model import ModelSpec
from ghsim.plan import OffloadSchedule, Plan
from ghsim.report.step_report import StepReport, model_flops
from ghsim.search.memory_estimate import MARGIN, MemoryEstimate
from ghsim.simulate import check_fit_to_model, simulate
from ghsim.simulate import prepare, simulate_prepared, step_memory
from ghsim.step_floors import compute_time_floor, step_time_floor



class Status(str, Enum):
    FEASIBLE = "feasible"
    PRUNED = "pruned"  # the memory estimate proves it cannot fit; not simulated
    NO_FIT = "does not fit"  # simulated (or screened): a peak over capacity
    REJECTED = "rejected"  # simulate() refused the plan (GhsimError), with its reason
    BOUNDED = "cannot win"  # its GPU compute alone takes longer than the best plans found
    SAME = "same as another"  # differs only in a setting the simulator ignores for it (reason names the twin)
    UNEXPLORED = "unexplored"  # not simulated within the search's time limit


@dataclass(frozen=True, slots=True)  # a search keeps one per plan
class Evaluation:
    plan: Plan
    status: Status
    reason: str = ""
    est_hbm_bytes: float = math.nan
    step_time_s: float = math.nan
    tokens_per_s: float = math.nan
    mfu: float = math.nan
    gpu_utilization: float = math.nan
    hbm_peak_bytes: float = math.nan
    host_peak_bytes: float = math.nan
    exact: bool = False  # numbers from a full simulation (else extrapolated from small ones)

    @property
    def feasible(self) -> bool:
        return self.status == Status.FEASIBLE

    def usd_per_mtok(self, price_per_gpu_hour: float) -> float:
        """Dollars per million trained tokens at the given price."""
        return self.plan.gpus * price_per_gpu_hour / 3600 * 1e6 / self.tokens_per_s


def from_report(plan: Plan, r: StepReport, est: MemoryEstimate | None) -> Evaluation:
    status = Status.FEASIBLE if r.fits else Status.NO_FIT
    return Evaluation(plan, status, "; ".join(r.fit_problems), est.hbm_bytes if est else math.nan,
                      r.step_time_s, r.tokens_per_s, r.mfu, r.gpu_utilization, r.hbm.peak_bytes,
                      r.host.peak_bytes, exact=True)


def evaluate(model: ModelSpec, hw: Hardware, plan: Plan, cal: Calibration, est: MemoryEstimate | None = None,
             level: str = "screen", bar: float = math.inf) -> Evaluation:
    """The plan's verdict and numbers, at a fidelity `level`:

    - "screen": extrapolated from small simulations (fewer layers and micro-batches);
    - "confirm": the full model, micro-batches extrapolated from two steady-state counts;
    - "exact": one simulation of the whole step.

    A screened plan whose step provably takes longer than `bar` seconds stops early.
    """
    try:
        if plan.gpus > 1:  # simulated whole at every level (see _points)
            return _parallel(model, hw, plan, cal, est, bar)
        if level == "exact":
            return from_report(plan, simulate(model, hw, plan, cal, keep_timeline=False), est)
        if level == "confirm" or plan.unified_memory:
            # what spills depends on the whole footprint: unified memory is never screened small
            return _extrapolated(model, hw, plan, cal, est, layers=(model.num_layers,))
        return _screen(model, hw, plan, cal, est, bar)
    except GhsimError as e:
        return Evaluation(plan, Status.REJECTED, str(e), est.hbm_bytes if est else math.nan)


def _parallel(model: ModelSpec, hw: Hardware, plan: Plan, cal: Calibration, est: MemoryEstimate | None,
              bar: float = math.inf) -> Evaluation:
    """Several GPUs. With a `bar`, the step's last micro-batch and those in its middle bound it
    first (step_floors.step_time_floor): a plan that cannot beat the bar stops there. Then memory, which needs
    only the micro-batch graphs: a plan that does not fit is not timed. What is built on the
    way is reused by the simulation."""
    check_fit_to_model(model, hw, plan)
    rank = prepare(model, hw, plan, cal)
    est_bytes = est.hbm_bytes if est else math.nan
    if bar < math.inf:
        floor = step_time_floor(model, hw, plan, rank, bar)
        if floor > bar:
            return Evaluation(plan, Status.BOUNDED, f"needs at least {floor:.3g} s per step > {bar:.3g} s", est_bytes)
    memory = step_memory(model, hw, plan, rank)
    if memory.problems:
        return Evaluation(plan, Status.NO_FIT, "; ".join(memory.problems), est_bytes,
                          hbm_peak_bytes=memory.hbm.peak_bytes, host_peak_bytes=memory.host.peak_bytes, exact=True)
    return from_report(plan, simulate_prepared(model, hw, plan, cal, keep_timeline=False, rank=rank), est)


# What one simulation costs, in units of one layer's micro-batch: a fixed part (building
# templates, the offload rewrite, the report) and one unit per layer and micro-batch.
# Measured on the 2-core machine; it only decides whether screening pays.
SIM_FIXED = 10


def _points(model: ModelSpec, plan: Plan) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Layer counts and micro-batch counts of the small simulations.

    One GPU: the simulator replays every micro-batch, so both are cut. Several GPUs:
    it runs one or two micro-batches per pipeline chunk and schedules the rest as
    single ops (simulate_prepared), so only layers are worth cutting, and only when a
    stage holds many of them.
    """
    pp, L, k = plan.pp, model.num_layers, plan.grad_accum
    if plan.gpus > 1:
        # pipeline schedules (bubbles, interleaved chunks) are not affine in the layers of
        # a chunk at small sizes: simulated whole (the simulator is coarse there already)
        return (L,), (k,)
    layers = (2 * pp, 4 * pp) if 4 * pp < L else (L,)
    # the first micro-batch differs (nothing to accumulate into, overlap not yet steady)
    micro = (2 * pp, 3 * pp) if k > 3 * pp else (k,)
    small = sum(SIM_FIXED + n * m for n in layers for m in micro)
    if small >= SIM_FIXED + L * k:  # a small model: simulating it whole is cheaper
        return (L,), (k,)
    return layers, micro


def _screen(model: ModelSpec, hw: Hardware, plan: Plan, cal: Calibration, est: MemoryEstimate | None,
            bar: float = math.inf) -> Evaluation:
    if est is not None and est.hbm_bytes > hw.hbm.capacity_bytes * (1 - MARGIN):
        # close to capacity: only the whole model's memory replay can tell
        return _extrapolated(model, hw, plan, cal, est, (model.num_layers,))
    ev = _extrapolated(model, hw, plan, cal, est, _points(model, plan)[0], bar)
    if ev.status != Status.FEASIBLE or ev.exact:
        return ev  # extrapolation under-estimates peaks: a "does not fit" is proven
    if ev.hbm_peak_bytes > hw.hbm.capacity_bytes * 0.97:
        # close to capacity: replay the memory of the whole model (a peak needs at most
        # the micro-batches that can be in flight), keep the extrapolated time
        k = min(plan.grad_accum, 2 * plan.pp)
        r = simulate(model, hw, plan.with_(global_batch=plan.dp * plan.micro_batch * k), cal, keep_timeline=False)
        ev = replace(ev, hbm_peak_bytes=r.hbm.peak_bytes, host_peak_bytes=r.host.peak_bytes)
        if not r.fits:
            return replace(ev, status=Status.NO_FIT, reason="; ".join(r.fit_problems))
    return ev


def _busy(r: StepReport) -> float:
    """Seconds the compute stream is occupied (the step less the stream's waits)."""
    return sum(v for k, v in r.time_breakdown_s.items() if not k.startswith("wait"))


def _compute(r: StepReport) -> float:
    return sum(r.time_breakdown_s.get(c, 0.0) for c in COMPUTE_CATEGORIES)


def _extrapolated(model: ModelSpec, hw: Hardware, plan: Plan, cal: Calibration, est: MemoryEstimate | None,
                  layers: tuple[int, ...], bar: float = math.inf) -> Evaluation:
    """Bilinear extrapolation from simulations at `layers` x the micro-batch points.

    With a `bar` (seconds), the first micro-batch point alone bounds the step from below;
    a plan that cannot beat the bar stops there (Status.BOUNDED)."""
    _, micro = _points(model, plan)
    L, k = model.num_layers, plan.grad_accum
    if layers == (L,) and micro == (k,):
        return from_report(plan, simulate(model, hw, plan, cal, keep_timeline=False), est)
    per_micro = plan.dp * plan.micro_batch
    runs: dict[tuple[int, int], StepReport] = {}
    est_bytes = est.hbm_bytes if est else math.nan
    for i, mk in enumerate(micro):
        for n_layers in layers:
            small = model if n_layers == L else replace(model, num_layers=n_layers)
            runs[(n_layers, mk)] = simulate(small, hw, plan.with_(global_batch=per_micro * mk), cal,
                                            keep_timeline=False)
        if i == 0 and len(micro) > 1 and bar < math.inf:
            # more micro-batches never end sooner, and each adds its compute kernels to the stream
            first = {n: runs[(n, mk)] for n in layers}
            at_l = lambda f: _linear({n: f(r) for n, r in first.items()}, L)  # noqa: E731
            bound = max(at_l(lambda r: r.step_time_s),
                        at_l(_busy) + (k - mk) / mk * at_l(_compute))
            if bound > bar:
                return Evaluation(plan, Status.BOUNDED, f"needs at least {bound:.3g} s per step > {bar:.3g} s",
                                  est_bytes)

    def at(value) -> float:  # bilinear in (layers, micro-batches)
        return _bilinear({key: value(r) for key, r in runs.items()}, layers, micro, L, k)

    step = at(lambda r: r.step_time_s)
    busy = at(lambda r: r.gpu_utilization * r.step_time_s)
    mem_k = micro[0]  # memory stops growing after the first micro-batch(es) in flight
    hbm = _linear({n: runs[(n, mem_k)].hbm.peak_bytes for n in layers}, L)
    host = _linear({n: runs[(n, mem_k)].host.peak_bytes for n in layers}, L)
    r0 = next(iter(runs.values()))
    ev = Evaluation(plan, Status.FEASIBLE, "", est_bytes, step, plan.tokens_per_step / step,
                    model_flops(model, plan) / (step * plan.gpus * r0.peak_flops_per_gpu), busy / step, hbm, host,
                    exact=layers == (L,))
    problems = []
    if hbm > hw.hbm.capacity_bytes:
        problems.append(f"HBM peak {hbm / GB:.1f} GB > {hw.hbm.capacity_bytes / GB:.0f} GB")
    if host > hw.host.capacity_bytes:
        problems.append(f"host peak {host / GB:.1f} GB > {hw.host.capacity_bytes / GB:.0f} GB")
    other = [p for r in runs.values() for p in r.fit_problems if not p.startswith(("HBM peak", "host peak"))]
    problems += sorted(set(other))
    if problems:
        return replace(ev, status=Status.NO_FIT, reason="; ".join(problems))
    return ev


def _linear(values: dict[int, float], x: int) -> float:
    if len(values) == 1:
        return next(iter(values.values()))
    (x0, y0), (x1, y1) = sorted(values.items())
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _bilinear(values: dict[tuple[int, int], float], xs: tuple[int, ...], ys: tuple[int, ...], x: int, y: int) -> float:
    at_y = {yy: _linear({xx: values[(xx, yy)] for xx in xs}, x) for yy in ys}
    return _linear(at_y, y)


# Kernels every micro-batch runs on the compute stream whatever the plan does with
# its state: the forward, backward and loss (not the optimizer, copies or collectives).
COMPUTE_CATEGORIES = tuple(c for c in KERNEL_CATEGORIES
                           if c not in (Category.OPTIMIZER, Category.COMMUNICATION, Category.OTHER))


def compute_class(plan: Plan) -> Plan:
    """The plan with nothing but its computation: no offload, unified memory or launch cost.

    Every plan of the same class runs at least these kernels, one after another on
    the compute stream, so their time is a lower bound on its step time.
    """
    return plan.with_(offload=frozenset(), offload_ratio=1.0, unified_memory=False, cuda_graphs=True,
                      optimizer_impl="fused", zero=0, offload_schedule=OffloadSchedule.AUTO)


def compute_bound(model: ModelSpec, hw: Hardware, plan: Plan, cal: Calibration) -> float:
    """A lower bound on the step time of every plan of `plan`'s class, 0 if it cannot run.

    Several GPUs: the pipeline schedule of the class's compute-stream kernels alone, bubbles
    included (step_floors.compute_time_floor: the op templates priced, no graph built). One GPU: the
    forward/backward kernels of one step (exact: kernel time is affine in layers and linear in
    micro-batches)."""
    if plan.gpus > 1:
        cls = compute_class(plan)
        try:
            return compute_time_floor(model, hw, cls, prepare(model, hw, cls, cal))
        except GhsimError:
            return 0.0
    rep = compute_class(plan).with_(global_batch=plan.dp * plan.micro_batch)  # one micro-batch
    layers, _ = _points(model, plan)
    per_micro = {}
    try:
        for n in layers:
            r = simulate(replace(model, num_layers=n), hw, rep, cal, keep_timeline=False)
            per_micro[n] = _compute(r)
    except GhsimError:
        return 0.0
    return _linear(per_micro, model.num_layers) * plan.grad_accum


def flops_lower_bound(model: ModelSpec, hw: Hardware, plan: Plan) -> float:
    """The step's matrix FLOPs per GPU (recompute included) at the dense peak of its GEMM
    dtype: no kernel runs faster than peak, so no step is shorter."""
    flops = model_flops(model, plan)
    if plan.recompute.value == "full":
        flops *= 4 / 3  # the forward runs twice
    dtype = {"fp32": "fp32", "tf32": "tf32", "fp8": "fp8"}.get(plan.precision.value, "bf16")
    return flops / plan.gpus / hw.peak_flops[dtype]
