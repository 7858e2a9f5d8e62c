"""A step of many identical micro-batches in O(1): the step simulated with K and K + d
micro-batches, then extended by its steady-state period (issue 17 item 10).

Past the pipeline's warm-up every further micro-batch adds the same work in the same order,
so each extensive figure of the step (its time, the breakdown, kernel-busy seconds, bytes
and busy seconds over the host link) grows by one period per micro-batch. That is checked
on every call: the period measured between K - d and K must equal the one between K and
K + d (else ghsim refuses rather than guess), and memory must not change. Ratios (GPU
utilization, shares) are recomputed from the extrapolated figures, not extrapolated.
tests/test_steady_state.py shows the extrapolated step equal to the fully simulated one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ghsim.graph.offload import resolve as resolve_offload
from ghsim.plan import Plan
from ghsim.report.assemble import SteppedPlan, _parallel_section  # (the section, rebuilt for the longer step)
from ghsim.report.host import HostTraffic, traffic_section, unified_memory_section
from ghsim.report.step_report import StepReport, model_flops, step_fields

# relative agreement of the two measured periods (float round-off over a few micro-batches)
PERIOD_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Stepped:
    """A simulated step: its report and what it was assembled from."""

    report: StepReport
    stepped: SteppedPlan


def with_microbatches(plan: Plan, m: int) -> Plan:
    return plan.with_(global_batch=plan.dp * plan.micro_batch * m)


def sample_points(plan: Plan, pp: int, interleave: int, exact_up_to: int, tries: int = 0) -> tuple[int, int]:
    """(K, d): simulate K - d, K and K + d micro-batches. d keeps interleaved pipelines' micro-batch
    count a multiple of pp; K is past the warm-up (every stage has reached 1F1B), K = M mod d,
    and doubles with each try (a step slow to settle: a data loader catching up)."""
    d = pp if interleave > 1 else 1
    k = max(2 * pp * interleave + 2 * d, min(exact_up_to, 8 + 2 * d)) << tries
    k += (plan.grad_accum - k) % d
    return k, d


def _lin(a: float, b: float, steps: float) -> float:
    return b + steps * (b - a)


def steady(z: StepReport, a: StepReport, b: StepReport) -> bool:
    """The period measured between z and a equals the one between a and b, and memory is settled."""
    p1, p2 = a.step_time_s - z.step_time_s, b.step_time_s - a.step_time_s
    if abs(p1 - p2) > PERIOD_TOLERANCE * b.step_time_s:
        return False
    return all(abs(getattr(a, tier).peak_bytes - getattr(b, tier).peak_bytes)
               <= 1e-9 * max(getattr(b, tier).peak_bytes, 1.0) for tier in ("hbm", "host"))


def extrapolate(z: Stepped, a: Stepped, b: Stepped, plan: Plan, um_of: Callable[[Plan], object] | None) -> StepReport:
    """The step of `plan` (M micro-batches) from steady steps of K - d, K, K + d micro-batches (z, a, b)."""
    ra, rb, sb = a.report, b.report, b.stepped
    steps = (plan.grad_accum - rb.plan["grad_accum"]) / (rb.plan["grad_accum"] - ra.plan["grad_accum"])
    step_time = _lin(ra.step_time_s, rb.step_time_s, steps)
    keys = list(dict.fromkeys([*rb.time_breakdown_s, *ra.time_breakdown_s]))
    breakdown = {k: _lin(ra.time_breakdown_s.get(k, 0.0), rb.time_breakdown_s.get(k, 0.0), steps) for k in keys}
    busy = _lin(ra.gpu_utilization * ra.step_time_s, rb.gpu_utilization * rb.step_time_s, steps)
    extra = dict(rb.extra)
    if "offload" in extra:
        extra["offload"] = _offload(ra.extra["offload"], rb.extra["offload"], steps, breakdown, plan, sb)
    if "unified_memory" in extra and um_of is not None:
        extra["unified_memory"] = unified_memory_section(um_of(plan), breakdown, step_time)
    if "parallel" in extra:
        stages_a, stages_b = ra.extra["parallel"]["stages"], rb.extra["parallel"]["stages"]
        stage_busy = [_lin(x["busy_s"], y["busy_s"], steps) for x, y in zip(stages_a, stages_b)]
        extra["parallel"] = _parallel_section(replace(sb, plan=plan), stage_busy,
                                              rb.extra["parallel"]["representative_stage"], breakdown, step_time)
    note = (f"{plan.grad_accum} identical micro-batches: simulated {ra.plan['grad_accum']} and "
            f"{rb.plan['grad_accum']}, the step extended by their steady-state period "
            f"({(rb.step_time_s - ra.step_time_s) / (rb.plan['grad_accum'] - ra.plan['grad_accum']) * 1e3:.3f} ms "
            f"per micro-batch); the timeline shows the first {rb.plan['grad_accum']}")
    return replace(rb, step_time_s=step_time, gpu_utilization=min(1.0, busy / step_time) if step_time else 0.0,
                   time_breakdown_s=breakdown, notes=rb.notes + (note,), extra=extra,
                   **{k: v for k, v in step_fields(sb.model, sb.hw, plan, model_flops(sb.model, plan)).items()
                      if k in ("tokens_per_step", "model_flops_per_step", "plan")})


def _offload(a: dict, b: dict, steps: float, breakdown: dict[str, float], plan: Plan, s: SteppedPlan) -> dict:
    busy = tuple(_lin(a["busy_s"][k], b["busy_s"][k], steps) for k in b["busy_s"])
    traffic = HostTraffic(_lin(a["bytes_h2d"], b["bytes_h2d"], steps), _lin(a["bytes_d2h"], b["bytes_d2h"], steps),
                          busy, _lin(a["cpu_optimizer_s"], b["cpu_optimizer_s"], steps))
    section = traffic_section(traffic, breakdown, plan, resolve_offload(plan), s.hw)
    return {**section, **({"per_gpu": True} if b.get("per_gpu") else {})}
