"""Fit a calibration overlay (cost/overlay.py) on one measured run: `ghsim calibrate --trace`.

The run's trace window is matched to ghsim's prediction of the same plan (traces/matching.py),
then, in this order, each figure the trace shows is fitted as measured / predicted time:
1. kernel time per category (GEMM and attention per dtype); communication is not fitted, since
   an NCCL kernel's duration includes the time it waits for its peers;
2. host<->device copy time per direction (the achieved rate, bytes over time);
3. GPU idle between back-to-back kernels (gaps under 10 us) against the predicted launch gaps;
4. what is left of the step time, where the prediction says the GPU waits on the host: the CPU
   optimizer's time when an offloaded optimizer keeps the GPU waiting, else the host time per
   launched kernel when the host launch path does. A GPU-bound step constrains neither, and
   neither is fitted from it.
A trace that does not describe the stated plan (another GPU, a model of another size, another
framework's kernels) is refused with the reason instead of fitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from ghsim.cost.calibration import Calibration
from ghsim.cost.overlay import (COPY_DIRECTIONS, FACTOR_RANGE, Figure, Overlay, apply, copy_key, cpu_optimizer_key,
                                kernel_key, launch_key, model_shape)
from ghsim.errors import GhsimError
from ghsim.graph.ops import Category, Kind
from ghsim.hardware import Hardware, gpu_chips
from ghsim.model import ModelSpec
from ghsim.plan import Plan
from ghsim.report.step_report import Stall
from ghsim.traces.matching import SMALL_GAP_S, MeasuredWindow, StepFigures, match_categories, measure, predicted

# Measured / predicted beyond these bounds: the trace ran another plan. GEMM time: another size
# (micro-batch, sequence, model width). GEMM kernels per step: another depth or projection layout
# (eager plans of the validation cases and measured libraries: 0.96-1.25, LoRA 1.44; Megatron's
# fused QKV and fc1: 12 per layer against 21). All kernels: another framework; loose, since
# DeepSpeed's offloaded step launches up to 2.7x the kernels ghsim counts (per-tensor optimizer work).
PLAN_MATCH = (0.6, 1 / 0.6)
GEMM_COUNT_MATCH = (0.7, 1.6)
KERNEL_COUNT_MATCH = (1 / 3, 3.0)
RESIDUAL_SHARE = 0.05  # a host wait under this share of the predicted step constrains nothing
MINOR_SHARE = 0.01  # a kernel category under this share of the kernel time on either side is not fitted
_KINDS_OF = {Category.GEMM: (Kind.GEMM,), Category.ATTENTION: (Kind.ATTN_FWD, Kind.ATTN_BWD)}

Simulator = Callable[[Calibration], object]  # calibration -> StepReport of the stated plan


def check_gpu(window: MeasuredWindow, hw: Hardware) -> None:
    measured, profile = gpu_chips(window.gpu_name or ""), gpu_chips(hw.gpu_model)
    if measured and profile and not measured & profile:
        raise GhsimError(f"{window.source}: measured on {window.gpu_name}, not on {hw.name}'s {hw.gpu_model}; "
                         f"give --hardware the profile of the GPU the trace ran on")


def check_plan(window: MeasuredWindow, pred: StepFigures, plan: Plan) -> None:
    """Refuse a trace whose GEMM time, kernel count or optimizer kernels say it ran another plan."""
    m = window.figures
    where = f"{window.source} ({window.label})"
    gemm_m, gemm_p = m.kernel_s.get(Category.GEMM, 0.0), pred.kernel_s.get(Category.GEMM, 0.0)
    if gemm_p > 0 and not PLAN_MATCH[0] <= gemm_m / gemm_p <= PLAN_MATCH[1]:
        raise GhsimError(f"{where}: its GEMM kernels take {gemm_m * 1e3:.1f} ms per step, the stated plan "
                         f"({plan.flags()}) predicts {gemm_p * 1e3:.1f} ms ({gemm_m / gemm_p:.2f}x): a model of "
                         f"another size, or another micro-batch, sequence or precision? give the run's own flags")
    gemms = (m.gemm_count, pred.gemm_count)
    if all(gemms) and not GEMM_COUNT_MATCH[0] <= gemms[0] / gemms[1] <= GEMM_COUNT_MATCH[1]:
        raise GhsimError(f"{where}: {gemms[0]:.0f} GEMM kernels per step, the stated plan launches {gemms[1]:.0f}: "
                         f"a model of another depth, another framework (fused projections) or recompute? give the "
                         f"run's own --model, --framework and plan flags")
    counts = (m.kernel_count, pred.kernel_count)
    if all(counts) and not KERNEL_COUNT_MATCH[0] <= counts[0] / counts[1] <= KERNEL_COUNT_MATCH[1]:
        raise GhsimError(f"{where}: {counts[0]:.0f} kernels per step, the stated plan launches {counts[1]:.0f}: "
                         f"another framework (fused vs eager kernels)? give the run's own --framework")
    # optimizer kernels where the plan has none, or none where it has many: the optimizer ran elsewhere
    opt_m, opt_p = m.kernel_s.get(Category.OPTIMIZER, 0.0), pred.kernel_s.get(Category.OPTIMIZER, 0.0)
    if opt_p > 0.05 * sum(pred.kernel_s.values()) and opt_m == 0:
        raise GhsimError(f"{where}: no optimizer kernels, while the stated plan runs AdamW on the GPU "
                         f"({opt_p * 1e3:.1f} ms per step): was the optimizer offloaded (--offload optimizer)?")
    if opt_m > 0.05 * sum(m.kernel_s.values()) and opt_p == 0:
        raise GhsimError(f"{where}: optimizer kernels take {opt_m * 1e3:.1f} ms per step, while the stated plan "
                         f"runs the optimizer on the host: drop --offload optimizer?")


def _dominant_dtype(report, category: str) -> str:
    """The dtype most of a category's predicted kernel time runs in (the key its factor is kept under)."""
    tl = report.timeline
    by_dtype: dict[str, float] = {}
    for i, op in enumerate(tl.ops if tl is not None else ()):
        if op.kind in _KINDS_OF[category]:
            by_dtype[op.dtype] = by_dtype.get(op.dtype, 0.0) + float(tl.schedule.end[i] - tl.schedule.start[i])
    return max(by_dtype, key=by_dtype.get) if by_dtype else "bf16"


def _attention_shapes(report) -> tuple[tuple[int, ...], ...]:
    tl = report.timeline
    return tuple(sorted({tuple(op.shape) for op in (tl.ops if tl is not None else ())
                         if op.kind in _KINDS_OF[Category.ATTENTION] and op.shape}))


def _checked(factor: float | None, what: str, where: str) -> float:
    if not FACTOR_RANGE[0] <= factor <= FACTOR_RANGE[1]:
        raise GhsimError(f"{where}: {what} is {factor:.3g}x the prediction, beyond what a correction of this plan "
                         f"can be ({FACTOR_RANGE[0]}-{FACTOR_RANGE[1]}x): is it the run of the stated plan?")
    return factor


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def fit_overlay(trace, steps: str | None, model: ModelSpec, model_name: str, hw: Hardware, plan: Plan,
                cal: Calibration, simulate: Simulator, out_path: str = "", step_time_s: float | None = None) -> Overlay:
    """The overlay that makes ghsim's prediction of `plan` match the trace window's step.
    `step_time_s`: the run's step timed without the profiler, which lengthens a host-bound step;
    the host-time fit targets it instead of the trace's fastest profiled step."""
    if step_time_s is not None and not 0 < step_time_s < 1e6:
        raise GhsimError(f"--step-time-ms must be a positive number of milliseconds, got {step_time_s * 1e3:g}")
    window = measure(trace, steps)
    check_gpu(window, hw)
    report = simulate(cal)
    pred = predicted(report)
    check_plan(window, pred, plan)
    s = "s" if window.steps > 1 else ""
    cite = Cite(f"{Path(trace.source).name} {window.label} ({window.steps} step{s}"
                f"{', ' + window.gpu_name if window.gpu_name else ''}; plan {plan.flags()})",
                f"{trace.source} ({window.label})")
    not_fitted: dict[str, str] = {}
    kernel = _kernel_figures(window.figures, pred, report, cite, not_fitted)
    copy = _copy_figures(window.figures, pred, plan, cite, not_fitted)
    host = _gap_figure(window.figures, pred, cite)
    overlay = Overlay(out_path, hw.name, hw.gpu_model, window.gpu_name or "", cal.name, model_name, model_shape(model),
                      plan.flags(), plan.precision.value, str(trace.source), window.label, kernel, copy, host,
                      not_fitted, window.notes)
    return _fit_host_wait(overlay, window, cal, plan, simulate, cite.text, step_time_s)


@dataclass(frozen=True)
class Cite:
    text: str  # what every figure's source starts with: trace file, window, GPU, plan
    where: str  # the trace and window, for a refusal


def _kernel_figures(m: StepFigures, pred: StepFigures, report, cite: Cite, not_fitted: dict) -> dict[str, Figure]:
    """Measured / predicted kernel time per category (communication and minor categories left out)."""
    out = {}
    total_m, total_p = sum(m.kernel_s.values()) or 1.0, sum(pred.kernel_s.values()) or 1.0
    for match in match_categories(m, pred):
        c, meas, want = match.category, match.measured_s, match.predicted_s
        if c == Category.COMMUNICATION:
            if meas:
                not_fitted[c] = (f"NCCL kernels' durations include the time they wait for their peers "
                                 f"({_ms(meas)}/step measured, {_ms(want)} predicted)")
            continue
        if min(meas / total_m, want / total_p) < MINOR_SHARE:
            if meas or want:
                not_fitted[c] = (f"{_ms(meas)}/step measured, {_ms(want)} predicted: under {MINOR_SHARE:.0%} of "
                                 f"the kernel time on one side, too little to scale")
            continue
        shapes = _attention_shapes(report) if c == Category.ATTENTION else ()
        at = f" at (batch, heads, kv heads, seq, head dim) {', '.join(map(str, shapes))}" if shapes else ""
        key = kernel_key(c, _dominant_dtype(report, c) if c in _KINDS_OF else "")
        out[key] = Figure(_checked(match.ratio, f"{c} kernel time", cite.where),
                          f"{cite.text}: {c} kernels {_ms(meas)}/step measured vs {_ms(want)} predicted{at}",
                          {"measured_ms": meas * 1e3, "predicted_ms": want * 1e3}, shapes)
    return out


def _copy_figures(m: StepFigures, pred: StepFigures, plan: Plan, cite: Cite, not_fitted: dict) -> dict[str, Figure]:
    """Copy time per direction, as the ratio of the achieved rates (the prediction's copies may be
    one micro-batch's, the trace's a whole step's)."""
    out = {}
    for d in COPY_DIRECTIONS:
        mc, pc = m.copies[d], pred.copies[d]
        if mc.bytes and mc.seconds and pc.rate:
            kinds = ", ".join(m.memory_kinds) or "host memory kind not recorded"
            out[copy_key(d, plan)] = Figure(_checked(pc.rate / mc.rate, f"{d} copy time", cite.where),
                            f"{cite.text}: {d} copies {mc.bytes / 1e9:.2f} GB/step at {mc.rate / 1e9:.1f} GB/s "
                            f"measured ({kinds}) vs {pc.rate / 1e9:.1f} GB/s predicted",
                            {"measured_GBps": mc.rate / 1e9, "predicted_GBps": pc.rate / 1e9})
        elif mc.bytes or pc.bytes:
            not_fitted[f"copy_{d}"] = (f"{mc.bytes / 1e9:.2f} GB/step measured, {pc.bytes / 1e9:.2f} GB predicted: "
                                       f"nothing on one side to scale")
    return out


def _gap_figure(m: StepFigures, pred: StepFigures, cite: Cite) -> dict[str, Figure]:
    """GPU idle in gaps under SMALL_GAP_S (back-to-back kernels) against the predicted launch gaps."""
    if not (m.small_gap_s and pred.small_gap_s):
        return {}
    return {"kernel_gap": Figure(
        _checked(m.small_gap_s / pred.small_gap_s, "idle between kernels", cite.where),
        f"{cite.text}: GPU idle in gaps under {SMALL_GAP_S * 1e6:g} us {_ms(m.small_gap_s)}/step measured vs "
        f"{_ms(pred.small_gap_s)} predicted launch gaps",
        {"measured_ms": m.small_gap_s * 1e3, "predicted_ms": pred.small_gap_s * 1e3})}


def _fit_host_wait(overlay: Overlay, window: MeasuredWindow, cal: Calibration, plan: Plan, simulate: Simulator,
                   cite: str, timed_s: float | None) -> Overlay:
    """Fit the remaining step time to the host wait the prediction shows (see the module docstring)."""
    notes = dict(overlay.not_fitted)
    target = timed_s or window.figures.step_time_s
    measured_as = ("timed without the profiler (--step-time-ms)" if timed_s else
                   f"the fastest of {len(window.step_times_s) or 1} profiled")
    if target is None:
        notes["host"] = "the input has no timeline (nsys stats CSV): no step time to fit host time against"
        return replace(overlay, not_fitted=notes)
    report = simulate(apply(cal, overlay))
    step, waits = report.step_time_s, report.time_breakdown_s
    impl = _cpu_impl(report)
    candidates = ((cpu_optimizer_key(impl, plan) if impl else "", Stall.WAIT_CPU), (launch_key(plan), Stall.WAIT_HOST_LAUNCH))
    figure, wait = next(((name, waits[key]) for name, key in candidates
                         if name and waits.get(key, 0.0) >= RESIDUAL_SHARE * step), (None, 0.0))
    if figure is None:
        host_wait = sum(waits.get(k, 0.0) for k in (Stall.WAIT_CPU, Stall.WAIT_HOST_LAUNCH))
        notes["host"] = (f"the GPU waited on the host {host_wait * 1e3:.1f} ms of the {step * 1e3:.1f} ms predicted "
                         f"step: host time per kernel and the CPU optimizer's rate are not constrained by this trace "
                         f"({target * 1e3:.1f} ms measured)")
        return replace(overlay, not_fitted=notes)

    def step_with(f: float) -> float:
        trial = replace(overlay, host={**overlay.host, figure: Figure(f, "")})
        return simulate(apply(cal, trial)).step_time_s

    factor = _solve(step_with, target)
    what = "host time per launched kernel" if figure.startswith("launch:") else f"CPU optimizer ({impl}) time"
    source = (f"{cite}: step {target * 1e3:.1f} ms measured ({measured_as}) vs "
              f"{step * 1e3:.1f} ms predicted after the kernel, copy and gap factors, of which "
              f"{wait * 1e3:.1f} ms the GPU waits on the {what}; this factor on it closes the difference")
    lo, hi = FACTOR_RANGE
    if factor <= lo * 1.01 or factor >= hi * 0.99:
        notes[figure] = f"{what}: no factor in [{lo}, {hi}] matches the measured step ({source})"
        return replace(overlay, not_fitted=notes)
    detail = {"measured_step_ms": target * 1e3, "predicted_step_ms": step * 1e3, "predicted_wait_ms": wait * 1e3}
    return replace(overlay, host={**overlay.host, figure: Figure(factor, source, detail)}, not_fitted=notes)


def _cpu_impl(report) -> str | None:
    """The CPU AdamW implementation the predicted step runs on the host, if any."""
    for op in report.timeline.ops if report.timeline is not None else ():
        if op.kind == Kind.OPT_CPU:
            return str(getattr(op.variant, "value", op.variant))
    return None


def _solve(step_with: Callable[[float], float], target: float, iterations: int = 14) -> float:
    """The factor whose simulated step matches `target` (the step grows with it): bisection in log space."""
    lo, hi = (math.log(x) for x in FACTOR_RANGE)
    if step_with(math.exp(lo)) >= target:
        return math.exp(lo)
    if step_with(math.exp(hi)) <= target:
        return math.exp(hi)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if step_with(math.exp(mid)) < target:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)
