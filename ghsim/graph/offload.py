"""Offload schedules: where offloaded state lives, how it crosses the host link, where its work runs.

A step graph without offload (graph/step.py) is rewritten: copies are inserted
after the ops that produce what they move and before the ops that need it, CPU
work is inserted where the schedule runs it, and the optimizer is replaced.
Three schedules (plan.OffloadSchedule):

- sync: what plain PyTorch code does (validation/harness/train_step.py):
  `save_on_cpu` activations and, after backward, every gradient copied to
  pinned host memory on the compute stream, `torch.optim.AdamW` on the CPU,
  parameters copied back; nothing overlaps. With parameters offloaded it is
  FSDP's CPUOffload: fp32 flat parameters fetched per layer and cast on the
  GPU, fp32 gradients sent down per layer, the CPU AdamW after backward.
- overlapped: DeepSpeed ZeRO-Offload / ZeRO-Infinity. Gradients stream to the
  host per layer in buckets on the D2H copy engine while backward runs; the
  CPU-Adam waits for all of them (global gradient norm and overflow check),
  then updates layer by layer, each layer's bf16 parameters copied back as
  soon as they are ready. Parameters (ZeRO-Infinity) are prefetched one layer
  ahead; activations leave on the D2H engine and are prefetched back one
  layer ahead of their backward.
- superoffload (Lian et al. 2025, DeepSpeed blog "SuperOffload"):
  speculation-then-validation lets the CPU-Adam update each bucket as soon as
  it arrives, overlapping backward; the last (1 - offload_ratio) of the
  gradients in backward order stay on the GPU with their optimizer states
  (the "tail buckets"), so the step does not end waiting for the CPU; buckets
  are sized to saturate the link; each cast (bf16 <-> fp32) runs where it is
  cheapest, GPU before the copy or CPU after it.

With offload_ratio < 1 the other schedules split the optimizer the same way
(DeepSpeed ZeRO-Offload++ "Twin-Flow" ratio).

The same rewrite serves a multi-GPU rank's micro-batch (graph/parallel.py), which
says through `RankHooks` what a whole-step graph need not: where its gradients
become ready to leave (after each bucket's reduce-scatter or all-reduce, as
ZeRO-Offload copies each rank's reduced partition down), which ZeRO-3
all-gather consumes each layer's fetched parameter shard (ZeRO-Infinity: the
rank's 1/dp shard comes over the host link, then the gather), and whether the
optimizer follows. Each rank offloads only its shard (1/dp of the states under
ZeRO >= 1); HostSide prices its share of the host (cost/hostlink.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace

from ghsim.errors import GhsimError
from ghsim.graph import ops as K
from ghsim.graph.ops import Op, OpGraph
from ghsim.model import ModelSpec
from ghsim.graph.optimizer import TORCH_CPU_ADAM, VECTOR_CPU_ADAM, gpu_adamw
from ghsim.plan import Framework, OffloadSchedule, Plan, Recompute

# DeepSpeed's default reduce_bucket_size: 5e8 elements per gradient bucket
# (deepspeed/runtime/zero/config.py, ZeroConfig.reduce_bucket_size).
DEEPSPEED_BUCKET_ELEMENTS = 5e8
# SuperOffload sizes buckets to saturate the link: large enough that the per-copy
# latency costs at most this share of a bucket's transfer time.
BUCKET_LATENCY_SHARE = 0.05

FWD, BWD = "fwd", "bwd"


@dataclass(frozen=True)
class OffloadSetup:
    """The offload a plan asks for, resolved: which state moves, how, and who updates what."""

    schedule: OffloadSchedule  # never AUTO
    optimizer: bool  # fp32 masters and AdamW states on the host (gradients must reach it)
    params: bool  # parameters live on the host, fetched per layer
    activations: bool  # saved activations go to the host in forward
    cpu_share: float  # fraction of the optimizer work on the CPU (offload_ratio)
    shard: int  # ranks sharing optimizer state and gradients (ZeRO >= 1): each offloads 1/shard
    cpu_impl: str  # torch (torch.optim.AdamW on CPU) | deepspeed (vectorized CPU-Adam)
    pinned: bool

    @property
    def any(self) -> bool:
        return self.optimizer or self.params or self.activations

    @property
    def fsdp_like(self) -> bool:
        """Parameters offloaded by plain PyTorch: FSDP CPUOffload semantics."""
        return self.params and self.schedule == OffloadSchedule.SYNC

    @property
    def streams_gradients(self) -> bool:
        """Gradients leave for the host as backward produces them (or as their reduction ends),
        and their GPU copies are freed; otherwise (plain PyTorch optimizer offload) they
        accumulate on the GPU and are copied down once, after the step's last backward."""
        return self.optimizer and (self.schedule != OffloadSchedule.SYNC or self.params)


def resolve_schedule(plan: Plan) -> OffloadSchedule:
    """The plan's offload schedule, "auto" resolved: the framework's own (DeepSpeed overlaps, plain PyTorch syncs)."""
    if plan.offload_schedule == OffloadSchedule.AUTO:
        return OffloadSchedule.OVERLAPPED if plan.framework == Framework.DEEPSPEED else OffloadSchedule.SYNC
    return plan.offload_schedule


def resolve(plan: Plan) -> OffloadSetup:
    schedule = resolve_schedule(plan)
    params = "params" in plan.offload
    # Gradients must reach the CPU optimizer, and offloaded parameters are updated
    # where their fp32 masters live (ZeRO-Infinity, FSDP CPUOffload): both imply the rest.
    optimizer = "optimizer" in plan.offload or "grads" in plan.offload or params
    return OffloadSetup(
        schedule=schedule,
        optimizer=optimizer,
        params=params,
        activations="activations" in plan.offload,
        cpu_share=plan.offload_ratio if optimizer else 0.0,
        shard=plan.dp if plan.zero >= 1 else 1,
        cpu_impl=VECTOR_CPU_ADAM if plan.framework == Framework.DEEPSPEED else TORCH_CPU_ADAM,
        pinned=plan.offload_pinned,
    )


def check_offload(plan: Plan) -> None:
    """Offload choices that make no sense whatever the hardware: one line each."""
    setup = resolve(plan)
    if plan.offload_schedule == OffloadSchedule.SUPEROFFLOAD and not setup.optimizer:
        raise GhsimError("--offload-schedule superoffload schedules the optimizer: add --offload optimizer")


# --- the rewrite -----------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """Consecutive ops of one micro-batch, one layer (-1: embedding or loss), one direction."""

    first: int
    last: int
    mb: int
    layer: int
    direction: str  # FWD | BWD


def find_runs(graph: OpGraph) -> list[Run]:
    runs: list[Run] = []
    start = None
    key = None
    for i, op in enumerate(graph.ops):
        direction = FWD if op.phase == "fwd" else BWD if op.phase in ("bwd", "recompute") else None
        k = (graph.microbatch[i], graph.layer[i], direction) if direction else None
        if k != key:
            if key is not None:
                runs.append(Run(start, i - 1, key[0], key[1], key[2]))
            start, key = i, k
    if key is not None:
        runs.append(Run(start, len(graph.ops) - 1, key[0], key[1], key[2]))
    return runs


@dataclass(eq=False)
class New:
    """An op to insert; deps are old indices (int) or other New ops placed before it."""

    op: Op
    deps: list = field(default_factory=list)
    layer: int = -1
    mb: int = 0
    index: int = -1


class Rewriter:
    """Insert ops before/after existing ones and add dependencies, then rebuild the graph."""

    def __init__(self, graph: OpGraph):
        self.old = graph
        self.before: dict[int, list[New]] = defaultdict(list)
        self.after: dict[int, list[New]] = defaultdict(list)
        self.extra_deps: dict[int, list[New]] = defaultdict(list)
        self.tail: list[New] = []
        self.mapping: list[int] = []  # after build(): new index of each old op

    def insert_before(self, i: int, new: New) -> New:
        self.before[i].append(new)
        return new

    def insert_after(self, i: int, new: New) -> New:
        self.after[i].append(new)
        return new

    def append(self, new: New) -> New:
        self.tail.append(new)
        return new

    def add_dep(self, i: int, new: New) -> None:
        self.extra_deps[i].append(new)

    def build(self) -> OpGraph:
        old, g = self.old, OpGraph()
        n = len(old.ops)
        # where every old op lands: shifted by the insertions before it (one pass over the
        # insertion points, not over the ops: graphs have tens of thousands of ops)
        mapping = [0] * n
        placed: list[tuple[int, New]] = []
        prev = offset = 0
        for p in sorted(set(self.before) | set(self.after)):
            mapping[prev:p] = range(prev + offset, p + offset)
            for k, new in enumerate(self.before.get(p, ())):
                new.index = p + offset + k
                placed.append((new.index, new))
            offset += len(self.before.get(p, ()))
            mapping[p] = p + offset
            for k, new in enumerate(self.after.get(p, ())):
                new.index = p + offset + 1 + k
                placed.append((new.index, new))
            offset += len(self.after.get(p, ()))
            prev = p + 1
        mapping[prev:n] = range(prev + offset, n + offset)
        total = n + offset + len(self.tail)
        for k, new in enumerate(self.tail):
            new.index = n + offset + k
            placed.append((new.index, new))

        def ref(d, at: int) -> int:
            i = d.index if isinstance(d, New) else mapping[d]
            if not 0 <= i < at:
                name = d.op.name if isinstance(d, New) else old.ops[d].name
                raise ValueError(f"{name} is used before it is placed")
            return i

        g.ops, g.deps = [None] * total, [()] * total  # type: ignore[list-item]
        g.layer, g.microbatch = [-1] * total, [0] * total
        at = mapping.__getitem__
        for i in range(n):
            j = mapping[i]
            g.ops[j], g.layer[j], g.microbatch[j] = old.ops[i], old.layer[i], old.microbatch[i]
            deps = old.deps[i]
            g.deps[j] = tuple(map(at, deps)) if deps else ()
        for i, extra in self.extra_deps.items():
            j = mapping[i]
            g.deps[j] = tuple(sorted(set(g.deps[j]) | {ref(d, j) for d in extra}))
        for j, new in placed:
            g.ops[j], g.layer[j], g.microbatch[j] = new.op, new.layer, new.mb
            g.deps[j] = tuple(sorted({ref(d, j) for d in new.deps}))
        self.mapping = mapping
        return g


# --- op constructors -------------------------------------------------------------------
def copy_op(name: str, direction: str, nbytes: float, phase: str, setup: OffloadSetup, resource: str,
          transfers: int = 1, duplex: bool = False) -> Op:
    return Op(name=name, category=K.COPY, kind=direction, resource=resource, bytes=nbytes, phase=phase,
              kernels=transfers, pinned=setup.pinned, variant="duplex" if duplex else "")


def gpu_cast(name: str, params: float, phase: str, stream: str = "gpu") -> Op:
    """bf16 <-> fp32 on the GPU: read one width, write the other (6 bytes per element).
    `stream`: where it is queued (the stream of the collective it follows or feeds, if any)."""
    return Op(name=name, category="elementwise", kind=K.MEMBOUND, resource=stream, variant="cast_fp32_to_bf16",
              bytes=6 * params, phase=phase, hbm_transient=4 * params)


def cpu_bytes(name: str, nbytes: float, phase: str, host_waits: bool) -> Op:
    return Op(name=name, category=K.CPU, kind=K.CPU_MEM, resource="cpu", bytes=nbytes, phase=phase, kernels=0,
              host_waits=host_waits)


def cpu_adam(name: str, params: float, setup: OffloadSetup, host_waits: bool) -> Op:
    return Op(name=name, category=K.CPU, kind=K.OPT_CPU, resource="cpu", params=params, phase="opt",
              variant=setup.cpu_impl, kernels=0, host_waits=host_waits)


def _marker(name: str, phase: str) -> Op:
    """A zero-time op on the compute stream that only carries a memory change."""
    return Op(name=name, category="other", kind=K.HOST_WORK, resource="gpu", kernels=0, phase=phase)


def _gpu_adam(params: float, n_tensors: int, plan: Plan) -> Op:
    """The GPU's share of AdamW: DeepSpeed runs its fused multi-tensor Adam; PyTorch the plan's impl."""
    impl = plan.optimizer_impl
    if plan.framework == Framework.DEEPSPEED or impl not in ("foreach", "fused"):
        impl = "fused"
    return gpu_adamw(f"adamw.{impl}.gpu_share", params, n_tensors, impl)


# --- the schedules ----------------------------------------------------------------------
@dataclass(frozen=True)
class StepFacts:
    """What the rewrite needs to know about the step it rewrites."""

    trainable: float  # trainable parameters (per GPU, before ZeRO sharding)
    n_tensors: int
    saved_per_layer: float  # activation bytes a layer keeps for its backward (recompute: its input)
    gpu_param_width: int  # bytes per parameter the GPU computes with (fp32 under torch-amp)
    layer_params: float  # parameters of one decoder layer (all, trainable or not)
    grad_width: float = 0.0  # bytes per gradient element; 0: from the graph's gradient allocations


@dataclass(frozen=True)
class GradSource:
    """Gradients ready to leave for the host: after a backward run, or after their reduction."""

    after: int  # index of the op after which they are ready
    params: float  # parameters they cover, before ZeRO sharding
    held: float  # HBM bytes their copy down frees
    key: tuple  # the same piece of the model in every micro-batch
    layer: int = -1
    mb: int = 0
    accumulate: bool = False  # the host adds them to earlier micro-batches' gradients
    stream: str = "gpu"  # where they are produced (a GPU cast of them is queued there)


@dataclass(frozen=True)
class RankHooks:
    """What a multi-GPU micro-batch graph tells the rewrite (graph/parallel.py)."""

    grad_sources: tuple[GradSource, ...]  # in backward order
    gathers: dict[tuple[str, int], int]  # (FWD|BWD, layer) -> the ZeRO-3 all-gather of that layer
    steps: bool  # the optimizer step follows this graph (the step's last micro-batch)
    loss: bool  # the graph holds the final norm, LM head and loss


def apply_offload_mapped(graph: OpGraph, model: ModelSpec, plan: Plan, facts: StepFacts, widths: Widths,
                         hooks: RankHooks | None = None) -> tuple[OpGraph, list[int]]:
    """The graph with the plan's offload schedule woven in, and where each op of `graph` moved to
    (for callers that hold op indices, such as a micro-batch's end of forward). `widths`: what
    crosses the link and where the casts run (cost/offload_policy.py). Works on any graph whose ops carry
    phases (fwd, bwd, recompute) and layer numbers; collectives on other streams stay put.
    Without `hooks` the graph is a whole step on one GPU: gradients leave after the
    backward run that makes them, and the optimizer follows the last micro-batch."""
    setup = resolve(plan)
    rw = Rewriter(graph)
    runs = find_runs(graph)
    sched = setup.schedule
    overlapped = sched != OffloadSchedule.SYNC

    def new(op: Op, deps=(), layer: int = -1, mb: int = 0) -> New:
        """An insertion of `op` (the same op object however many times it is inserted)."""
        return New(op, list(deps), layer, mb)

    by_mb: dict[int, dict[str, list[Run]]] = defaultdict(lambda: {FWD: [], BWD: []})
    for run in runs:
        by_mb[run.mb][run.direction].append(run)
    grad_width = facts.grad_width
    if not grad_width:
        grads_on_gpu = sum((graph.ops[i].hbm_by_tag or {}).get("grads", 0.0) for i in range(len(graph.ops))
                           if graph.microbatch[i] == 0 and (graph.ops[i].hbm_by_tag or {}).get("grads", 0.0) > 0)
        grad_width = grads_on_gpu / facts.trainable if facts.trainable else 4.0

    # which copies overlap the other direction (they then share PCIe's bidirectional cap)
    duplex_fwd = overlapped and setup.params and setup.activations
    duplex_bwd = overlapped and (setup.params or setup.activations
                                 or sched == OffloadSchedule.SUPEROFFLOAD) and setup.optimizer

    if setup.activations and overlapped:
        _activation_copies(rw, by_mb, facts, setup, new, duplex_fwd, duplex_bwd)
    elif setup.activations and plan.recompute != Recompute.FULL and (hooks is None or hooks.loss):
        _sync_loss_offload(rw, by_mb, model, plan, new)
    if setup.params:
        _parameter_fetches(rw, by_mb, facts, setup, new, duplex_fwd, duplex_bwd, hooks.gathers if hooks else {})
    if setup.optimizer:
        sources = list(hooks.grad_sources) if hooks else _run_sources(graph, by_mb, grad_width)
        _optimizer(rw, sources, plan, facts, setup, new, grad_width, duplex_bwd, widths,
                   hooks.steps if hooks else True)
    out = rw.build()
    return out, rw.mapping


def _activation_copies(rw, by_mb, facts, setup, new, duplex_fwd, duplex_bwd) -> None:
    """Each layer's saved activations leave after its forward and are prefetched one layer ahead."""
    saved = facts.saved_per_layer
    if saved <= 0:
        return
    d2h = replace(copy_op("activations.d2h", K.D2H, saved, "fwd", setup, "d2h", duplex=duplex_fwd),
                  host_alloc=saved, mem_tag="offloaded_activations").with_hbm("activations", -saved)
    h2d = replace(copy_op("activations.h2d", K.H2D, saved, "bwd", setup, "h2d", duplex=duplex_bwd),
                  host_free=saved, mem_tag="offloaded_activations").with_hbm("activations", saved)
    for mb, dirs in by_mb.items():
        sent = {}
        for run in dirs[FWD]:
            if run.layer >= 0:
                sent[run.layer] = rw.insert_after(run.last, new(d2h, [run.last], run.layer, mb))
        bwd = dirs[BWD]
        for k, run in enumerate(bwd):
            if run.layer < 0 or run.layer not in sent:
                continue
            ahead = bwd[k - 1] if k > 0 else run  # prefetch while the previous backward run computes
            fetch = rw.insert_before(ahead.first, new(h2d, [sent[run.layer]], run.layer, mb))
            rw.add_dep(run.first, fetch)


def _parameter_fetches(rw, by_mb, facts, setup, new, duplex_fwd, duplex_bwd, gathers) -> None:
    """Layer parameters come from the host one layer ahead into a GPU buffer, forward and backward.

    FSDP (sync) fetches the fp32 flat parameter and casts it on the GPU; ZeRO-Infinity
    fetches the bf16 working copy. At most two layer buffers are in flight. With ZeRO-3
    over several ranks (`gathers`), each rank fetches its shard just before the layer's
    all-gather, which the gather waits for (the cast runs on the gather's stream).
    """
    P = facts.layer_params / setup.shard
    fsdp = setup.fsdp_like
    width = 4 if fsdp else 2
    buffer = P * facts.gpu_param_width if not fsdp else P * 2
    for mb, dirs in by_mb.items():
        for direction, duplex in ((FWD, duplex_fwd), (BWD, duplex_bwd)):
            seq = dirs[direction]
            fetch_op = copy_op(f"params.h2d.{direction}", K.H2D, P * width, direction, setup, "h2d",
                             duplex=duplex).with_hbm("param_buffers", buffer)
            release = _marker(f"params.release.{direction}", direction).with_hbm("param_buffers", -buffer)
            casts = {s: gpu_cast(f"params.cast.{direction}", P, direction, s) for s in ("gpu", "dp")} if fsdp else {}
            layer_runs = [(k, r) for k, r in enumerate(seq) if r.layer >= 0]
            for n, (k, run) in enumerate(layer_runs):
                gather = gathers.get((direction, run.layer))
                consumer = run.first if gather is None else gather
                ahead = seq[k - 1].first if k > 0 and gather is None else consumer
                deps = [layer_runs[n - 2][1].last] if n >= 2 else []  # its buffer is free again
                fetch = rw.insert_before(ahead, new(fetch_op, deps, run.layer, mb))
                if casts:
                    fetch = rw.insert_before(consumer, new(casts["gpu" if gather is None else "dp"], [fetch],
                                                           run.layer, mb))
                rw.add_dep(consumer, fetch)
                rw.insert_after(run.last, new(release, [], run.layer, mb))


def _bucket_count(nbytes: float, setup: OffloadSetup, link_bucket: float) -> int:
    """Copies a run's gradients take: DeepSpeed's fixed buckets, or buckets sized to the link
    (`link_bucket` bytes: SuperOffload's, from Widths)."""
    if setup.schedule == OffloadSchedule.SUPEROFFLOAD:
        bucket = link_bucket
    elif setup.schedule == OffloadSchedule.OVERLAPPED:
        bucket = DEEPSPEED_BUCKET_ELEMENTS * 2
    else:
        return 1
    return max(1, math.ceil(nbytes / bucket))


def _run_sources(graph: OpGraph, by_mb, grad_width: float) -> list[GradSource]:
    """One GPU's whole step: each backward run's gradients leave after it, in every micro-batch."""
    per_run_bytes = _grad_bytes_per_run(graph, by_mb)
    out = []
    for mb in sorted(by_mb):
        runs = by_mb[mb][BWD]
        for run in runs:
            k = (run.layer, run.first - runs[0].first)
            if k not in per_run_bytes:
                continue
            held = sum((graph.ops[i].hbm_by_tag or {}).get("grads", 0.0) for i in range(run.first, run.last + 1))
            out.append(GradSource(run.last, per_run_bytes[k] / grad_width, held, k, run.layer, mb, mb > 0))
    return out


def _optimizer(rw, sources: list[GradSource], plan, facts, setup, new, grad_width, duplex_bwd, widths: Widths,
               steps: bool) -> None:
    """Gradients to the host, the CPU's share of AdamW, updated parameters back; the GPU's share.
    `steps`: the optimizer follows (else only the gradients leave, to be accumulated on the host)."""
    sched = setup.schedule
    P = facts.trainable

    # The CPU takes the first cpu_share of the gradients in backward order (whole pieces);
    # the GPU keeps the tail, with its optimizer states (SuperOffload's tail buckets).
    target, taken, on_cpu = setup.cpu_share * P, 0.0, set()
    first_mb = min((s.mb for s in sources), default=0)
    for src in sources:
        if src.mb == first_mb and src.params > 0 and taken + src.params <= target * (1 + 1e-9):
            on_cpu.add(src.key)
            taken += src.params
    cpu_params, gpu_params = taken / setup.shard, (P - taken) / setup.shard
    last_mb = max((s.mb for s in sources), default=0)
    ready = sorted({s.after for s in sources if s.mb == last_mb})  # every gradient of the step is reduced

    if sched == OffloadSchedule.SYNC and not setup.params:
        if steps:
            _sync_optimizer(rw, facts, setup, new, grad_width, cpu_params, gpu_params, plan, ready)
        return
    superoffload = sched == OffloadSchedule.SUPEROFFLOAD
    main_thread = not superoffload  # DeepSpeed's CPU-Adam runs in the training loop's thread
    arrivals: list[tuple[New, float, GradSource]] = []  # each piece's last op on its way to the host
    for src in sources:
        if src.key not in on_cpu:
            continue
        params = src.params / setup.shard
        at, mb, layer = src.after, src.mb, src.layer
        deps: list = [at]
        if widths.grad_gpu_cast:
            deps = [rw.insert_after(at, new(gpu_cast("grads.cast_fp32", params, "bwd", src.stream), deps, layer, mb))]
        nbytes = params * widths.grad
        d2h = copy_op("grads.d2h", K.D2H, nbytes, "bwd", setup, "d2h",
                    _bucket_count(nbytes, setup, widths.bucket_d2h), duplex_bwd)
        if src.held > 0:  # the GPU gradient is freed once it has left
            d2h = d2h.with_hbm("grads", -src.held)
        last = rw.insert_after(at, new(d2h, deps, layer, mb))
        if widths.grad_cpu_cast:
            last = rw.insert_after(at, new(cpu_bytes("grads.cast_fp32.cpu", params * 6, "bwd", False),
                                           [last], layer, mb))
        if src.accumulate:  # accumulate into the fp32 host gradient: read both, write one
            last = rw.insert_after(at, new(cpu_bytes("grads.accumulate.cpu", params * 12, "bwd", False),
                                           [last], layer, mb))
        if mb == last_mb:
            arrivals.append((last, params, src))
    if not steps:
        return
    if gpu_params > 0:  # the GPU's share, after backward (and its gradients' reduction), on the compute stream
        tensors = max(1, int(facts.n_tensors * gpu_params * setup.shard / max(P, 1)))
        kept = [s.after for s in sources if s.mb == last_mb and s.key not in on_cpu]
        rw.append(new(_gpu_adam(gpu_params, tensors, plan), kept))
    returns = not setup.params  # else the next step fetches the updated parameters
    barrier = [a for a, _, _ in arrivals]  # ZeRO-Offload: the global gradient norm needs all of them
    prev = None
    later: list[New] = []
    for arrived, params, src in arrivals:
        deps = ([arrived] if superoffload else list(barrier)) + ([prev] if prev is not None else [])
        chain = [new(cpu_adam("cpu_adamw", params, setup, main_thread), deps, src.layer, last_mb)]
        if widths.param_cpu_cast:
            chain.append(new(cpu_bytes("params.cast_bf16.cpu", params * 6, "opt", main_thread), [chain[-1]],
                             src.layer, last_mb))
        prev = chain[-1]
        if returns:
            nbytes = params * widths.param
            chain.append(new(copy_op("params.h2d", K.H2D, nbytes, "opt", setup, "h2d",
                                   _bucket_count(nbytes, setup, widths.bucket_h2d),
                                   superoffload and duplex_bwd), [prev], src.layer, last_mb))
            if widths.param_gpu_cast:
                chain.append(new(gpu_cast("params.cast_bf16", params, "opt"), [chain[-1]], src.layer, last_mb))
        if superoffload:
            # speculative: the CPU steps right behind each bucket, during backward; the copies
            # back are queued after backward's own host-to-device traffic
            cpu_part = [n for n in chain if n.op.resource == "cpu"]
            for n in cpu_part:
                rw.insert_after(src.after, n)
            later.extend(n for n in chain if n.op.resource != "cpu")
        else:
            for n in chain:  # tile by tile: each layer's copy leaves while the CPU updates the next
                rw.append(n)
    for n in later:
        rw.append(n)


def _grad_bytes_per_run(graph: OpGraph, by_mb) -> dict[tuple[int, int], float]:
    """Gradient bytes each backward run creates, keyed by (layer, offset in the micro-batch),
    measured on micro-batch 0 (later ones accumulate into the same tensors)."""
    out: dict[tuple[int, int], float] = {}
    runs = by_mb[0][BWD]
    if not runs:
        return out
    base = runs[0].first
    for run in runs:
        g = sum(max((graph.ops[i].hbm_by_tag or {}).get("grads", 0.0), 0.0) for i in range(run.first, run.last + 1))
        if g > 0:
            out[(run.layer, run.first - base)] = g
    return out


@dataclass(frozen=True)
class Widths:
    """What crosses the host link and where the casts run (cost/offload_policy.py decides)."""

    grad: int  # bytes per parameter of a gradient on the link
    param: int  # bytes per parameter of an updated parameter on the link
    grad_gpu_cast: bool
    grad_cpu_cast: bool
    param_cpu_cast: bool
    param_gpu_cast: bool
    bucket_d2h: float  # bytes per copy of SuperOffload's link-sized buckets, each direction
    bucket_h2d: float


def _sync_optimizer(rw, facts, setup, new, grad_width, cpu_params, gpu_params, plan, ready: list[int]) -> None:
    """Plain PyTorch after backward (validation/harness/train_step.py): every gradient copied to
    pinned host memory on the compute stream, a sync, torch's AdamW on the CPU, the
    parameters copied back, a sync. Gradients stay allocated on the GPU (p.grad).
    `ready`: ops after which every gradient is final (the last reductions, with several GPUs)."""
    if gpu_params > 0:
        rw.append(new(_gpu_adam(gpu_params, facts.n_tensors, plan), ready))
    if cpu_params <= 0:
        return
    tensors = max(1, int(facts.n_tensors * cpu_params / max(facts.trainable, 1)))
    d2h = rw.append(new(replace(copy_op("grads.d2h", K.D2H, cpu_params * grad_width, "opt", setup, "gpu", tensors),
                                host_waits=True), ready))
    adam = rw.append(new(cpu_adam("cpu_adamw", cpu_params, setup, True), [d2h]))
    width = facts.gpu_param_width
    last = adam
    if width == 2:
        last = rw.append(new(cpu_bytes("params.cast_bf16.cpu", cpu_params * 6, "opt", True), [adam]))
    rw.append(new(replace(copy_op("params.h2d", K.H2D, cpu_params * width, "opt", setup, "gpu", tensors),
                          host_waits=True), [last]))


# --- torch.autograd.graph.save_on_cpu (the sync schedule's activation offload) -------------------
# save_on_cpu's pack hook copies every tensor autograd saves, once per saving op, into a
# fresh pinned buffer with a blocking copy (packed.copy_(t)); unpack copies it back with
# non_blocking=True. A tensor saved by two ops travels twice. In the harness's HF-style
# Llama layer (validation/harness/model.py) that is, beyond the distinct tensors the
# builder keeps for backward: each RMSNorm's input (saved by pow and by mul) and rstd
# (rsqrt and mul) twice and its weight once, the attention output (SDPA and o_proj)
# twice, and rotary cos/sin once per q and k. The measured h100 activation-offload trace
# shows exactly these sizes: 40 copies per layer.
SAVE_ON_CPU_TENSORS = {"norms": 2 * 6, "per_projection": 2, "rope": 4, "sdpa": 7, "swiglu": 3, "gelu": 1}


def save_on_cpu_layer(model: ModelSpec, plan: Plan, saved: float) -> tuple[float, int]:
    """Bytes and copies save_on_cpu moves per decoder layer and micro-batch, each way."""
    from ghsim.graph.dtypes import Dtypes

    dt = Dtypes.of(plan)
    T, h = plan.micro_batch * plan.seq, model.hidden_size
    extra = (2 * T * h * dt.residual  # the layer input, saved by pow and mul of the input norm
             + T * h * dt.residual  # the attention residual, saved a second time by the second norm
             + 2 * T * 4 + 2 * h * dt.param  # second rstd per norm, norm weights
             + T * model.q_dim * dt.act  # attention output: SDPA and o_proj
             + 4 * plan.seq * model.head_dim * dt.act)  # cos and sin, for q and for k
    projections = 4 + model.mlp_matrices
    n = (SAVE_ON_CPU_TENSORS["norms"] + projections * SAVE_ON_CPU_TENSORS["per_projection"]
         + SAVE_ON_CPU_TENSORS["rope"] + SAVE_ON_CPU_TENSORS["sdpa"]
         + SAVE_ON_CPU_TENSORS["swiglu" if model.mlp == "swiglu" else "gelu"])
    return saved + extra, n


def save_on_cpu_loss(model: ModelSpec, plan: Plan) -> tuple[float, int]:
    """Bytes and copies save_on_cpu moves for the final norm, LM head and loss, each way."""
    from ghsim.graph.dtypes import Dtypes

    dt = Dtypes.of(plan)
    T, h, V = plan.micro_batch * plan.seq, model.hidden_size, model.vocab_size
    norm = 3 * T * h * max(dt.residual, 4) + 2 * T * 4 + h * dt.param
    head_w = 2 if dt.autocast_casts else dt.param
    head = T * h * dt.act + V * h * head_w
    loss = 2 * T * V * 4  # log_softmax's output, saved by it and by nll_loss
    return norm + head + loss, 6 + 2 + 2


def sync_activation_offload(fwd: list[Op], bwd: list[Op], model: ModelSpec, plan: Plan,
                            saved: float) -> tuple[list[Op], list[Op]]:
    """save_on_cpu around a layer: its saved tensors leave at the end of its forward with
    blocking copies (the host waits) and come back before its backward, on the compute stream."""
    nbytes, copies = save_on_cpu_layer(model, plan, saved)
    d2h = Op(name="activations.d2h", category=K.COPY, kind=K.D2H, resource="gpu", bytes=nbytes, kernels=copies,
             phase="fwd", host_waits=True, host_alloc=nbytes, mem_tag="offloaded_activations")
    h2d = Op(name="activations.h2d", category=K.COPY, kind=K.H2D, resource="gpu", bytes=nbytes, kernels=copies,
             phase="bwd", host_free=nbytes, mem_tag="offloaded_activations")
    return [*fwd, d2h.with_hbm("activations", -saved)], [h2d.with_hbm("activations", saved), *bwd]


def _sync_loss_offload(rw: Rewriter, by_mb, model: ModelSpec, plan: Plan, new) -> None:
    """save_on_cpu also packs what the final norm, the LM head and the loss save."""
    nbytes, copies = save_on_cpu_loss(model, plan)
    d2h = Op(name="loss_activations.d2h", category=K.COPY, kind=K.D2H, resource="gpu", bytes=nbytes, kernels=copies,
             phase="fwd", host_waits=True, host_alloc=nbytes, mem_tag="offloaded_activations")
    h2d = Op(name="loss_activations.h2d", category=K.COPY, kind=K.H2D, resource="gpu", bytes=nbytes, kernels=copies,
             phase="bwd", host_free=nbytes, mem_tag="offloaded_activations")
    for mb, dirs in by_mb.items():
        fwd_loss = [r for r in dirs[FWD] if r.layer < 0]
        bwd_loss = [r for r in dirs[BWD] if r.layer < 0]
        if len(fwd_loss) < 2 or not bwd_loss:
            continue
        sent = rw.insert_after(fwd_loss[-1].last, new(d2h, [fwd_loss[-1].last], -1, mb))
        back = rw.insert_before(bwd_loss[0].first, new(h2d, [sent], -1, mb))
        rw.add_dep(bwd_loss[0].first, back)


def saved_bytes_for(plan: Plan, saved: float, x_bytes: float) -> float:
    """What a layer offloads: its saved activations, or under full recompute its checkpointed input."""
    return x_bytes if plan.recompute == Recompute.FULL else saved
