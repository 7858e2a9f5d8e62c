"""The StepReport of a simulated step, assembled once for every layout (one GPU is tp = pp = dp = 1):
where the busiest pipeline stage's time went, the "parallel", "offload" and "unified_memory"
sections, and the notes that say what was assumed."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ghsim.report.breakdown import Segment
from ghsim.cost.hostlink import HostSide
from ghsim.cost.links import NCCL_CTAS, Fabric
from ghsim.graph.offload import OffloadSetup, resolve as resolve_offload
from ghsim.graph.step import trainable_tensor_sizes
from ghsim.graph.ops import Category, Phase, Resource
from ghsim.graph.parallel import Layout
from ghsim.model import simulation_notes
from ghsim.graph.pipeline import PipelineSegment
from ghsim.sim.pipeline import PipelineRun
from ghsim.graph.unified_memory import UnifiedMemoryUse
from ghsim.sim.unified_memory import resident_peak
from ghsim.hardware import Hardware
from ghsim.report.host import HostTraffic, traffic_section, unified_memory_section
from ghsim.model import ModelSpec
from ghsim.plan import Plan
from ghsim.report.step_report import BREAKDOWN_KEYS, Stall, StepReport, Timeline, fit_problems, mfu_dtype, model_flops, step_fields
from ghsim.sim.memory import TierPeak, hbm_replay

# what a gap on a stage's compute stream waited for, by the segment of the op it waited on
_GAP_KEYS = {PipelineSegment.COMM: Category.COMMUNICATION, PipelineSegment.DATA: Stall.WAIT_CPU}
# with one data-parallel rank the link after a backward carries no collective, only offloaded
# gradients still landing on the host: the stage waits for a transfer, and no NCCL kernel runs
_ONE_RANK_GAP_KEYS = {**_GAP_KEYS, PipelineSegment.COMM: Stall.WAIT_TRANSFER}
# which kernel-level window a compute-stream op of the schedule stands for (sets: read per op)
_FINAL_SEGMENTS = frozenset({PipelineSegment.FINAL_FWD, PipelineSegment.FINAL_BWD})
_FORWARD_SEGMENTS = frozenset({PipelineSegment.FWD, PipelineSegment.FINAL_FWD})
_OPT_SEGMENT = PipelineSegment.OPT
_FWD, _BWD, _OPT = Phase.FWD, Phase.BWD, Phase.OPT  # the kernel-level run's windows (MicrobatchRun.segments)


@dataclass(frozen=True)
class SteppedPlan:
    """What the simulator found for a plan, ready to be reported."""

    model: ModelSpec
    hw: Hardware
    plan: Plan
    layout: Layout
    host_side: HostSide
    fabric: Fabric
    runs: dict  # chunk kind -> (final, middle) MicrobatchRun
    kind_of: list  # chunk kind of each virtual stage
    pipe: PipelineRun
    stages: list  # per stage: (HBM TierPeak of one GPU, host TierPeak of its node)
    worst: int  # the stage with the highest HBM peak
    model_states: list  # per stage: its model-state bytes
    scheduled_microbatches: int  # micro-batches the pipeline scheduled (1: the step ran as one chain)
    unified_memory: UnifiedMemoryUse | None = None


def assemble(s: SteppedPlan, keep_timeline: bool) -> StepReport:
    """The report: step time and breakdown of the busiest stage, memory of the worst ones, sections."""
    pipe, layout, plan, hw = s.pipe, s.layout, s.plan, s.hw
    step_time = pipe.schedule.makespan
    gpu_ops, last_end = _ops_by_stage(pipe, layout.pp)
    dur = pipe.schedule.end - pipe.schedule.start
    busy = [float(dur[ops].sum()) for ops in gpu_ops]
    rep = max(range(layout.pp), key=lambda d: busy[d])  # the busiest stage: the pipeline's bottleneck
    breakdown, utilization = _stage_breakdown(pipe, gpu_ops[rep], last_end[rep], step_time, s.runs, s.kind_of,
                                              layout.pp, _ONE_RANK_GAP_KEYS if layout.dp == 1 else _GAP_KEYS)
    hbm, host, problems = _memory(s)
    offload = resolve_offload(plan)
    extra = {**_offload_extra(plan, offload, hw, s.runs, s.kind_of, rep, layout, breakdown, s.scheduled_microbatches)}
    if layout.gpus > 1:
        extra = {"parallel": _parallel_section(s, busy, rep, breakdown, step_time), **extra}
    if s.unified_memory is not None:
        extra["unified_memory"] = unified_memory_section(s.unified_memory, breakdown, step_time)
    timeline, hbm, host = _timeline(s, hbm, host) if keep_timeline else (None, hbm, host)
    return StepReport(
        step_time_s=step_time,
        **step_fields(s.model, hw, plan, model_flops(s.model, plan)),
        gpu_utilization=utilization,
        time_breakdown_s=breakdown,
        hbm=hbm,
        host=host,
        fit_problems=tuple(problems),
        notes=tuple(_notes(plan, offload, layout, hw, s.host_side, trainable_tensor_sizes(
                        s.model, plan, layout.tp * (layout.dp if plan.zero >= 1 else 1)))
                    + simulation_notes(s.model, plan.seq)),
        timeline=timeline,
        extra=extra,
    )


def _memory(s: SteppedPlan) -> tuple[TierPeak, TierPeak, tuple[str, ...]]:
    """HBM of the worst stage's GPU, host memory of the fullest node, and what does not fit.
    Under unified memory HBM holds at most its capacity and the spill sits on the host."""
    hbm = replace(s.stages[s.worst][0], curve=None)  # the curve follows one micro-batch, not the step
    host = replace(max((h for _, h in s.stages), key=lambda h: h.peak_bytes), curve=None)
    um = s.unified_memory
    if um is not None:
        hbm = resident_peak(hbm, s.hw.hbm.capacity_bytes)
        if um.spilled_bytes:
            node = s.host_side.node_gpus
            host = TierPeak(host.peak_bytes + um.spilled_bytes * node, host.peak_op,
                            {**host.breakdown, "um_spilled": um.spilled_bytes * node}, None)
    where = f" on pipeline stage {s.worst}" if s.layout.pp > 1 else ""
    return hbm, host, fit_problems(hbm, host, s.hw, where, check_hbm=um is None)


def _timeline(s: SteppedPlan, hbm: TierPeak, host: TierPeak) -> tuple[Timeline, TierPeak, TierPeak]:
    """One stage and one micro-batch: the kernel-level run is the step, and the memory curves
    follow its ops (HBM replayed from what the stage's replay starts with, its static bytes: the
    leading pipeline marker adds none with one stage). Otherwise the pipeline's ops, no curves."""
    pipe = s.pipe
    if s.layout.chunks > 1 or s.scheduled_microbatches > 1:
        return Timeline(pipe.graph.ops, [r.name for r in pipe.resources], pipe.schedule, pipe.graph.deps,
                        pipe.graph.layer, pipe.graph.microbatch), hbm, host
    final = s.runs[s.kind_of[0]][0]
    stage_hbm, stage_host = s.stages[0]
    if stage_hbm.curve is not None and len(stage_hbm.curve):
        curve, _, _ = hbm_replay(final.timeline.ops, float(stage_hbm.curve[0]))
        if s.unified_memory is not None:
            curve = np.minimum(curve, s.hw.hbm.capacity_bytes)
        hbm = replace(hbm, curve=curve)
    if stage_host.curve is not None and len(stage_host.curve) == len(final.timeline.ops):
        host = replace(host, curve=stage_host.curve)  # (unified memory inserts ops: no host curve then)
    return final.timeline, hbm, host


def _parallel_section(s: SteppedPlan, busy: list[float], rep: int, breakdown: dict[str, float],
                      step_time: float) -> dict:
    layout, M, stage_mem = s.layout, s.plan.grad_accum, s.stages
    bubble = breakdown.get(Stall.PIPELINE_BUBBLE, 0.0)
    exposed = breakdown.get(Category.COMMUNICATION, 0.0)
    return {
        "summary": (f"tp {layout.tp} x pp {layout.pp} x dp {layout.dp} on {layout.nodes} node(s); {M} micro-batch(es) "
                    f"per rank; pipeline bubble {bubble / step_time:.1%}, communication on the critical path "
                    f"{exposed * 1e3:.1f} ms (stage {rep})") if step_time > 0 else "",
        "layout": {"gpus": layout.gpus, "tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep,
                   "gpus_per_node": layout.gpus_per_node, "nodes": layout.nodes, "interleave": layout.interleave,
                   "sequence_parallel": layout.split().sequence_parallel, "micro_batches": M},
        "groups": {name: {"size": g.size, "per_node": g.per_node, "nodes": g.nodes,
                          "bus_bandwidth_Bps": s.fabric.bus_bw(g) if g.size > 1 else 0.0}
                   for name, g in layout.groups().items()},
        "representative_stage": rep,
        "pipeline_bubble_fraction": bubble / step_time if step_time > 0 else 0.0,
        "stages": [{"stage": d, "busy_s": busy[d], "idle_s": step_time - busy[d],
                    "hbm_peak_bytes": stage_mem[d][0].peak_bytes,
                    "memory_breakdown": {k: float(b) for k, b in stage_mem[d][0].breakdown.items()},
                    "model_state_bytes": s.model_states[d]}
                   for d in range(layout.pp)],
        **({"stage_layers": list(layout.stage_layers)} if layout.stage_layers else {}),
        "microbatch": {_kind_name(k, bool(layout.stage_layers)):
                       {"forward_s": r[0].times["t_fwd"], "backward_s": r[0].times["t_bwd"] - r[0].times["t_fwd"],
                        "grad_reduction_tail_s": max(0.0, r[0].times["t_dp"] - r[0].times["t_bwd"]),
                        "optimizer_s": r[0].times["t_opt"] - max(r[0].times["t_bwd"], r[0].times["t_dp"])}
                       for k, r in s.runs.items()},
    }


def _kind_name(chunk, uneven: bool) -> str:
    """first / last / firstlast / middle; an uneven split's middle chunks differ in layers, so say them."""
    name = ("first" if chunk.first else "") + ("last" if chunk.last else "") or "middle"
    return f"{name} ({chunk.layers} layers)" if uneven else name


def _ops_by_stage(pipe: PipelineRun, pp: int) -> tuple[list[list[int]], list[float]]:
    """Each stage's compute-stream ops, in order, and the time its last op of any kind ends."""
    gpu = [[] for _ in range(pp)]
    last_end = [0.0] * pp
    end = pipe.schedule.end
    compute = Resource.GPU.value  # the compute stream of a stage: "gpu", or per stage "gpu0", "gpu1", ...
    for i, op in enumerate(pipe.graph.ops):
        d = pipe.stage_of[i]
        if op.resource.startswith(compute):
            gpu[d].append(i)
        if end[i] > last_end[d]:
            last_end[d] = float(end[i])
    return gpu, last_end


def _stage_breakdown(pipe: PipelineRun, gpu_ops: list[int], last_end: float, step_time: float,
                     runs, kind_of, pp: int, gap_keys: dict[str, str]) -> tuple[dict[str, float], float]:
    """A stage's compute stream over the step (its ops `gpu_ops`): each aggregated op's kernel-level
    breakdown, the gaps between them (pipeline bubbles, or exposed gradient reduction); and its
    kernel-busy share of the step."""
    g, sched = pipe.graph, pipe.schedule
    bubble, communication = Stall.PIPELINE_BUBBLE, Category.COMMUNICATION
    out: dict[str, float] = dict.fromkeys(BREAKDOWN_KEYS + (bubble,), 0.0)
    cursor, kernel = 0.0, 0.0
    for i in gpu_ops:
        s, e = sched.start[i], sched.end[i]
        if s > cursor:
            waited = [k for k in g.deps[i] if abs(sched.end[k] - s) < 1e-12]
            key = gap_keys.get(next((pipe.segment[k] for k in waited if pipe.segment[k] in gap_keys), ""), bubble)
            out[key] += s - cursor
            if key == communication:  # NCCL kernels run while the compute stream waits
                kernel += s - cursor
        seg = _segment_of(pipe, i, runs, kind_of, pp)
        if seg is not None and seg.seconds > 0:
            for k, t in seg.breakdown.items():
                out[k] = out.get(k, 0.0) + t * (e - s) / seg.seconds
            kernel += seg.kernel_busy * (e - s) / seg.seconds
        else:
            out[Category.OTHER] += e - s
        cursor = max(cursor, e)
    if step_time > cursor:  # the step ends on this stage's data-parallel link, or on another stage
        ends_here = abs(last_end - step_time) < 1e-12
        out[gap_keys[PipelineSegment.COMM] if ends_here else bubble] += step_time - cursor
        if ends_here and gap_keys[PipelineSegment.COMM] == communication:
            kernel += step_time - cursor
    out = {k: float(t) for k, t in out.items()}
    return out, min(1.0, kernel / step_time) if step_time else 0.0


def _segment_of(pipe: PipelineRun, i: int, runs, kind_of, pp: int) -> Segment | None:
    seg = pipe.segment[i]
    if seg == _OPT_SEGMENT:
        d = pipe.stage_of[i]
        # the optimizer of stage d: sum its chunks' optimizer windows (all alike in breakdown)
        return runs[kind_of[d]][0].segments[_OPT]
    c = pipe.graph.layer[i]
    j = c * pp + pipe.stage_of[i]
    final, middle = runs[kind_of[j]]
    run = final if seg in _FINAL_SEGMENTS else middle
    return run.segments[_FWD if seg in _FORWARD_SEGMENTS else _BWD]


def _offload_extra(plan: Plan, setup: OffloadSetup, hw: Hardware, runs, kind_of, rep: int, layout: Layout,
                   breakdown: dict[str, float], M: int) -> dict:
    """The report's "offload" section for one GPU of the representative stage, over the whole step:
    its chunks' last micro-batch once and their other micro-batches M - 1 times each."""
    if not setup.any:
        return {}
    traffic = HostTraffic()
    for c in range(layout.interleave):
        final, middle = runs[kind_of[c * layout.pp + rep]]
        for run, times in ((final, 1), (middle, M - 1)):
            if times:
                ops, sched = run.mb.graph.ops, run.schedule
                traffic += HostTraffic.of(ops, sched.start, sched.end).times(times)
    section = traffic_section(traffic, breakdown, plan, setup, hw)
    if layout.gpus > 1:
        section["per_gpu"] = True  # bytes, busy and CPU times are one GPU's; every GPU does the same
    return {"offload": section}


def _fp8_note(plan: Plan) -> list[str]:
    """Which FP8 a Megatron plan was priced as (graph/te_fp8.py): the user reads whether it is their recipe."""
    if plan.precision.value != "fp8" or not plan.framework.fused_kernels:
        return []
    scaling = ("current (tensorwise) scaling: each tensor's amax read before its cast" if plan.fp8_recipe == "tensorwise"
               else "delayed scaling from an amax history (--fp8-recipe tensorwise: current scaling)")
    weights = "fp8 parameters, their transposes cached" if plan.fp8_params else "weights cast to fp8 once per step and cached"
    return [f"fp8 as Transformer Engine runs it: fused cast+transpose kernels, {scaling}; {weights}; "
            "attention and the LM head in bf16"]


def _notes(plan: Plan, setup: OffloadSetup, layout: Layout, hw: Hardware, host: HostSide,
           tensors: tuple[int, ...]) -> list[str]:
    host_note = [_host_note(setup, hw, host, tensors)] if setup.optimizer and setup.cpu_share > 0 else []
    host_note += _kernel_notes(plan)
    if layout.gpus == 1:
        return _one_gpu_notes(plan) + _fp8_note(plan) + host_note
    notes = host_note + _fp8_note(plan) + [f"precision semantics: {plan.framework.value}",
             f"parallel layout: tp {layout.tp} x pp {layout.pp} x dp {layout.dp}"
             + (f" (ep {layout.ep})" if layout.ep > 1 else "")
             + f" on {layout.nodes} node(s) of {layout.gpus_per_node} GPUs; one rank per pipeline stage simulated",
             "communication kernels overlapping compute slow it by their SM share "
             f"({NCCL_CTAS} CTAs per collective, an assumption)"]
    if plan.zero and layout.dp == 1:
        notes.append(f"ZeRO stage {plan.zero} with one data-parallel rank shards over one rank: "
                     "no saving, simulated as stage 0")
    if layout.tp > layout.gpus_per_node:
        notes.append(f"tensor parallelism ({layout.tp}) spans nodes: its collectives cross the network")
    if setup.any:
        shard = f"its 1/{setup.shard} shard" if setup.shard > 1 else "a full replica"
        if hw.host_link.is_c2c:
            host_share = "each GPU uses its own Grace, LPDDR5X and C2C link"
        else:
            host_share = (f"{host.node_gpus} GPU(s) per node share its CPU cores and memory bandwidth"
                          + (f", {host.link_sharers} share each host link" if host.link_sharers > 1 else ""))
        notes.append(f"offload ({setup.schedule.value}): every rank offloads {shard} of the offloaded state; "
                     f"{host_share}; host memory is per node")
    return notes


def _kernel_notes(plan: Plan) -> list[str]:
    """Which kernels the eager frameworks' compile and FP8 choices priced (graph/compiled_layer.py,
    graph/torchao_fp8.py)."""
    notes = []
    if plan.compile:
        notes.append("torch.compile (Inductor) of a Hugging Face model: one kernel per fused norm, activation, "
                     "rotary and loss region; SDPA with the causal mask HF materialises while compiling"
                     + (", replayed as CUDA graphs (mode reduce-overhead)" if plan.cuda_graphs else ""))
    if plan.cuda_graphs:
        # PyTorch's CUDAGraph Trees docs: memory is allocated while recording, replay leaves the allocator
        # alone (validation/measured_libraries/README.md: 1B reduce-overhead 35.05 GiB recording, 18.42 replayed)
        notes.append("CUDA graphs: the HBM peak is what the graphs need, as torch allocates it while recording; "
                     "torch.cuda.max_memory_allocated() over a replayed step leaves out the graphs' private pool")
    if plan.precision.value == "fp8" and not plan.framework.fused_kernels:
        notes.append(f"fp8: torchao float8 training, {plan.fp8_recipe} scaling, "
                     + ("casts fused by Inductor" if plan.compile else "casts as eager PyTorch ops")
                     + "; LM head and attention in bf16" if plan.fp8_recipe else
                     "fp8: a per-op eager per-tensor quantisation of every projection (no --fp8-recipe; "
                     "tensorwise or rowwise: torchao's float8 training)")
    return notes


def _host_note(setup: OffloadSetup, hw: Hardware, host: HostSide, tensors: tuple[int, ...]) -> str:
    """The host the offloaded optimizer was priced on: a user reads whether it is theirs. The rate is
    the one priced: over the model's tensor sizes, in SuperOffload's worker process where it runs."""
    threads = host.optimizer_threads or host.cores_per_gpu
    where = " in DeepSpeed's SuperOffload worker process" if host.worker_process else ""
    return (f"host: {hw.cpu.cores} cores ({hw.cpu.model}), {host.cores_per_gpu} per GPU; CPU optimizer "
            f"{setup.cpu_impl.value} on {threads} thread(s) per GPU{where}: "
            f"{host.cpu_adamw_rate(setup.cpu_impl, tensors) / 1e9:.2f} "
            f"G params/s (--host-cores, --cpu-optimizer, --cpu-threads change this)")


def _one_gpu_notes(plan: Plan) -> list[str]:
    peak_dtype = mfu_dtype(plan.precision.value)
    amp = plan.framework.value == "torch-amp" and plan.precision.is_mixed
    notes = [f"precision semantics: {plan.framework.value}"
             + (" (frozen base weights in 16 bits, fp32 adapters under autocast"
                + (", each casting its input to fp32 and back as peft does" if plan.peft_input_cast
                   and not plan.framework.fused_kernels else "") + ")" if plan.lora_rank and
                plan.precision.is_mixed else " (fp32 params, autocast casts weights and inputs per op)" if amp else ""),
             f"MFU is relative to the {peak_dtype} dense peak"]
    if plan.zero:  # accepted, as DeepSpeed accepts it: sharding over one rank changes nothing
        notes.append(f"ZeRO stage {plan.zero} on one GPU shards over one rank: no saving, simulated as stage 0"
                     + (" (offload still applies)" if plan.offload else ""))
    return notes
