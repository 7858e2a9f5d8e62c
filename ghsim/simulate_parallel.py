"""simulate() for plans on more than one GPU: data, tensor, pipeline and expert parallelism, ZeRO.

Two levels, so that 1024 GPUs cost no more than a few ranks:

1. For each kind of pipeline chunk (the first holds the embedding, the last the
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

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ghsim.cost.calibration import Calibration
from ghsim.cost.compute import CostModel, LaunchCosts
from ghsim.cost.hostlink import HostSide
from ghsim.graph.offload import check_host_capacity, check_offload, host_static_bytes, resident_states
from ghsim.graph.offload import resolve as resolve_offload
from ghsim.cost.links import NCCL_CTAS, Fabric, collective_time
from ghsim.graph import ops as K
from ghsim.graph.ops import COPY, CPU, KERNEL_CATEGORIES, Op
from ghsim.graph.parallel import (
    Chunk,
    Layout,
    MicrobatchGraph,
    StateBytes,
    bucket_bytes,
    build_microbatch,
    chunk_params,
    model_state_bytes,
    model_states,
)
from ghsim.graph.pipeline import ChunkTimes, StageTail, peak_inflight_bytes
from ghsim.hardware import Hardware
from ghsim.host_summary import HostTraffic, per_node, traffic_section
from ghsim.model import ModelSpec
from ghsim.plan import Framework, Plan
from ghsim.report import BREAKDOWN_KEYS, Coverage, StepReport, Timeline, fit_problems, _union_length, _waited_for, step_fields
from ghsim.sim import engine
from ghsim.sim.memory import TierPeak, hbm_peak, host_peak
from ghsim.sim.pipeline import PipelineRun, schedule_pipeline

COMM_STREAMS = ("tp", "dp", "ep")
HOST_SIDE = ("h2d", "d2h", "cpu")  # offload's copy engines and host cores
# streams whose ops do not hold up the compute stream's spans: gradient reductions, memory
# markers, and offload's copies and CPU work (timed apart: after backward, in the optimizer)
NOT_COMPUTE = ("dp", "mem", "loader") + HOST_SIDE


@dataclass(frozen=True)
class Segment:
    """A window of a kernel-level run: its length, where its time went, its kernel-busy time."""

    seconds: float
    breakdown: dict[str, float]
    kernel_busy: float


@dataclass(frozen=True)
class MicrobatchRun:
    mb: MicrobatchGraph
    schedule: engine.Schedule
    times: dict[str, float]  # t_fwd, t_bwd, t_dp, t_opt, makespan
    segments: dict[str, Segment]  # fwd, bwd, opt (opt: from the end of reductions to the end)


def level1_resources(hw: Hardware) -> tuple[engine.Resource, ...]:
    slowdown = min(0.5, NCCL_CTAS / max(hw.sm_count, 1))
    return (
        engine.Resource("gpu", slowed_by=COMM_STREAMS, slowdown=slowdown),
        engine.Resource("h2d"), engine.Resource("d2h"), engine.Resource("cpu"), engine.Resource("loader"),
        *(engine.Resource(s) for s in COMM_STREAMS),
        engine.Resource("mem"),
    )


def run_microbatch(mb: MicrobatchGraph, hw: Hardware, cost: CostModel, plan: Plan) -> MicrobatchRun:
    g = mb.graph
    ops = g.ops
    resources = level1_resources(hw)
    distinct = engine.distinct(ops)
    sched, lead_gap = engine.run_ops(resources, ops, g.deps, lambda o: cost.issue_cost(o, plan.cuda_graphs),
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
    segments = {
        "fwd": window(tl, 0.0, t_fwd, cols),
        "bwd": window(tl, t_fwd, t_bwd, cols),
        "opt": window(tl, max(t_bwd, t_dp), t_opt, cols),
    }
    return MicrobatchRun(mb, sched, times, segments)


def _latest(ends: np.ndarray, floor: float) -> float:
    return max(floor, float(ends.max())) if len(ends) else floor


# where a compute-stream op's time goes: its kernels' categories, or a copy
_STREAM_CATEGORIES = KERNEL_CATEGORIES + ("memcpy",)


@dataclass(frozen=True)
class OpColumns:
    """What window() and run_microbatch() ask of every op, as arrays (built once per run)."""

    on_gpu: np.ndarray  # on the compute stream
    side: np.ndarray  # on another stream (not "gpu", not the memory markers)
    kernel: np.ndarray  # a GPU kernel category (counts toward kernel-busy time)
    cpu: np.ndarray  # host-core work
    not_compute: np.ndarray  # does not hold up the compute stream's spans (NOT_COMPUTE)
    host_side: np.ndarray  # offload copies and CPU work
    opt_phase: np.ndarray
    dp_bwd: np.ndarray  # a backward gradient reduction
    shares: np.ndarray  # (ops, _STREAM_CATEGORIES): how a compute-stream op's busy time splits

    @staticmethod
    def of(distinct: list[Op], rows: np.ndarray) -> "OpColumns":
        """Columns of the ops `distinct[rows]`."""
        col = {c: k for k, c in enumerate(_STREAM_CATEGORIES)}
        flags, shares = [], []
        for op in distinct:
            r = op.resource
            flags.append((r == "gpu", r not in ("gpu", "mem"), op.category in KERNEL_CATEGORIES, op.category == CPU,
                          r in NOT_COMPUTE, r in HOST_SIDE, op.phase == "opt", r == "dp" and op.phase == "bwd"))
            share = [0.0] * len(col)
            if op.category in KERNEL_CATEGORIES:  # composite ops split over the categories of their kernels
                for cat, part in op.split or ((op.category, 1.0),):
                    share[col[cat]] += part
            else:
                share[col["memcpy" if op.category == COPY else "other"]] = 1.0
            shares.append(share)
        f = np.array(flags, bool).reshape(-1, 8)[rows]
        return OpColumns(*f.T, shares=np.array(shares).reshape(-1, len(col))[rows])


def window(tl: Timeline, a: float, b: float, cols: OpColumns) -> Segment:
    """Where the compute stream's time in [a, b) went (kernels by category, and what it waited for)."""
    ops, sched = tl.ops, tl.schedule
    start, end = sched.start, sched.end
    lead = tl.lead_gap if tl.lead_gap is not None else np.zeros(len(ops))
    body = start + lead  # kernels run after their launch gap; the gap is idle
    out: dict[str, float] = {}
    on_cpu = Coverage(start[cols.cpu], end[cols.cpu])  # host cores (one in-order pool): an offloaded optimizer

    def wait(key: str, x: float, y: float) -> None:
        """The stream idles over [x, y) for `key`; while host cores work, for them (as on one GPU)."""
        cpu_s = on_cpu.over(x, y) if key.startswith("wait_") and key != "wait_cpu" else 0.0
        if cpu_s:
            out["wait_cpu"] = out.get("wait_cpu", 0.0) + cpu_s
        out[key] = out.get(key, 0.0) + y - x - cpu_s

    # the compute stream's ops in the window, in order (one stream: they never overlap)
    g = np.flatnonzero(cols.on_gpu & (end > a) & (start < b))
    s, e = np.maximum(start[g], a), np.minimum(end[g], b)
    cursor = np.maximum.accumulate(np.concatenate(([a], e)))  # cursor[k]: where the stream was before op k
    for k in np.flatnonzero(s > cursor[:-1]):
        wait(_waited_for(int(g[k]), tl), float(cursor[k]), float(s[k]))
    s = np.maximum(s, cursor[:-1])
    runs = e > s
    idle = np.where(runs, np.clip(np.minimum(body[g], e) - s, 0.0, None), 0.0)
    if idle.any():
        out["wait_kernel_gaps"] = float(idle.sum())
    for cat, t in zip(_STREAM_CATEGORIES, np.where(runs, e - s - idle, 0.0) @ cols.shares[g]):
        if t:
            out[cat] = out.get(cat, 0.0) + float(t)
    last = float(cursor[-1])
    if b > last:  # the window ends on another stream: a collective, a copy or the CPU
        ending = np.flatnonzero(cols.side & (end > a) & (end <= b + 1e-12))
        key = ops[int(ending[np.argmax(end[ending])])].category if len(ending) else "wait_other"
        key = {CPU: "wait_cpu", COPY: "wait_transfer"}.get(key, key)
        key = key if key in KERNEL_CATEGORIES or key.startswith("wait_") else "wait_other"
        wait(key, last, b)
    # kernel-busy time: kernels of every stream (communication too), overlaps counted once
    lo, hi = np.maximum(body, a), np.minimum(end, b)
    busy = cols.kernel & (hi > lo)
    return Segment(b - a, out, _union_length(lo[busy], hi[busy]))


def chunk_times(final: MicrobatchRun, middle: MicrobatchRun, send_s: float) -> ChunkTimes:
    f, m = final.times, middle.times
    return ChunkTimes(
        fwd_s=m["t_fwd"], bwd_s=m["t_bwd"] - m["t_fwd"], bwd_comm_s=max(0.0, m["t_dp"] - m["t_bwd"]),
        final_fwd_s=f["t_fwd"], final_bwd_s=f["t_bwd"] - f["t_fwd"], final_comm_s=max(0.0, f["t_dp"] - f["t_bwd"]),
        send_s=send_s,
    )


@dataclass(frozen=True)
class RankPricing:
    """What pricing one rank's work takes: its layout, links, host share and cost model."""

    layout: Layout
    cost: CostModel
    fabric: Fabric
    host_side: HostSide
    groups: dict  # the rank's communicators by stream (Layout.groups())
    templates: dict = field(default_factory=dict, compare=False)  # priced op templates, built once per plan
    # what has been built for this plan: micro-batch graphs by (layers, chunk kind, final), its StepMemory
    built: dict = field(default_factory=dict, compare=False)

    @staticmethod
    def of(hw: Hardware, plan: Plan, calibration: Calibration, fabric: Fabric | None = None,
           host_side: HostSide | None = None) -> "RankPricing":
        host_side = host_side or HostSide.of(hw, plan, calibration)  # host link, CPU and memory shared per node
        layout = Layout.of(plan, hw)
        return RankPricing(layout, CostModel(hw, calibration, host_side, LaunchCosts.of(hw, calibration, plan)),
                           fabric or Fabric.of(hw), host_side, layout.groups())

    def comm_time(self, kind: str, nbytes: float, stream: str, calls: int) -> float:
        return collective_time(kind, nbytes, self.groups[stream], self.fabric, calls)

    def price(self, op: Op) -> float:
        if op.kind == K.COLLECTIVE:
            return self.comm_time(op.variant, op.bytes, op.resource, op.kernels)
        return self.cost.duration(op)


Runs = dict[tuple[bool, bool], tuple[MicrobatchRun, MicrobatchRun]]  # chunk kind -> (final, middle) micro-batch


def chunk_kinds(layout: Layout) -> list[tuple[bool, bool]]:
    """(holds the embedding, holds the loss) of each pipeline chunk; the others are alike."""
    J = layout.chunks
    return [(j == 0, j == J - 1) for j in range(J)]


def chunk_graph(model: ModelSpec, plan: Plan, rank: RankPricing, layers: int, kind: tuple[bool, bool],
                final: bool) -> MicrobatchGraph:
    """One micro-batch of a kind of chunk, `layers` decoder layers long (built once per plan)."""
    key = (layers, kind, final)
    if key not in rank.built:
        rank.built[key] = build_microbatch(model, plan, rank.layout, Chunk(layers, *kind), final, rank.price,
                                            rank.comm_time, rank.templates)
    return rank.built[key]


def chunk_run(model: ModelSpec, hw: Hardware, plan: Plan, rank: RankPricing, layers: int, kind: tuple[bool, bool],
              final: bool) -> MicrobatchRun:
    """chunk_graph() at kernel level (run once per plan)."""
    key = ("run", layers, kind, final)
    if key not in rank.built:
        rank.built[key] = run_microbatch(chunk_graph(model, plan, rank, layers, kind, final), hw, rank.cost, plan)
    return rank.built[key]


def run_chunks(model: ModelSpec, hw: Hardware, plan: Plan, rank: RankPricing, layers: int) -> Runs:
    """Each kind of chunk, `layers` decoder layers long, at kernel level: the step's last
    micro-batch and (with gradient accumulation) one in the middle of the step."""
    runs: Runs = {}
    for kind in set(chunk_kinds(rank.layout)):
        final = chunk_run(model, hw, plan, rank, layers, kind, True)
        runs[kind] = (final, chunk_run(model, hw, plan, rank, layers, kind, False) if plan.grad_accum > 1 else final)
    return runs


def step_time_floor(model: ModelSpec, hw: Hardware, plan: Plan, rank: RankPricing, bar: float = math.inf) -> float:
    """A lower bound on the step time from the micro-batches in the middle of the step (0 without
    gradient accumulation): the pipeline schedule of the step with its last micro-batch and its
    optimizer taking no time. Schedules never end sooner when an op takes longer (every op
    starts at the latest of the ends it waits for), so the step takes at least this long.

    The kinds of chunk are run one at a time, the commonest first; until all are, a stage's
    compute stream running its known chunks' micro-batches one after another bounds the step,
    and one over `bar` ends the search for a better bound. The runs are kept for simulate_parallel."""
    M = plan.grad_accum
    if M < 2:
        return 0.0
    layout, kind_of = rank.layout, chunk_kinds(rank.layout)
    per_chunk = model.num_layers // layout.chunks
    kinds = sorted(set(kind_of), key=kind_of.count, reverse=True)
    busy = [0.0] * layout.pp  # each stage's known compute-stream seconds
    middle = {}
    for kind in kinds:
        middle[kind] = run = chunk_run(model, hw, plan, rank, per_chunk, kind, False)
        for j, k in enumerate(kind_of):
            if k == kind:
                busy[j % layout.pp] += (M - 1) * run.times["t_bwd"]
        if max(busy) > bar:
            return max(busy)
    send_s = _send_time(model, plan, rank)
    chunks = [replace(chunk_times(middle[k], middle[k], send_s), final_fwd_s=0.0, final_bwd_s=0.0, final_comm_s=0.0)
              for k in kind_of]
    tails = [StageTail(0.0, 0.0)] * layout.pp
    return schedule_pipeline(layout.pp, layout.interleave, M, chunks, tails).schedule.makespan


def _send_time(model: ModelSpec, plan: Plan, rank: RankPricing) -> float:
    """Activations (forward) or their gradients (backward) to the next pipeline stage; with
    tp > 1 each tensor-parallel rank sends its 1/tp slice (Megatron's scatter/gather optimisation)."""
    if rank.layout.pp == 1:
        return 0.0
    act = 2 if plan.precision.is_mixed else 4
    send_bytes = plan.micro_batch * plan.seq * model.hidden_size * act / rank.layout.tp
    return rank.comm_time("send", send_bytes, "pp", 1)


def pipeline_inputs(model: ModelSpec, plan: Plan, rank: RankPricing, runs: Runs
                    ) -> tuple[list[ChunkTimes], list[StageTail]]:
    """The kernel-level runs as the pipeline schedule's per-chunk times and per-stage tails."""
    layout, kind_of = rank.layout, chunk_kinds(rank.layout)
    send_s = _send_time(model, plan, rank)
    chunks = [chunk_times(*runs[k], send_s) for k in kind_of]
    tails = []
    for d in range(layout.pp):
        mine = [runs[kind_of[c * layout.pp + d]][0] for c in range(layout.interleave)]
        tails.append(StageTail(sum(r.times["t_opt"] - max(r.times["t_bwd"], r.times["t_dp"]) for r in mine),
                               max(r.times["makespan"] - r.times["t_opt"] for r in mine)))
    return chunks, tails


def check_host_memory(model: ModelSpec, hw: Hardware, plan: Plan, rank: RankPricing) -> None:
    """Every GPU of a node holds its own shard of the offloaded state: refuse what the node cannot hold."""
    if not resolve_offload(plan).any:
        return
    layout, kind_of = rank.layout, chunk_kinds(rank.layout)
    per_chunk = model.num_layers // layout.chunks
    need = max((_stage_host_static(model, plan, layout, d, kind_of, per_chunk) for d in range(layout.pp)),
               key=lambda st: sum(st.values()))
    check_host_capacity(need, rank.host_side.node_gpus, hw.host.capacity_bytes, hw.name, plan)


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


def step_memory(model: ModelSpec, hw: Hardware, plan: Plan, rank: RankPricing) -> StepMemory:
    """Memory follows from the micro-batch graphs alone (no timing): the plan search asks it first."""
    if "memory" not in rank.built:
        rank.built["memory"] = _step_memory(model, hw, plan, rank)
    return rank.built["memory"]


def _step_memory(model: ModelSpec, hw: Hardware, plan: Plan, rank: RankPricing) -> StepMemory:
    layout, kind_of = rank.layout, chunk_kinds(rank.layout)
    per_chunk = model.num_layers // layout.chunks
    finals = {kind: chunk_graph(model, plan, rank, per_chunk, kind, True) for kind in set(kind_of)}
    stages = [_stage_memory(model, plan, layout, d, finals, kind_of, per_chunk, rank.host_side.node_gpus)
              for d in range(layout.pp)]
    worst = max(range(layout.pp), key=lambda d: stages[d][0].peak_bytes)
    memory = StepMemory(stages, worst, ())
    where = f" on pipeline stage {worst}" if layout.pp > 1 else ""
    return replace(memory, problems=fit_problems(memory.hbm, memory.host, hw, where))


def prepare(model: ModelSpec, hw: Hardware, plan: Plan, calibration: Calibration, fabric: Fabric | None = None,
            host_side: HostSide | None = None) -> RankPricing:
    """The plan's up-front checks (its offload choices; host memory for what it offloads) and its pricing."""
    check_offload(plan)
    rank = RankPricing.of(hw, plan, calibration, fabric, host_side)
    check_host_memory(model, hw, plan, rank)
    return rank


def simulate_parallel(model: ModelSpec, hw: Hardware, plan: Plan, calibration: Calibration,
                      keep_timeline: bool = True, fabric: Fabric | None = None,
                      host_side: HostSide | None = None, rank: RankPricing | None = None) -> StepReport:
    """`fabric` and `host_side` replace the links and the per-GPU host share the hardware implies;
    `rank` (from prepare()) brings what is already built for this plan (step_memory)."""
    from ghsim.simulate import model_flops  # (simulate imports this module)

    rank = rank or prepare(model, hw, plan, calibration, fabric, host_side)
    layout, host_side, fabric = rank.layout, rank.host_side, rank.fabric
    groups = rank.groups
    per_chunk = model.num_layers // layout.chunks
    kind_of = chunk_kinds(layout)
    M, pp, v = plan.grad_accum, layout.pp, layout.interleave
    runs = run_chunks(model, hw, plan, rank, per_chunk)
    pipe = schedule_pipeline(pp, v, M, *pipeline_inputs(model, plan, rank, runs))
    step_time = pipe.schedule.makespan

    # --- time breakdown and utilization of each stage ------------------------------------------
    gpu_ops, last_end = _ops_by_stage(pipe, pp)
    dur = pipe.schedule.end - pipe.schedule.start
    busy = [float(dur[ops].sum()) for ops in gpu_ops]
    rep = max(range(pp), key=lambda d: busy[d])  # the busiest stage: the pipeline's bottleneck
    breakdown, utilization = _stage_breakdown(pipe, gpu_ops[rep], last_end[rep], step_time, runs, kind_of, pp)

    # --- memory of each stage ------------------------------------------------------------------
    memory = step_memory(model, hw, plan, rank)
    stage_mem, hbm, host, problems = memory.stages, memory.hbm, memory.host, memory.problems
    bubble = breakdown.get("pipeline_bubble", 0.0)
    exposed = breakdown.get("communication", 0.0)
    parallel = {
        "summary": (f"tp {layout.tp} x pp {layout.pp} x dp {layout.dp} on {layout.nodes} node(s); {M} micro-batch(es) "
                    f"per rank; pipeline bubble {bubble / step_time:.1%}, communication on the critical path "
                    f"{exposed * 1e3:.1f} ms (stage {rep})") if step_time > 0 else "",
        "layout": {"gpus": layout.gpus, "tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep,
                   "gpus_per_node": layout.gpus_per_node, "nodes": layout.nodes, "interleave": v,
                   "sequence_parallel": layout.split().sequence_parallel, "micro_batches": M},
        "groups": {name: {"size": g.size, "per_node": g.per_node, "nodes": g.nodes,
                          "bus_bandwidth_Bps": fabric.bus_bw(g) if g.size > 1 else 0.0}
                   for name, g in groups.items()},
        "representative_stage": rep,
        "pipeline_bubble_fraction": bubble / step_time if step_time > 0 else 0.0,
        "stages": [{"stage": d, "busy_s": busy[d], "idle_s": step_time - busy[d],
                    "hbm_peak_bytes": stage_mem[d][0].peak_bytes,
                    "memory_breakdown": {k: float(b) for k, b in stage_mem[d][0].breakdown.items()},
                    "model_state_bytes": _stage_model_states(model, plan, layout, d, kind_of, per_chunk)}
                   for d in range(pp)],
        "microbatch": {("first" if k[0] else "") + ("last" if k[1] else "") or "middle":
                       {"forward_s": r[0].times["t_fwd"], "backward_s": r[0].times["t_bwd"] - r[0].times["t_fwd"],
                        "grad_reduction_tail_s": max(0.0, r[0].times["t_dp"] - r[0].times["t_bwd"]),
                        "optimizer_s": r[0].times["t_opt"] - max(r[0].times["t_bwd"], r[0].times["t_dp"])}
                       for k, r in runs.items()},
    }
    return StepReport(
        step_time_s=step_time,
        **step_fields(model, hw, plan, model_flops(model, plan)),
        gpu_utilization=utilization,
        time_breakdown_s=breakdown,
        hbm=hbm,
        host=host,
        fit_problems=tuple(problems),
        notes=tuple(_notes(plan, layout, hw, host_side)),
        timeline=(Timeline(pipe.graph.ops, [r.name for r in pipe.resources], pipe.schedule, pipe.graph.deps,
                           pipe.graph.layer, pipe.graph.microbatch) if keep_timeline else None),
        extra={"parallel": parallel, **_offload_extra(plan, hw, runs, kind_of, rep, layout, breakdown)},
    )


def _ops_by_stage(pipe: PipelineRun, pp: int) -> tuple[list[list[int]], list[float]]:
    """Each stage's compute-stream ops, in order, and the time its last op of any kind ends."""
    gpu = [[] for _ in range(pp)]
    last_end = [0.0] * pp
    end = pipe.schedule.end
    for i, op in enumerate(pipe.graph.ops):
        d = pipe.stage_of[i]
        if op.resource.startswith("gpu"):
            gpu[d].append(i)
        if end[i] > last_end[d]:
            last_end[d] = float(end[i])
    return gpu, last_end


def _stage_breakdown(pipe: PipelineRun, gpu_ops: list[int], last_end: float, step_time: float,
                     runs, kind_of, pp: int) -> tuple[dict[str, float], float]:
    """A stage's compute stream over the step (its ops `gpu_ops`): each aggregated op's kernel-level
    breakdown, the gaps between them (pipeline bubbles, or exposed gradient reduction); and its
    kernel-busy share of the step."""
    g, sched = pipe.graph, pipe.schedule
    out: dict[str, float] = dict.fromkeys(BREAKDOWN_KEYS + ("pipeline_bubble",), 0.0)
    cursor, kernel = 0.0, 0.0
    for i in gpu_ops:
        s, e = sched.start[i], sched.end[i]
        if s > cursor:
            waited = [k for k in g.deps[i] if abs(sched.end[k] - s) < 1e-12]
            key = "communication" if any(pipe.segment[k] == "comm" for k in waited) else "pipeline_bubble"
            out[key] += s - cursor
            if key == "communication":  # NCCL kernels run while the compute stream waits
                kernel += s - cursor
        seg = _segment_of(pipe, i, runs, kind_of, pp)
        if seg is not None and seg.seconds > 0:
            for k, t in seg.breakdown.items():
                out[k] = out.get(k, 0.0) + t * (e - s) / seg.seconds
            kernel += seg.kernel_busy * (e - s) / seg.seconds
        else:
            out["other"] += e - s
        cursor = max(cursor, e)
    if step_time > cursor:  # the step ends on this stage's data-parallel link, or on another stage
        ends_here = abs(last_end - step_time) < 1e-12
        out["communication" if ends_here else "pipeline_bubble"] += step_time - cursor
        if ends_here:
            kernel += step_time - cursor
    out = {k: float(t) for k, t in out.items()}
    return out, min(1.0, kernel / step_time) if step_time else 0.0


def _segment_of(pipe: PipelineRun, i: int, runs, kind_of, pp: int) -> Segment | None:
    seg = pipe.segment[i]
    if seg == "opt":
        d = pipe.stage_of[i]
        # the optimizer of stage d: sum its chunks' optimizer windows (all alike in breakdown)
        return runs[kind_of[d]][0].segments["opt"]
    c = pipe.graph.layer[i]
    j = c * pp + pipe.stage_of[i]
    final, middle = runs[kind_of[j]]
    run = final if seg.startswith("final") else middle
    return run.segments["fwd" if seg.endswith("fwd") else "bwd"]


def _stage_params(model: ModelSpec, plan: Plan, layout: Layout, d: int, kind_of, per_chunk: int
                  ) -> tuple[float, float, float]:
    """Parameters, trainable parameters and the share inside decoder layers, of one GPU of stage d."""
    params = trainable = outside = 0.0
    for c in range(layout.interleave):
        cp = chunk_params(model, plan, layout, Chunk(per_chunk, *kind_of[c * layout.pp + d]))
        params, trainable = params + cp.params, trainable + cp.trainable
        outside += cp.embedding_params + cp.head_params
    return params, trainable, (1.0 - outside / params if params else 0.0)


def _stage_host_static(model: ModelSpec, plan: Plan, layout: Layout, d: int, kind_of, per_chunk: int
                       ) -> dict[str, float]:
    """Host memory one GPU of stage d holds all step for its offloaded shard."""
    params, trainable, _ = _stage_params(model, plan, layout, d, kind_of, per_chunk)
    return host_static_bytes(model, plan, trainable, params)


def _stage_memory(model: ModelSpec, plan: Plan, layout: Layout, d: int, finals_by_kind, kind_of,
                  per_chunk: int, node_gpus: int) -> tuple[TierPeak, TierPeak]:
    """HBM of one GPU of stage d: its model state (ZeRO shards, less what is offloaded), the
    kernel-level replay of its final micro-batch, and the activations of the other micro-batches
    1F1B keeps in flight (on the host, when activations are offloaded). Host memory: the node's,
    every GPU of it holding what this one holds."""
    pp, v, M = layout.pp, layout.interleave, plan.grad_accum
    js = [c * pp + d for c in range(v)]
    params, trainable, layer_share = _stage_params(model, plan, layout, d, kind_of, per_chunk)
    static = resident_states(model_state_bytes(params, trainable, plan.with_(offload=frozenset()), layout.dp),
                             plan, layer_share)
    zero = plan.zero if layout.dp > 1 else 0
    if layout.dp > 1 and zero == 0 and plan.framework == Framework.TORCH_AMP:
        # DDP copies gradients into its own flat buckets (gradient_as_bucket_view=False, the default)
        static["comm_buckets"] = trainable * StateBytes.of(plan).grads
    elif layout.dp > 1 and zero >= 1 and plan.framework == Framework.DEEPSPEED:
        # DeepSpeed's flat reduce bucket (reduce_bucket_size elements; ZeRO-3: stage3.py's ipg buffer)
        static["comm_buckets"] = min(bucket_bytes(plan, 0.0), trainable * StateBytes.of(plan).grads)
    finals = [finals_by_kind[kind_of[j]] for j in js]
    saved = [mb.saved_bytes for mb in finals]
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
    host_static = host_static_bytes(model, plan, trainable, params)
    if host_extra:
        host_static["pipeline_offloaded_activations"] = host_extra
    host = per_node(host_peak(worst.graph.ops, host_static), node_gpus)
    return worst_peak, host


def _stage_model_states(model: ModelSpec, plan: Plan, layout: Layout, d: int, kind_of, per_chunk: int) -> dict:
    """Params, gradients, masters and optimizer state one GPU of stage d holds, as the ZeRO paper counts them."""
    params, trainable, layer_share = _stage_params(model, plan, layout, d, kind_of, per_chunk)
    states = model_states(params, trainable, plan.with_(offload=frozenset()), layout.dp)
    zero = plan.zero if layout.dp > 1 else 0
    return {k: float(v) for k, v in resident_states(states, plan, layer_share, grads_are_shards=zero >= 2).items()}


def _mem_marker(tag: str, nbytes: float) -> Op:
    return Op(name=tag, category="other", kind=K.HOST_WORK, resource="mem", kernels=0).change_hbm(tag, nbytes)


def _offload_extra(plan: Plan, hw: Hardware, runs, kind_of, rep: int, layout: Layout,
                   breakdown: dict[str, float]) -> dict:
    """The report's "offload" section for one GPU of the representative stage, over the whole step:
    its chunks' last micro-batch once and their other micro-batches M - 1 times each."""
    if not resolve_offload(plan).any:
        return {}
    M = plan.grad_accum
    traffic = HostTraffic()
    for c in range(layout.interleave):
        final, middle = runs[kind_of[c * layout.pp + rep]]
        for run, times in ((final, 1), (middle, M - 1)):
            if times:
                ops, sched = run.mb.graph.ops, run.schedule
                traffic += HostTraffic.of(ops, sched.start, sched.end).times(times)
    section = traffic_section(traffic, breakdown, plan, hw)
    section["per_gpu"] = True  # bytes, busy and CPU times are one GPU's; every GPU does the same
    return {"offload": section}


def _notes(plan: Plan, layout: Layout, hw: Hardware, host: HostSide) -> list[str]:
    notes = [f"precision semantics: {plan.framework.value}",
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
    if plan.batch_prep_s:
        notes.append("multi-GPU plans do not model the host data pipeline (--batch-prep-ms is ignored)")
    setup = resolve_offload(plan)
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
