"""Pipeline schedules: one aggregated op per micro-batch forward and backward of each chunk.

The kernel-level graph of one micro-batch (graph/parallel.py) is simulated once
per kind of chunk; here its forward and backward spans become single ops, one
per (stage, chunk, micro-batch), scheduled in Megatron-LM's 1F1B order
(Narayanan et al., SC21, Sec. 2.2): each stage runs pp - stage - 1 warm-up
forwards, then alternates one forward and one backward, then drains. With
interleaving (v chunks per stage, stage d holding chunks d, d + pp, ...) the
warm-up is (pp - d - 1) * 2 + (v - 1) * pp chunk-forwards and micro-batches
go through the chunks in groups of pp, as in Megatron's interleaved schedule.

Activations and their gradients cross stages as point-to-point sends on the
link between the two stages; after a stage's last backward its remaining
gradient reductions run on its data-parallel link, then the optimizer. This
module builds that op graph; sim/pipeline.py runs it on the engine
(sim/engine.py), and the bubbles fall out.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ghsim.graph.ops import Category, Kind, Op, OpGraph, Resource

FWD, BWD = "F", "B"


class PipelineSegment(StrEnum):
    """What one pipeline-schedule op stands for (its Op.phase)."""

    FWD = "fwd"
    BWD = "bwd"  # backward of a micro-batch that is not the step's last
    FINAL_FWD = "final_fwd"
    FINAL_BWD = "final_bwd"
    OPT = "opt"  # the stage's optimizer step
    COMM = "comm"  # gradient reductions and parameter gathers on the data-parallel link
    P2P = "p2p"  # activations or their gradients sent to the neighbouring stage
    DATA = "data"  # a batch from the data-loader pool


@dataclass(frozen=True)
class ChunkTimes:
    """Seconds of one micro-batch of one chunk, from its kernel-level simulation."""

    fwd_s: float
    bwd_s: float  # backward of a micro-batch that is not the step's last
    bwd_comm_s: float  # its gradient reduce-scatter still running after it (ZeRO-2/3)
    final_fwd_s: float
    final_bwd_s: float
    final_comm_s: float  # gradient reductions still running after the last backward
    send_s: float  # activations to the next chunk (the gradient back costs the same)
    # the framework's sends hold the sending stage's GPU until they complete (Megatron-LM 2021-22's
    # p2p_communication._communicate: batch_isend_irecv, req.wait(), then torch.cuda.synchronize();
    # DeepSpeed's PipelineEngine: blocking dist.send / dist.recv); else a send overlaps the next compute
    send_blocks: bool = False


@dataclass(frozen=True)
class StageTail:
    optimizer_s: float  # optimizer step on the compute stream
    gather_s: float  # updated parameters gathered back (ZeRO-1/2), on the data-parallel link


def stage_order(pp: int, v: int, M: int, d: int) -> list[tuple[str, int, int]]:
    """(F|B, chunk on this stage, micro-batch) in the order stage d runs them."""
    total = M * v
    if v == 1:
        warmup = min(pp - d - 1, M)
    else:
        warmup = min((pp - d - 1) * 2 + (v - 1) * pp, total)

    def item(kind: str, k: int) -> tuple[str, int, int]:
        c = (k // pp) % v
        if kind == BWD:
            c = v - 1 - c
        return kind, c, (k // (pp * v)) * pp + k % pp

    order = [item(FWD, k) for k in range(warmup)]
    for i in range(total - warmup):
        order += [item(FWD, warmup + i), item(BWD, i)]
    order += [item(BWD, k) for k in range(total - warmup, total)]
    return order


@dataclass(frozen=True)
class PipelineGraph:
    """The pipeline schedule as ops in issue order, ready for the engine."""

    graph: OpGraph
    resources: list[str]  # stream names, in order of first use
    resource_of: list[int]  # index into `resources` of each op
    durations: list[float]
    stage_of: list[int]  # stage of each op
    segment: list[PipelineSegment]


def peak_inflight_bytes(pp: int, v: int, M: int, d: int, saved: list[float]) -> tuple[float, int]:
    """Most activation bytes stage d holds when a backward starts, and how many micro-batch
    chunks that is; saved[c] is what one forward of its chunk c leaves for its backward.
    1F1B keeps up to pp - d micro-batches in flight (all pp on stage 0)."""
    live, count, peak, peak_count = 0.0, 0, 0.0, 0
    for kind, c, _m in stage_order(pp, v, M, d):
        if kind == FWD:
            live += saved[c]
            count += 1
        else:
            if live > peak:
                peak, peak_count = live, count
            live -= saved[c]
            count -= 1
    return peak, peak_count


def build_pipeline(pp: int, v: int, M: int, chunks: list[ChunkTimes], tails: list[StageTail],
                   loader_s: float = 0.0) -> PipelineGraph:
    """The ops of M micro-batches through pp stages of v chunks each; chunks[j] is virtual stage j.
    `loader_s`: a data-loader pool delivers a batch every loader_s seconds (the first one
    prefetched during the previous step); the first chunk's forward of a micro-batch waits for it."""
    J = pp * v
    # members read off their class once, not per op (graph/ops.py: slow in Python 3.11)
    fwd, final_fwd, bwd, final_bwd = (PipelineSegment.FWD, PipelineSegment.FINAL_FWD, PipelineSegment.BWD,
                                      PipelineSegment.FINAL_BWD)
    p2p, comm_link, opt = PipelineSegment.P2P, PipelineSegment.COMM, PipelineSegment.OPT
    data = PipelineSegment.DATA
    items: list[list[tuple]] = []  # per stage: (key, resource, seconds, dep keys, segment, chunk, mb)
    for d in range(pp):
        seq: list[tuple] = []
        tail_deps = []
        gpu, dp = f"{Resource.GPU}{d}", f"{Resource.DP}{d}"
        for kind, c, m in stage_order(pp, v, M, d):
            j = c * pp + d
            t = chunks[j]
            last_mb = m == M - 1
            if kind == FWD:
                deps = [("PF", j - 1, m)] if j > 0 else []
                if j == 0 and loader_s > 0:
                    seq.append((("L", m), Resource.LOADER, loader_s if m else 0.0, [], data, -1, m))
                    deps = [("L", m)]
                seq.append(((FWD, j, m), gpu, t.final_fwd_s if last_mb else t.fwd_s, deps,
                            final_fwd if last_mb else fwd, c, m))
                if j < J - 1:
                    link = gpu if t.send_blocks else _link(d, (j + 1) % pp)
                    seq.append((("PF", j, m), link, t.send_s, [(FWD, j, m)], p2p, c, m))
            else:
                deps = [("PB", j + 1, m)] if j < J - 1 else [(FWD, j, m)]
                seq.append(((BWD, j, m), gpu, t.final_bwd_s if last_mb else t.bwd_s, deps,
                            final_bwd if last_mb else bwd, c, m))
                if j > 0:
                    link = gpu if t.send_blocks else _link(d, (j - 1) % pp)
                    seq.append((("PB", j, m), link, chunks[j - 1].send_s, [(BWD, j, m)], p2p, c, m))
                comm = t.final_comm_s if last_mb else t.bwd_comm_s
                if comm > 0:
                    seq.append((("C", j, m), dp, comm, [(BWD, j, m)], comm_link, c, m))
                    tail_deps.append(("C", j, m))
                tail_deps.append((BWD, j, m))
        seq.append((("OPT", d), gpu, tails[d].optimizer_s, tail_deps, opt, -1, -1))
        if tails[d].gather_s > 0:
            seq.append((("AG", d), dp, tails[d].gather_s, [("OPT", d)], comm_link, -1, -1))
        items.append(seq)
    return _issue(items, pp)


def _link(src: int, dst: int) -> str:
    return f"p2p{src}>{dst}"


def _issue(items: list[list[tuple]], pp: int) -> PipelineGraph:
    """Issue every stage's ops in its own order, interleaving stages so dependencies come first.

    Ops of one (stage, segment, chunk) share one Op object (the graph keeps each copy's
    deps and micro-batch), so a 3072-GPU pipeline of 130k ops stays cheap."""
    graph = OpGraph()
    index: dict[tuple, int] = {}
    names: dict[str, int] = {}
    resources: list[str] = []
    shared: dict[tuple, Op] = {}
    resource_of, durations, stage_of, segment = [], [], [], []
    g_ops, g_deps, g_layer, g_mb = graph.ops, graph.deps, graph.layer, graph.microbatch
    pos = [0] * pp
    waiting: dict[tuple, list[int]] = {}  # key not yet issued -> stages blocked on it
    ready = list(range(pp - 1, -1, -1))
    while ready:
        d = ready.pop()
        seq = items[d]
        p = pos[d]
        while p < len(seq):
            key, res, seconds, deps, seg, c, m = seq[p]
            missing = next((k for k in deps if k not in index), None)
            if missing is not None:
                waiting.setdefault(missing, []).append(d)
                break
            r = names.get(res)
            if r is None:
                r = names[res] = len(resources)
                resources.append(res)
            op = shared.get((res, seg, c, seconds))
            if op is None:
                category = (Category.COMMUNICATION if seg in (PipelineSegment.COMM, PipelineSegment.P2P)
                            else Category.OPTIMIZER if seg == PipelineSegment.OPT else Category.OTHER)
                name = f"{seg} chunk {c}" if c >= 0 else f"{seg} stage {d}"
                op = shared[(res, seg, c, seconds)] = Op(name=name, category=category, kind=Kind.HOST_WORK,
                                                         resource=res, seconds=seconds, kernels=0, phase=seg)
            index[key] = len(g_ops)
            g_ops.append(op)
            g_deps.append(tuple(index[k] for k in deps))
            g_layer.append(c)
            g_mb.append(max(m, 0))
            resource_of.append(r)
            durations.append(seconds)
            stage_of.append(d)
            segment.append(seg)
            ready.extend(waiting.pop(key, ()))
            p += 1
        pos[d] = p
    if any(pos[d] < len(items[d]) for d in range(pp)):
        raise RuntimeError("pipeline schedule deadlocks: an op waits for one never issued")
    return PipelineGraph(graph, resources, resource_of, durations, stage_of, segment)
