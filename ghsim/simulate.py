"""simulate(): model + hardware + plan -> StepReport, the one entry point the CLI, the search
and the validation call. One simulator for every plan: data, tensor, pipeline and expert
parallelism, ZeRO, offload, unified memory; one GPU is the degenerate layout
(tp = pp = dp = 1), whose micro-batches run in a row at kernel level.

Two levels, so that 1024 GPUs cost no more than a few ranks:

1. For each kind of pipeline chunk (its decoder layers; the first holds the embedding, the last the
   loss, the others are alike), one representative rank's micro-batch is built
   at kernel granularity (graph/parallel.py) and run in the event engine, with
   its collectives on their own link streams and communication kernels slowing
   the compute they overlap (they hold SMs). Twice when there is gradient
   accumulation: a micro-batch in the middle of the step, and the last one,
   whose backward reduces every gradient and is followed by the optimizer.
2. The spans of those runs become one op per micro-batch forward and backward,
   scheduled through the pipeline (graph/pipeline.py): bubbles, point-to-point
   sends and the gradient reduction left after the last backward fall out.

The other ranks of a stage do the same work on other data (symmetry), so the
step time of one rank per stage is the step time of the job.

Offload (graph/offload.py, woven into each micro-batch by graph/parallel.py):
every data-parallel rank offloads its own shard, and all ranks do so at once, so
the representative rank gets its share of the host (cost/hostlink.HostSide: an
x86 node's cores, memory bandwidth and shared PCIe links divided among the
plan's GPUs on it; a GH200 superchip's own Grace and C2C link). Host memory is
per node: every GPU of the node holds its own offloaded states.
"""

from __future__ import annotations

from itertools import chain
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Callable

import numpy as np

from ghsim.report.breakdown import OpColumns, Segment, window
from ghsim.cost.calibration import Calibration, load_calibration
from ghsim.cost import measured_blocks
from ghsim.cost.compute import CostModel
from ghsim.cost.hostlink import HostSide
from ghsim.cost.library_overheads import superoffload_worker_host_bytes, training_process_host_bytes
from ghsim.cost.links import NCCL_CTAS, Fabric
from ghsim.cost.offload_policy import transfer_widths
from ghsim.errors import GhsimError
from ghsim.graph import ops as K
from ghsim.graph.dtypes import Dtypes
from ghsim.graph.offload import OffloadSetup, Widths, check_offload
from ghsim.graph.offload import resolve as resolve_offload
from ghsim.graph.ops import Category, Collective, Op, OpGraph, Phase, Resource
from ghsim.graph.parallel import (
    Chunk,
    Layout,
    MicrobatchGraph,
    build_microbatch,
    check_layout,
    chunk_params,
    rank_templates,
    stage_params,
)
from ghsim.graph.states import check_host_capacity, kept_states, rank_states
from ghsim.graph.pipeline import ChunkTimes, StageTail, peak_inflight_bytes
from ghsim.graph.step import deepspeed_run_plan, loader_seconds
from ghsim.graph.unified_memory import UnifiedMemoryUse, apply_unified_memory
from ghsim.hardware import Hardware
from ghsim.report.host import per_node
from ghsim.model import ModelSpec, simulator_gap
from ghsim.plan import Framework, OffloadSchedule, Plan, Precision, check_plan
from ghsim.plan_build import GraphKey, PlanBuild, PriceBook, RankPricing
from ghsim.report.step_report import StepReport, Timeline, fit_problems
from ghsim.sim import engine
from ghsim.sim.memory import TierPeak, hbm_peak, host_peak
from ghsim.sim.pipeline import schedule_pipeline
from ghsim.sim.unified_memory import unified_memory_use
from ghsim.report.assemble import SteppedPlan, assemble
from ghsim import steady_state

COMM_STREAMS = (Resource.TP, Resource.DP, Resource.EP)


def check_simulable(model: ModelSpec) -> None:
    """A model whose layers the op graph does not build: one line naming what (model.simulator_gap)."""
    gap = simulator_gap(model)
    if gap:
        raise GhsimError(f"{model.name}: {gap} is not modeled by the simulator (its parameters are: ghsim models)")


def check_fit_to_model(model: ModelSpec, hw: Hardware, plan: Plan) -> None:
    """Plan choices the model or the hardware cannot honour: one clear line each."""
    check_plan(plan)
    check_simulable(model)
    if plan.gpus > 1:
        check_layout(model, hw, plan)
    if plan.resolved_global_batch > MAX_GLOBAL_BATCH:
        raise GhsimError(f"--global-batch {plan.resolved_global_batch} is beyond what ghsim simulates "
                         f"(at most {MAX_GLOBAL_BATCH} sequences per step)")
    if plan.seq > model.max_seq_len * 64:
        raise GhsimError(f"--seq {plan.seq} is far beyond {model.name}'s context ({model.max_seq_len})")
    if plan.unified_memory and not hw.unified_memory.supported:
        raise GhsimError(f"{hw.name} does not support unified memory")
    if plan.lora_rank and plan.lora_rank > model.hidden_size:
        raise GhsimError(f"--lora-rank {plan.lora_rank} exceeds the hidden size {model.hidden_size}")
    if plan.precision == Precision.FP8 and plan.lora_rank and not plan.framework.fused_kernels:
        # NeMo (Transformer Engine) runs the frozen base GEMMs in fp8 beside bf16 adapters (MLPerf's
        # Llama-2-70B LoRA); fp8 under peft (torchao float8 on a frozen base) is not modeled
        raise GhsimError("fp8 with LoRA is modeled as NeMo runs it (Transformer Engine: frozen fp8 base GEMMs, "
                         "bf16 adapters): use --framework megatron, or drop --precision fp8")


def simulate(model: ModelSpec, hw: Hardware, plan: Plan, calibration: Calibration | None = None,
             keep_timeline: bool = True) -> StepReport:
    check_fit_to_model(model, hw, plan)
    plan, note = deepspeed_run_plan(model, plan)
    calibration = calibration or load_calibration(hw.calibration)
    report = simulate_prepared(model, hw, plan, calibration, keep_timeline)
    notes = tuple(n for n in (note, measured_blocks.note(model, hw, plan, calibration)) if n)
    return replace(report, notes=report.notes + notes) if notes else report



@dataclass(frozen=True)
class MicrobatchRun:
    mb: MicrobatchGraph
    schedule: engine.Schedule
    times: dict[str, float]  # t_fwd, t_bwd, t_dp, t_opt, makespan
    timeline: Timeline  # the kernel-level run (a one-stage, one-micro-batch step shows it)
    cols: OpColumns  # the run's ops as columns (what the windows read)

    @cached_property
    def segments(self) -> dict[str, Segment]:
        """fwd, bwd, opt (opt: from the end of reductions to the end). Only the report reads them:
        a plan the search bounds from its middle micro-batch (step_time_floor) never pays for them."""
        t, tl, cols = self.times, self.timeline, self.cols
        return {
            Phase.FWD: window(tl, 0.0, t["t_fwd"], cols),
            Phase.BWD: window(tl, t["t_fwd"], t["t_bwd"], cols),
            Phase.OPT: window(tl, max(t["t_bwd"], t["t_dp"]), t["t_opt"], cols),
        }


def level1_resources(hw: Hardware) -> tuple[engine.Resource, ...]:
    slowdown = min(0.5, NCCL_CTAS / max(hw.sm_count, 1))
    return (
        engine.Resource(Resource.GPU, slowed_by=COMM_STREAMS, slowdown=slowdown),
        engine.Resource(Resource.H2D), engine.Resource(Resource.D2H), engine.Resource(Resource.CPU),
        engine.Resource(Resource.LOADER), engine.Resource(Resource.HOST),
        *(engine.Resource(s) for s in COMM_STREAMS),
        engine.Resource(Resource.MEM),
    )


def run_microbatch(mb: MicrobatchGraph, hw: Hardware, cost: CostModel, plan: Plan,
                   price: Callable[[Op], float]) -> MicrobatchRun:
    """The micro-batch graph at kernel level, each op priced by `price` (a rank's PriceBook)."""
    g = mb.graph
    ops = g.ops
    resources = level1_resources(hw)
    distinct = engine.distinct(ops)
    sched, lead_gap = engine.run_ops(resources, ops, g.deps, price, lambda o: cost.issue_cost(o, plan.cuda_graphs),
                                     lambda o: cost.kernel_gap(o, plan.cuda_graphs), distinct)
    cols = OpColumns.of(*distinct)
    end = sched.end
    idx = np.arange(len(ops))
    compute = ~cols.not_compute
    t_fwd = _latest(end[compute & (idx <= mb.fwd_last)], 0.0)
    t_bwd = _latest(end[compute & (idx < mb.tail_first)], t_fwd)
    # after backward: its gradient reductions, and offloaded gradients still on their way to the host
    t_dp = _latest(end[cols.dp_bwd | (cols.host_side & ~cols.opt_phase)], t_bwd)
    # the optimizer: on the compute stream, and (offloaded) on the host and its copy engines
    t_opt = _latest(end[(compute & (idx >= mb.tail_first)) | (cols.host_side & cols.opt_phase)], max(t_bwd, t_dp))
    makespan = max(sched.makespan, t_opt)
    times = {"t_fwd": t_fwd, "t_bwd": t_bwd, "t_dp": t_dp, "t_opt": t_opt, "makespan": makespan}
    tl = Timeline(ops, [r.name for r in resources], sched, g.deps, g.layer, g.microbatch, lead_gap)
    return MicrobatchRun(mb, sched, times, tl, cols)


def _latest(ends: np.ndarray, floor: float) -> float:
    return max(floor, float(ends.max())) if len(ends) else floor


def chunk_times(final: MicrobatchRun, middle: MicrobatchRun, send_s: float, send_blocks: bool = False) -> ChunkTimes:
    f, m = final.times, middle.times
    return ChunkTimes(
        fwd_s=m["t_fwd"], bwd_s=m["t_bwd"] - m["t_fwd"], bwd_comm_s=max(0.0, m["t_dp"] - m["t_bwd"]),
        final_fwd_s=f["t_fwd"], final_bwd_s=f["t_bwd"] - f["t_fwd"], final_comm_s=max(0.0, f["t_dp"] - f["t_bwd"]),
        send_s=send_s, send_blocks=send_blocks,
    )


Runs = dict[Chunk, tuple[MicrobatchRun, MicrobatchRun]]  # chunk kind -> (final, middle) micro-batch


def chunk_kinds(layout: Layout, num_layers: int) -> list[Chunk]:
    """The kind of each pipeline chunk: its decoder layers, and whether it holds the embedding or
    the loss; chunks of one kind are alike (an even split has at most three kinds)."""
    return layout.chunks_of(num_layers)


def chunk_graph(model: ModelSpec, plan: Plan, rank: PlanBuild, layers: int, kind: tuple[bool, bool],
                final: bool) -> MicrobatchGraph:
    """One micro-batch of a kind of chunk, `layers` decoder layers long (built once per plan)."""
    key = GraphKey(layers, kind, final)
    if key not in rank.graphs:
        chunk = Chunk(layers, *kind)
        rank.graphs[key] = build_microbatch(model, plan, rank.layout, chunk, final, rank.templates,
                                            _offload_widths(model, plan, rank, chunk))
    return rank.graphs[key]


def _offload_widths(model: ModelSpec, plan: Plan, rank: PlanBuild, chunk: Chunk) -> Widths | None:
    """What the chunk's offloaded optimizer moves over the host link (cost/offload_policy.py),
    with SuperOffload's cast placement weighed against the chunk's backward GPU seconds."""
    setup = rank.offload
    if not setup.optimizer:
        return None
    dt = Dtypes.of(plan)
    trainable = chunk_params(model, plan, rank.layout, chunk).trainable
    bwd_gpu = _backward_gpu_seconds(rank, chunk) if setup.schedule == OffloadSchedule.SUPEROFFLOAD else 0.0
    return transfer_widths(rank.rank.cost, setup, dt.grad, dt.param, bwd_gpu / max(trainable, 1.0))


def _backward_gpu_seconds(rank: PlanBuild, chunk: Chunk) -> float:
    """Seconds of the chunk's backward on the compute stream, summed op by op in issue order."""
    t = rank.templates
    gpu, backward = K.Resource.GPU, (K.Phase.BWD, K.Phase.RECOMPUTE)

    def seconds(ops) -> list[float]:
        return [rank.prices(op) for op in ops if op.resource == gpu and op.phase in backward]

    loss, emb = seconds(t.loss_bwd if chunk.last else ()), seconds(t.emb_bwd if chunk.first else ())
    return sum(chain(loss, seconds(t.bwd) * chunk.layers, emb))


def chunk_run(model: ModelSpec, hw: Hardware, plan: Plan, rank: PlanBuild, layers: int, kind: tuple[bool, bool],
              final: bool) -> MicrobatchRun:
    """chunk_graph() at kernel level (run once per plan)."""
    key = GraphKey(layers, kind, final)
    if key not in rank.runs:
        rank.runs[key] = run_microbatch(_runnable(model, hw, plan, rank, layers, kind, final), hw, rank.rank.cost,
                                        plan, rank.prices)
    return rank.runs[key]


def _runnable(model: ModelSpec, hw: Hardware, plan: Plan, rank: PlanBuild, layers: int, kind: tuple[bool, bool],
              final: bool) -> MicrobatchGraph:
    """chunk_graph() with what only its timing needs: unified memory's page migrations."""
    mb = chunk_graph(model, plan, rank, layers, kind, final)
    if plan.unified_memory:
        mb = with_unified_memory(mb, unified_memory_of(model, hw, plan, rank))
    return mb


def chains_microbatches(layout: Layout, plan: Plan) -> bool:
    """One GPU: no pipeline to schedule, the step is its micro-batches one after another, run at
    kernel level in a row (copies and host work of one micro-batch overlap the next, as they do)."""
    return layout.gpus == 1 and plan.grad_accum > 1


def run_chunks(model: ModelSpec, hw: Hardware, plan: Plan, rank: PlanBuild) -> Runs:
    """Each kind of chunk at kernel level: the step's last micro-batch and (with gradient
    accumulation) one in the middle of the step; on one GPU, the whole step (every micro-batch
    in a row) as its 'last micro-batch'."""
    runs: Runs = {}
    for chunk in set(chunk_kinds(rank.layout, model.num_layers)):
        layers, kind = chunk.layers, (chunk.first, chunk.last)
        if chains_microbatches(rank.layout, plan):
            middle = _runnable(model, hw, plan, rank, layers, kind, False)
            step = _chain([middle] * (plan.grad_accum - 1) + [_runnable(model, hw, plan, rank, layers, kind, True)],
                          loader_seconds(plan) if plan.batch_prep_s > 0 and plan.dataloader_workers else 0.0)
            run = run_microbatch(step, hw, rank.rank.cost, plan, rank.prices)
            runs[chunk] = (run, run)
            continue
        final = chunk_run(model, hw, plan, rank, layers, kind, True)
        runs[chunk] = (final, chunk_run(model, hw, plan, rank, layers, kind, False) if plan.grad_accum > 1 else final)
    return runs


def _chain(mbs: list[MicrobatchGraph], loader_s: float) -> MicrobatchGraph:
    """Micro-batch graphs in a row, as one (the marks are the last one's). With a data-loader
    pool, every micro-batch after the first waits for its batch: the pool delivers one every
    `loader_s` seconds on its own in-order resource."""
    g = OpGraph()
    base = 0
    loaders: dict[int, list[int]] = {}  # where each micro-batch graph (most are one object) loads its batch
    for m, mb in enumerate(mbs):
        base, src = len(g), mb.graph
        g.ops.extend(src.ops)
        if m and loader_s:
            if id(src) not in loaders:
                data, loader = Phase.DATA, Resource.LOADER
                loaders[id(src)] = [i for i, op in enumerate(src.ops) if op.phase == data and op.resource == loader]
            for i in loaders[id(src)]:
                g.ops[base + i] = src.ops[i].evolve(seconds=loader_s)
        shift = base.__add__  # (map with a bound method: the deps of every op of the step)
        g.deps.extend([tuple(map(shift, deps)) for deps in src.deps])
        g.layer.extend(src.layer)
        g.microbatch.extend([m] * len(src.ops))
    last = mbs[-1]
    return replace(last, graph=g, fwd_last=base + last.fwd_last, bwd_last=base + last.bwd_last,
                   tail_first=base + last.tail_first)


def pipeline_makespan(plan: Plan, layout: Layout, chunks: list[ChunkTimes], tails: list[StageTail]) -> float:
    """The pipeline schedule's makespan for the plan's micro-batches; past EXACT_MICROBATCHES from
    three short schedules and their steady-state period (ghsim/steady_state.py). Where the period
    is not steady yet, the longest short schedule: M micro-batches never end sooner than fewer."""
    def makespan(m: int) -> float:
        return schedule_pipeline(layout.pp, layout.interleave, m, chunks, tails).schedule.makespan

    M = plan.grad_accum
    if M <= EXACT_MICROBATCHES:
        return makespan(M)
    k, d = steady_state.sample_points(plan, layout.pp, layout.interleave, EXACT_MICROBATCHES)
    z, a, b = makespan(k - d), makespan(k), makespan(k + d)
    if abs((a - z) - (b - a)) > steady_state.PERIOD_TOLERANCE * b:
        return b
    return b + (M - k - d) / d * (b - a)


def inflight_microbatches(pp: int, v: int, M: int) -> int:
    """As many micro-batches as 1F1B needs to reach its deepest in-flight point: the peak of M
    (graph/pipeline.peak_inflight_bytes) is reached within them (tests/test_steady_state.py)."""
    enough = 2 * pp * v + pp
    return M if M <= enough else enough + (M - enough) % pp


def send_time(model: ModelSpec, plan: Plan, rank: PlanBuild) -> float:
    """Activations (forward) or their gradients (backward) to the next pipeline stage; with
    tp > 1 each tensor-parallel rank sends its 1/tp slice (Megatron's scatter/gather optimisation)."""
    if rank.layout.pp == 1:
        return 0.0
    act = 2 if plan.precision.is_mixed else 4
    send_bytes = plan.micro_batch * plan.seq * model.hidden_size * act / rank.layout.tp
    return rank.rank.comm_time(Collective.SEND, send_bytes, Resource.PP, 1)


def pipeline_inputs(model: ModelSpec, plan: Plan, rank: PlanBuild, runs: Runs
                    ) -> tuple[list[ChunkTimes], list[StageTail]]:
    """The kernel-level runs as the pipeline schedule's per-chunk times and per-stage tails."""
    layout, kind_of = rank.layout, chunk_kinds(rank.layout, model.num_layers)
    send_s = send_time(model, plan, rank)
    blocks = plan.framework == Framework.MEGATRON_LEGACY  # its p2p waits for each send (ChunkTimes.send_blocks)
    chunks = [chunk_times(*runs[k], send_s, blocks) for k in kind_of]
    tails = []
    for d in range(layout.pp):
        mine = [runs[kind_of[c * layout.pp + d]][0] for c in range(layout.interleave)]
        tails.append(StageTail(sum(r.times["t_opt"] - max(r.times["t_bwd"], r.times["t_dp"]) for r in mine),
                               max(r.times["makespan"] - r.times["t_opt"] for r in mine)))
    return chunks, tails


def check_host_memory(model: ModelSpec, hw: Hardware, plan: Plan, rank: PlanBuild) -> None:
    """Every GPU of a node holds its own shard of the offloaded state: refuse what the node cannot hold."""
    if not rank.offload.any:
        return
    layout = rank.layout
    need = max((rank_states(plan, layout.dp, stage_params(model, plan, layout, d), rank.offload).host
                for d in range(layout.pp)),
               key=lambda st: sum(st.values()))
    check_host_capacity(need, rank.rank.host_side.node_gpus, hw.host.capacity_bytes, hw.name, plan)


@dataclass(frozen=True)
class StepMemory:
    """HBM and host memory of the step: each stage's peaks, the worst stage's, and what does not fit."""

    stages: list[tuple[TierPeak, TierPeak]]  # per pipeline stage: (HBM of one GPU, host of its node)
    worst: int  # the stage with the highest HBM peak
    problems: tuple[str, ...]

    @property
    def hbm(self) -> TierPeak:  # the memory curves follow the kernel-level replay, not the step: not drawn
        return replace(self.stages[self.worst][0], curve=None)

    @property
    def host(self) -> TierPeak:  # the stage whose GPUs leave the most on the host (it may not be `worst`)
        return replace(max((host for _, host in self.stages), key=lambda h: h.peak_bytes), curve=None)


def step_memory(model: ModelSpec, hw: Hardware, plan: Plan, rank: PlanBuild) -> StepMemory:
    """Memory follows from the micro-batch graphs alone (no timing): the plan search asks it first."""
    if rank.memory is None:
        rank.memory = _step_memory(model, hw, plan, rank)
    return rank.memory


def _step_memory(model: ModelSpec, hw: Hardware, plan: Plan, rank: PlanBuild) -> StepMemory:
    layout, kind_of = rank.layout, chunk_kinds(rank.layout, model.num_layers)
    finals = {kind: chunk_graph(model, plan, rank, kind.layers, (kind.first, kind.last), True) for kind in set(kind_of)}
    stages = [_stage_memory(model, plan, layout, d, finals, kind_of, rank.rank.host_side.node_gpus, rank.offload)
              for d in range(layout.pp)]
    worst = max(range(layout.pp), key=lambda d: stages[d][0].peak_bytes)
    memory = StepMemory(stages, worst, ())
    where = f" on pipeline stage {worst}" if layout.pp > 1 else ""
    return replace(memory, problems=fit_problems(memory.hbm, memory.host, hw, where))


def prepare(model: ModelSpec, hw: Hardware, plan: Plan, calibration: Calibration, fabric: Fabric | None = None,
            host_side: HostSide | None = None) -> PlanBuild:
    """The plan's up-front checks (its offload choices; host memory for what it offloads), its
    pricing and its op templates: a PlanBuild the plan's later questions build on."""
    check_offload(plan)
    pricing = RankPricing.of(hw, plan, calibration, fabric, host_side)
    # GH200 blocks a published profiler measured (cost/measured_blocks.py): their time, not the H100 microbenchmarks'
    measured = measured_blocks.corrections(model, hw, plan, pricing.cost, pricing.price,
                                           lambda p: rank_templates(model, p, pricing.layout))
    if measured is not None:
        pricing = replace(pricing, cost=replace(pricing.cost, corrections=measured))
    build = PlanBuild(pricing, resolve_offload(plan), rank_templates(model, plan, pricing.layout), PriceBook(pricing))
    check_host_memory(model, hw, plan, build)
    return build


# up to this many micro-batches a step is simulated in full; beyond, from its steady state
EXACT_MICROBATCHES = 64
STEADY_TRIES = 4  # the sample of micro-batches doubles each try: at most 8 x its first size
MAX_GLOBAL_BATCH = 10**9  # sequences per step: far beyond any training run; 10**12 is a typo


def simulate_prepared(model: ModelSpec, hw: Hardware, plan: Plan, calibration: Calibration,
                      keep_timeline: bool = True, fabric: Fabric | None = None,
                      host_side: HostSide | None = None, rank: PlanBuild | None = None,
                      exact_up_to: int = EXACT_MICROBATCHES) -> StepReport:
    """The step of any layout (one GPU: tp = pp = dp = 1). `fabric` and `host_side` replace the
    links and the per-GPU host share the hardware implies; `rank` (from prepare()) brings what is
    already built for this plan (step_memory). More than `exact_up_to` identical micro-batches:
    a few are simulated and the step extended by their steady-state period (ghsim/steady_state.py)."""
    if plan.grad_accum <= exact_up_to:
        return _stepped(model, hw, plan, calibration, keep_timeline, fabric, host_side, rank).report
    layout = rank.layout if rank else Layout.of(plan, hw)
    for tries in range(STEADY_TRIES):
        k, d = steady_state.sample_points(plan, layout.pp, layout.interleave, exact_up_to, tries)
        if k + d >= plan.grad_accum:
            return _stepped(model, hw, plan, calibration, keep_timeline, fabric, host_side, rank).report
        z, a, b = (_stepped(model, hw, steady_state.with_microbatches(plan, m), calibration,
                            keep_timeline and m == k + d, fabric, host_side, None) for m in (k - d, k, k + d))
        if steady_state.steady(z.report, a.report, b.report):
            break
    else:
        raise GhsimError(f"the step does not settle into a steady state within {k + d} micro-batches, and "
                         f"{plan.grad_accum} are too many to simulate one by one: use fewer micro-batches")
    um_of = None
    if plan.unified_memory:
        um_of = lambda p: unified_memory_of(model, hw, p, prepare(model, hw, p, calibration, fabric,  # noqa: E731
                                                                   host_side))
    return steady_state.extrapolate(z, a, b, plan, um_of)


def _stepped(model: ModelSpec, hw: Hardware, plan: Plan, calibration: Calibration, keep_timeline: bool,
             fabric: Fabric | None, host_side: HostSide | None, rank: PlanBuild | None) -> steady_state.Stepped:
    rank = rank or prepare(model, hw, plan, calibration, fabric, host_side)
    layout = rank.layout
    kind_of = chunk_kinds(layout, model.num_layers)
    um = unified_memory_of(model, hw, plan, rank) if plan.unified_memory else None
    runs = run_chunks(model, hw, plan, rank)
    # a data-loader pool paces the micro-batches (chained ones wait for it at kernel level)
    pool = plan.batch_prep_s > 0 and plan.dataloader_workers > 0 and not chains_microbatches(layout, plan)
    M = 1 if chains_microbatches(layout, plan) else plan.grad_accum  # a chain is the step's one 'micro-batch'
    pipe = schedule_pipeline(layout.pp, layout.interleave, M, *pipeline_inputs(model, plan, rank, runs),
                             loader_s=loader_seconds(plan) if pool else 0.0)
    memory = step_memory(model, hw, plan, rank)
    states = [_stage_model_states(model, plan, layout, d, rank.offload) for d in range(layout.pp)]
    stepped = SteppedPlan(model, hw, plan, layout, rank.rank.host_side, rank.rank.fabric, runs, kind_of, pipe,
                          memory.stages, memory.worst, states, M, um)
    return steady_state.Stepped(assemble(stepped, keep_timeline), stepped)


def unified_memory_of(model: ModelSpec, hw: Hardware, plan: Plan, rank: PlanBuild) -> UnifiedMemoryUse:
    """What spills under --unified-memory and comes back each step (one GPU: graph/unified_memory.py),
    from the replay of the step's last micro-batch. Built once per plan."""
    if rank.unified_memory is None:
        layout = rank.layout
        if layout.chunks > 1:
            raise GhsimError("--unified-memory with pipeline stages is not modeled: what spills depends on "
                             "every stage's in-flight micro-batches (use --offload)")
        final = chunk_graph(model, plan, rank, model.num_layers, (True, True), True)
        static = rank_states(plan, layout.dp, stage_params(model, plan, layout, 0), rank.offload).hbm
        rank.unified_memory = unified_memory_use(final.graph, static, hw, plan.grad_accum)
    return rank.unified_memory


def with_unified_memory(mb: MicrobatchGraph, um: UnifiedMemoryUse) -> MicrobatchGraph:
    """The micro-batch with its page migrations; its marks follow the ops they name."""
    graph, moved = apply_unified_memory(mb.graph, um)
    at = lambda i: moved[i] if i < len(moved) else len(graph)  # noqa: E731 (tail_first may be past the end)
    return replace(mb, graph=graph, fwd_last=at(mb.fwd_last), bwd_last=at(mb.bwd_last), tail_first=at(mb.tail_first))


def _stage_memory(model: ModelSpec, plan: Plan, layout: Layout, d: int, finals_by_kind, kind_of,
                  node_gpus: int, setup: OffloadSetup) -> tuple[TierPeak, TierPeak]:
    """HBM of one GPU of stage d: what it holds from the start (graph/states.py: its model state,
    less what is offloaded, and its framework's buckets), the kernel-level replay of its final
    micro-batch, and the activations of the other micro-batches 1F1B keeps in flight (on the
    host, when activations are offloaded). Host memory: the node's, every GPU of it holding
    what this one holds (under offload, plus each training process's own measured memory)."""
    pp, v, M = layout.pp, layout.interleave, plan.grad_accum
    js = [c * pp + d for c in range(v)]
    account = rank_states(plan, layout.dp, stage_params(model, plan, layout, d), setup)
    static = account.hbm
    finals = [finals_by_kind[kind_of[j]] for j in js]
    saved = [mb.saved_bytes for mb in finals]
    M = inflight_microbatches(pp, v, M)
    inflight, _count = peak_inflight_bytes(pp, v, M, d, saved)
    host_saved = [sum(op.host_alloc for op in mb.graph.ops[:mb.fwd_last + 1] if op.mem_tag == "offloaded_activations")
                  for mb in finals]
    host_inflight, _count = peak_inflight_bytes(pp, v, M, d, host_saved)
    worst_peak, worst = None, None
    for c, mb in enumerate(finals):
        extra = max(0.0, inflight - saved[c])
        ops = mb.graph.ops
        mem_ops = ([_mem_marker("pipeline_activations", extra)] + ops[:mb.tail_first]
                   + [_mem_marker("pipeline_activations", -extra)] + ops[mb.tail_first:])
        peak = hbm_peak(mem_ops, static)
        if worst_peak is None or peak.peak_bytes > worst_peak.peak_bytes:
            worst_peak, worst, host_extra = peak, mb, max(0.0, host_inflight - host_saved[c])
    host_static = dict(account.host)
    if host_extra:
        host_static["pipeline_offloaded_activations"] = host_extra
    if host_static or any(op.host_alloc for op in worst.graph.ops):
        # what is offloaded sits in a process that holds memory of its own, as top shows it
        # DeepSpeed's engine runs the overlapped schedules (ZeRO-Offload, ZeRO-Infinity, SuperOffload);
        # a plain loop (sync) with DeepSpeed-style masters does not load it
        engine = plan.framework == Framework.DEEPSPEED and setup.schedule != OffloadSchedule.SYNC
        host_static["training_process"] = training_process_host_bytes(deepspeed=engine)
        if setup.schedule == OffloadSchedule.SUPEROFFLOAD:  # each rank's CPU-Adam worker is a process too
            host_static["superoffload_worker_process"] = superoffload_worker_host_bytes()
    host = per_node(host_peak(worst.graph.ops, host_static), node_gpus)
    return worst_peak, host


def _stage_model_states(model: ModelSpec, plan: Plan, layout: Layout, d: int, setup: OffloadSetup) -> dict:
    """Params, gradients, masters and optimizer state one GPU of stage d holds, as the ZeRO paper counts them."""
    states = kept_states(plan, layout.dp, stage_params(model, plan, layout, d), setup)
    return {k: float(v) for k, v in states.items()}


def _mem_marker(tag: str, nbytes: float) -> Op:
    return Op(name=tag, category=Category.OTHER, kind=K.HOST_WORK, resource=Resource.MEM, kernels=0).with_hbm(tag, nbytes)
