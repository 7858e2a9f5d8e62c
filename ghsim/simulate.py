"""simulate(): model + hardware + plan -> StepReport. The one entry point the CLI, the
search and the validation call."""

from __future__ import annotations


from ghsim.cost.calibration import Calibration, load_calibration
from ghsim.cost.compute import CostModel, LaunchCosts
from ghsim.cost.hostlink import HostSide
from ghsim.graph.offload import adjust_static_hbm, check_host_capacity, check_offload
from ghsim.graph.offload import host_static_bytes as offload_host_static
from ghsim.graph.offload import resolve as resolve_offload
from ghsim.graph.unified_memory import UnifiedMemoryUse, apply_unified_memory, resident_peak
from ghsim.host_summary import offload_section, per_node, unified_memory_section
from ghsim.errors import GhsimError
from ghsim.graph.parallel import check_layout
from ghsim.graph.step import build_step, param_counts, static_bytes
from ghsim.hardware import Hardware
from ghsim.model import ModelSpec
from ghsim.plan import Plan, Precision, check_plan
from ghsim.breakdown import OpColumns, window
from ghsim.report import BREAKDOWN_KEYS, StepReport, Timeline, fit_problems, mfu_dtype, model_flops, step_fields
from ghsim.sim import engine
from ghsim.sim.memory import hbm_peak, host_peak
from ghsim.simulate_parallel import simulate_parallel

RESOURCES = (
    engine.Resource("gpu"),  # the compute stream
    engine.Resource("h2d"),  # copy engine, host to device
    engine.Resource("d2h"),  # copy engine, device to host
    engine.Resource("cpu"),  # host cores doing optimizer or data work
)


def check_fit_to_model(model: ModelSpec, hw: Hardware, plan: Plan) -> None:
    """Plan choices the model or the hardware cannot honour: one clear line each."""
    check_plan(plan)
    if plan.gpus > 1:
        check_layout(model, hw, plan)
    if plan.seq > model.max_seq_len * 64:
        raise GhsimError(f"--seq {plan.seq} is far beyond {model.name}'s context ({model.max_seq_len})")
    if plan.unified_memory and not hw.unified_memory.supported:
        raise GhsimError(f"{hw.name} does not support unified memory")
    if plan.lora_rank and plan.lora_rank > model.hidden_size:
        raise GhsimError(f"--lora-rank {plan.lora_rank} exceeds the hidden size {model.hidden_size}")
    if plan.precision == Precision.FP8 and plan.lora_rank:
        raise GhsimError("fp8 with LoRA is not modeled: LoRA adapters run in bf16 (drop --precision fp8)")


def simulate(model: ModelSpec, hw: Hardware, plan: Plan, calibration: Calibration | None = None,
             keep_timeline: bool = True) -> StepReport:
    check_fit_to_model(model, hw, plan)
    if plan.gpus > 1:  # one rank per pipeline stage, the others by symmetry
        return simulate_parallel(model, hw, plan, calibration or load_calibration(hw.calibration), keep_timeline)
    check_offload(plan)
    cal = calibration or load_calibration(hw.calibration)
    host_side = HostSide.of(hw, plan, cal)  # per-GPU shares of host link, CPU and host memory
    counts = param_counts(model, plan)
    host_static = offload_host_static(model, plan, counts.trainable, counts.total)  # per GPU
    check_host_capacity(host_static, host_side.node_gpus, hw.host.capacity_bytes, hw.name, plan)
    cost = CostModel(hw, cal, host_side, LaunchCosts.of(hw, cal, plan))
    graph = build_step(model, plan, price=cost.duration)
    hbm_static = adjust_static_hbm(static_bytes(model, plan),
                                   static_bytes(model, plan.with_(offload=frozenset())).get("optimizer_states", 0.0),
                                   model, plan)
    um = None
    if plan.unified_memory:  # pages beyond HBM spill to the host and come back on demand
        graph, um = apply_unified_memory(graph, hbm_static, hw, cost.duration)
        host_static = {**host_static, "um_spilled": um.spilled_bytes} if um.spilled_bytes else host_static
    ops = graph.ops
    resources = RESOURCES + (engine.Resource("loader"),)  # data-loader pool, releasing batches at its rate
    names = [r.name for r in resources]
    sched, lead_gap = engine.run_ops(resources, ops, graph.deps, lambda o: cost.issue_cost(o, plan.cuda_graphs),
                                     lambda o: cost.kernel_gap(o, plan.cuda_graphs))
    timeline = Timeline(ops, names, sched, graph.deps, graph.layer, graph.microbatch, lead_gap)
    step_time = sched.makespan
    whole = window(timeline, 0.0, step_time, OpColumns.of(*engine.distinct(ops)))
    breakdown = {**dict.fromkeys(BREAKDOWN_KEYS, 0.0), **whole.breakdown}
    utilization = min(1.0, whole.kernel_busy / step_time) if step_time else 0.0
    hbm = hbm_peak(ops, hbm_static)
    if um is not None:
        hbm = resident_peak(hbm, hw.hbm.capacity_bytes)
    host = per_node(host_peak(ops, host_static), host_side.node_gpus)
    problems = fit_problems(hbm, host, hw, check_hbm=um is None)
    peak_dtype = mfu_dtype(plan.precision.value)
    notes = [f"precision semantics: {plan.framework.value}"
             + (" (frozen base weights in 16 bits, fp32 adapters under autocast)" if plan.lora_rank and
                plan.precision.is_mixed else
                " (fp32 params, autocast casts weights and inputs per op)" if plan.framework.value == "torch-amp"
                and plan.precision.is_mixed else ""),
             f"MFU is relative to the {peak_dtype} dense peak"]
    if plan.zero:  # accepted, as DeepSpeed accepts it: sharding over one rank changes nothing
        notes.append(f"ZeRO stage {plan.zero} on one GPU shards over one rank: no saving, simulated as stage 0"
                     + (" (offload still applies)" if plan.offload else ""))
    return StepReport(
        step_time_s=step_time,
        **step_fields(model, hw, plan, model_flops(model, plan)),
        gpu_utilization=utilization,
        time_breakdown_s=breakdown,
        hbm=hbm,
        host=host,
        fit_problems=tuple(problems),
        notes=tuple(notes),
        timeline=timeline if keep_timeline else None,
        extra=_host_sections(timeline, breakdown, plan, hw, um, step_time),
    )


def _host_sections(timeline: Timeline, breakdown: dict[str, float], plan: Plan, hw: Hardware,
                   um: UnifiedMemoryUse | None, step_time: float) -> dict:
    """The report's "offload" and "unified_memory" sections, for plans that have them."""
    out = {}
    if resolve_offload(plan).any:
        out["offload"] = offload_section(timeline, breakdown, plan, hw)
    if um is not None:
        out["unified_memory"] = unified_memory_section(um, breakdown, step_time)
    return out
