"""Lower bounds on a plan's step time, for the plan search to set plans aside before (or
instead of) simulating them. Each answers from less than the simulation builds: op templates
priced (compute_time_floor, for a whole compute class), a micro-batch graph built but not run
(final_microbatch_floor), or the middle micro-batches run (step_time_floor); each is at most
the step simulate_prepared reports (tests/test_search_family_bound.py,
tests/test_multigpu_offload_properties.py)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Callable

from ghsim.graph.ops import Resource
from ghsim.graph.parallel import Chunk, Layout, chunk_params, optimizer_tensors, rank_shard
from ghsim.graph.pipeline import FWD, ChunkTimes, StageTail, stage_order
from ghsim.hardware import Hardware
from ghsim.model import ModelSpec
from ghsim.plan import Plan
from ghsim.plan_build import PlanBuild
from ghsim.simulate import (
    EXACT_MICROBATCHES,
    MicrobatchRun,
    chains_microbatches,
    chunk_graph,
    chunk_kinds,
    chunk_run,
    chunk_times,
    level1_resources,
    pipeline_makespan,
    send_time,
)


def step_time_floor(model: ModelSpec, hw: Hardware, plan: Plan, rank: PlanBuild, bar: float = math.inf,
                    exact_up_to: int = EXACT_MICROBATCHES) -> float:
    """A lower bound on the step time. Schedules never end sooner when an op takes longer (every
    op starts at the latest of the ends it waits for), so two bounds hold:

    - the last micro-batch (final_chain_floor): each stage's compute stream runs, before the
      step's last forward of one of its chunks, every forward and backward 1F1B puts first;
      from then on that chunk's last micro-batch lasts at least its template kernels, its CPU
      AdamW (cpu_optimizer_floor) and, once its graph is built, its busiest resource
      (final_microbatch_floor);
    - the micro-batches in the middle of the step, run at kernel level (0 without gradient
      accumulation): the pipeline schedule with the last micro-batch and the optimizer taking
      no time.

    Cheapest first, stopping as soon as one exceeds `bar`: the last micro-batch with nothing
    built (the earlier ones at their template kernels); the middle micro-batches run (the
    commonest kind of chunk first: a stage's compute stream over `bar` stops there), and the
    first bound again with their run times; with offload, the last micro-batch's graph built.
    What is built is kept for step_memory and simulate_prepared. More than `exact_up_to`
    micro-batches (a step simulate_prepared extends by its steady-state period): the middle
    micro-batches only."""
    layout, kind_of = rank.layout, chunk_kinds(rank.layout, model.num_layers)
    M = plan.grad_accum
    chained = M <= exact_up_to and not chains_microbatches(layout, plan)
    floor, seconds = 0.0, None
    if chained:  # the last micro-batch at its template kernels and its CPU AdamW: nothing built
        templates = {k: _stream_busy(plan, rank, k.layers, (k.first, k.last)) for k in set(kind_of)}
        last = {k: max(sum(templates[k]), cpu_optimizer_floor(model, plan, rank, k)) for k in templates}
        seconds = lambda k, final: templates[k]  # noqa: E731
        floor = final_chain_floor(plan, layout, kind_of, seconds, last)
        if floor > bar:
            return floor
    if M >= 2:
        middle_floor, middle = _middle_floor(model, hw, plan, rank, layout, kind_of, bar)
        floor = max(floor, middle_floor)
        if floor > bar:
            return floor
        ran = {k: (r.times["t_fwd"], r.times["t_bwd"] - r.times["t_fwd"]) for k, r in middle.items()}
        if chained:
            seconds = lambda k, final: templates[k] if final else ran[k]  # noqa: E731
            floor = max(floor, final_chain_floor(plan, layout, kind_of, seconds, last))
    if chained and rank.offload.any and floor <= bar:
        # then the last micro-batch's graph, built (kept for step_memory and the run): where the
        # host works beside the GPU (offload), its busiest resource may be the host's
        busiest = final_microbatch_floor(model, hw, plan, rank)
        floor = max(floor, final_chain_floor(plan, layout, kind_of, seconds,
                                             {k: max(s, busiest[k]) for k, s in last.items()}))
    return floor


def _middle_floor(model: ModelSpec, hw: Hardware, plan: Plan, rank: PlanBuild, layout: Layout,
                  kind_of: list[Chunk], bar: float) -> tuple[float, dict[Chunk, MicrobatchRun]]:
    """The pipeline of the middle micro-batches, the last one and the optimizer taking no time,
    and their runs. Kinds run commonest first; a stage's known compute stream over `bar` stops
    there (with the runs so far)."""
    M = plan.grad_accum
    kinds = sorted(set(kind_of), key=kind_of.count, reverse=True)
    busy = [0.0] * layout.pp  # each stage's known compute-stream seconds
    middle = {}
    for kind in kinds:
        middle[kind] = run = chunk_run(model, hw, plan, rank, kind.layers, (kind.first, kind.last), False)
        for j, k in enumerate(kind_of):
            if k == kind:
                busy[j % layout.pp] += (M - 1) * run.times["t_bwd"]
        if max(busy) > bar:
            return max(busy), middle
    send_s = send_time(model, plan, rank)
    chunks = [replace(chunk_times(middle[k], middle[k], send_s), final_fwd_s=0.0, final_bwd_s=0.0, final_comm_s=0.0)
              for k in kind_of]
    return pipeline_makespan(plan, layout, chunks, [StageTail(0.0, 0.0)] * layout.pp), middle


def final_microbatch_floor(model: ModelSpec, hw: Hardware, plan: Plan, rank: PlanBuild) -> dict[Chunk, float]:
    """Per kind of chunk, a lower bound on the kernel-level makespan of the step's last
    micro-batch, from its graph alone (built and kept, not run): every resource of the run is
    one in-order server (level1_resources), so the run lasts at least the seconds its busiest
    one works (each op's price and lead gap; sharing SMs only lengthens them), and at least the
    host thread's issue seconds. Unified memory adds page migrations the graph does not hold yet: 0."""
    kinds = set(chunk_kinds(rank.layout, model.num_layers))
    if plan.unified_memory or any(r.servers != 1 for r in level1_resources(hw)):
        return dict.fromkeys(kinds, 0.0)
    cost, graphs, price = rank.rank.cost, plan.cuda_graphs, rank.prices
    out = {}
    for kind in kinds:
        ops = chunk_graph(model, plan, rank, kind.layers, (kind.first, kind.last), True).graph.ops
        busy: dict[str, float] = {}
        issue = 0.0
        for op, n in Counter(ops).items():  # (ops hash by identity: replicated layers share theirs)
            busy[op.resource] = busy.get(op.resource, 0.0) + n * (price(op) + cost.kernel_gap(op, graphs))
            issue += n * cost.issue_cost(op, graphs)
        # (summed in another order than the engine adds them up)
        out[kind] = max(max(busy.values(), default=0.0), issue) * (1 - ROUNDING)
    return out


def cpu_optimizer_floor(model: ModelSpec, plan: Plan, rank: PlanBuild, chunk: Chunk) -> float:
    """Seconds of CPU AdamW in the step's last micro-batch of a kind of chunk, at least (no graph
    built): with the whole optimizer on the host, the offload schedules step every piece of the
    chunk's gradients there (graph/offload/schedules._cpu_pieces takes them all), this rank's
    shard of them, and AdamW's CPU time is linear in the parameters (cost/hostlink). 0 for a
    split optimizer (which pieces the CPU takes depends on the graph's buckets)."""
    setup = rank.offload
    if not setup.optimizer or setup.cpu_share < 1:
        return 0.0
    layout = rank.layout
    local = rank_shard(model, layout)
    params = chunk_params(model, plan, layout, chunk, local).trainable / setup.shard
    tensors = optimizer_tensors(local, plan, layout.dp)
    return rank.rank.cost.cpu_optimizer_time(params, setup.cpu_impl, tensors) * (1 - ROUNDING)


ROUNDING = 1e-9  # relative: a floor summed in another order than the run may round above it


def final_chain_floor(plan: Plan, layout: Layout, kind_of: list[Chunk],
                      seconds: Callable[[Chunk, bool], tuple[float, float]], last: dict[Chunk, float]) -> float:
    """What the pipeline takes at least, seen from the step's last forward of each chunk j on
    stage d: stage d's compute stream runs first, one at a time, every forward and backward
    graph/pipeline.stage_order puts before it (`seconds`(kind, last micro-batch): at most their
    (fwd, bwd) seconds); then chunk j's last forward, backward, its reductions, the stage's
    optimizer and gathers follow one another in the pipeline graph, and together they last its
    micro-batch's makespan, at least `last`[kind]."""
    M, pp, v = plan.grad_accum, layout.pp, layout.interleave
    floor = 0.0
    for d in range(pp):
        before = 0.0
        for direction, c, m in stage_order(pp, v, M, d):
            kind = kind_of[c * pp + d]
            if direction == FWD and m == M - 1:
                floor = max(floor, before + last[kind])
            fwd, bwd = seconds(kind, m == M - 1)
            before += fwd if direction == FWD else bwd
    return floor * (1 - ROUNDING)


def compute_time_floor(model: ModelSpec, hw: Hardware, plan: Plan, rank: PlanBuild) -> float:
    """A lower bound on the step time of every plan that runs at least `plan`'s compute-stream
    kernels in each micro-batch's forward and backward (the search's compute class: the same
    layout, precision, recompute and micro-batch, with ZeRO, offload and unified memory only
    adding work): the pipeline schedule of the step with each chunk's forward and backward taking
    only the busy time of those kernels, one after another on the stream, and nothing after the
    last backward.

    No graph is built or run: the rank's op templates are priced. Kept out of simulate_prepared:
    it answers for a family of plans, not for this one."""
    layout, kind_of = rank.layout, chunk_kinds(rank.layout, model.num_layers)
    busy = {kind: _stream_busy(plan, rank, kind.layers, (kind.first, kind.last)) for kind in set(kind_of)}
    send_s = send_time(model, plan, rank)
    chunks = [ChunkTimes(*busy[k], 0.0, *busy[k], 0.0, send_s) for k in kind_of]
    M, pp, v = plan.grad_accum, layout.pp, layout.interleave
    if v > 1 and M % pp:  # (the interleaved schedule's odd case: its own order, scheduled)
        return pipeline_makespan(plan, layout, chunks, [StageTail(0.0, 0.0)] * pp)
    return max(_stage_floor(chunks, pp, v, M, d) for d in range(pp))


def _stage_floor(chunks: list[ChunkTimes], pp: int, v: int, M: int, d: int) -> float:
    """What 1F1B (interleaved or not) takes at least, seen from stage d: the first micro-batch's
    forward reaches its first chunk (virtual stage d) through the stages before it; the stage then
    runs every forward and backward of its chunks one after another; its last op is the last
    micro-batch's backward of that first chunk (graph/pipeline.stage_order, for v = 1 or M a
    multiple of pp), whose gradient goes back through the stages before it. For equal stages
    this is the schedule's own makespan, (M + pp - 1) micro-batches (v = 1)."""
    first = (lambda t: (t.final_fwd_s, t.final_bwd_s)) if M == 1 else (lambda t: (t.fwd_s, t.bwd_s))
    head = sum(first(chunks[j])[0] + chunks[j].send_s for j in range(d))
    tail = sum(chunks[j].final_bwd_s + chunks[j].send_s for j in range(d))
    mine = [chunks[c * pp + d] for c in range(v)]
    work = sum((M - 1) * (t.fwd_s + t.bwd_s) + t.final_fwd_s + t.final_bwd_s for t in mine)
    return head + work + tail


def _stream_busy(plan: Plan, rank: PlanBuild, layers: int, kind: tuple[bool, bool]) -> tuple[float, float]:
    """Seconds the compute stream is busy with a chunk's template kernels in a micro-batch's
    forward (the embedding's on the first chunk, every layer's, the loss's on the last), and in
    its backward. build_microbatch issues each of them in its section (a later micro-batch's
    copies differ only in memory), and the stream runs its ops one at a time in issue order: the
    forward ends no sooner than the first sum, and the backward's stream work, issued after it,
    takes at least the second."""
    gpu, cost, graphs, t = Resource.GPU, rank.rank.cost, plan.cuda_graphs, rank.templates
    first, last = kind

    def busy(ops) -> float:
        return sum(rank.prices(op) + cost.kernel_gap(op, graphs) for op in ops if op.resource == gpu)

    fwd = busy(t.emb_fwd if first else ()) + busy(t.fwd) * layers + busy(t.loss_fwd if last else ())
    bwd = busy(t.loss_bwd if last else ()) + busy(t.bwd) * layers + busy(t.emb_bwd if first else ())
    return fwd, bwd
