"""Multi-GPU layouts and the op graph of one micro-batch on one representative rank.

A plan with tp x pp x dp GPUs (and ep expert-parallel ranks carved out of dp)
is simulated on one rank per pipeline stage: the ranks of a stage do the same
work on other data, so one stands for all (symmetry). This module

- places ranks on nodes the way Megatron-LM does (tp fastest, then dp, then pp)
  and says, for each communicator, how many of its ranks share a node;
- shards the model for one rank (heads, FFN width, vocabulary over tp; experts over ep);
- says what model state one GPU holds under each ZeRO stage and framework;
- builds the kernel-level op graph of one micro-batch of one pipeline chunk,
  with the tensor-parallel collectives inside each layer (graph/transformer.py),
  ZeRO-3 parameter gathers with prefetch, and data-parallel gradient
  reductions in buckets overlapping the backward, on their own link streams.

graph/pipeline.py then schedules these micro-batches across stages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ghsim.graph.collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, Group
from ghsim.errors import GhsimError
from ghsim.graph import ops as K
from ghsim.graph.offload import (
    GradSource,
    RankHooks,
    StepFacts,
    Widths,
    apply_offload_mapped,
    superoffload_whole_sub_groups,
)
from ghsim.graph.offload import resolve as resolve_offload
from ghsim.graph.offload import saved_bytes_for as offload_saved_bytes
from ghsim.graph.ops import Category, Op, OpGraph, Phase, Resource
from ghsim.graph.states import StageParams, StateBytes, persistent_grad_shards, pinned_tensor_blocks, shards_grads
from ghsim.graph.step import (
    LayerTemplates,
    ParamCounts,
    _optimizer_ops,
    accumulating,
    input_ops,
    layer_templates,
    param_counts,
    trainable_tensor_sizes,
)
from ghsim.graph.dtypes import Dtypes
from ghsim.graph.zero3_window import layers_kept_for_backward
from ghsim.graph.layer_ops import LayerSplit
from ghsim.hardware import Hardware, bigger_node_hint
from ghsim.model import ModelSpec
from ghsim.plan import Framework, Plan

# Members read in the builder's per-layer and per-op loops, bound once (see graph/ops.py on their cost).
FWD, BWD, OPT, DP = Phase.FWD, Phase.BWD, Phase.OPT, Resource.DP

# Gradient buckets, by framework (bytes of gradients reduced per collective call).
DDP_BUCKET_BYTES = 25 * 2**20  # torch DistributedDataParallel(bucket_cap_mb=25), the default
# FSDP reduces each wrapped unit (one decoder layer here) on its own.


@dataclass(frozen=True)
class Layout:
    """How the plan's GPUs are arranged: parallel degrees and node size."""

    gpus: int
    tp: int
    pp: int
    dp: int
    ep: int
    gpus_per_node: int
    interleave: int = 1  # model chunks per pipeline stage (interleaved 1F1B)
    sequence_parallel: bool = False
    stage_layers: tuple[int, ...] = ()  # decoder layers of each stage (Plan.pp_layers); (): an even split

    @staticmethod
    def of(plan: Plan, hw: Hardware) -> "Layout":
        per_node = plan.gpus_per_node or min(hw.gpus_per_node, plan.gpus)
        return Layout(plan.gpus, plan.tp, plan.pp, plan.dp, plan.ep, min(per_node, plan.gpus),
                      plan.pp_interleave, plan.sequence_parallel, plan.pp_layers)

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_node)

    @property
    def chunks(self) -> int:
        """Pipeline chunks (virtual stages) the layers are cut into."""
        return self.pp * self.interleave

    def chunks_of(self, num_layers: int) -> list["Chunk"]:
        """Each pipeline chunk (virtual stage j, in model order): its decoder layers, and whether
        it holds the embedding (the first) or the loss (the last)."""
        J = self.chunks
        layers = self.stage_layers or (num_layers // J,) * J
        return [Chunk(layers[j], j == 0, j == J - 1) for j in range(J)]

    def _group(self, name: str, size: int, stride: int) -> Group:
        per_node = min(size, max(1, self.gpus_per_node // stride))
        return Group(name, size, per_node)

    def groups(self) -> dict[str, Group]:
        """Communicators of one rank, by the link stream their collectives run on."""
        return {
            Resource.TP: self._group(Resource.TP, self.tp, 1),
            Resource.DP: self._group(Resource.DP, self.dp, self.tp),
            Resource.EP: self._group(Resource.EP, self.ep, self.tp),
            Resource.PP: self._group(Resource.PP, self.pp, self.tp * self.dp),
        }

    def split(self) -> LayerSplit:
        return LayerSplit(self.tp, self.sequence_parallel and self.tp > 1, self.ep)


def check_layout(model: ModelSpec, hw: Hardware, plan: Plan) -> None:
    """Multi-GPU plan choices the model or the hardware cannot honour: one clear line each."""
    tp, pp, ep = plan.tp, plan.pp, plan.ep
    v = plan.pp_interleave
    if plan.gpus_per_node > hw.gpus_per_node:
        raise GhsimError(f"--gpus-per-node {plan.gpus_per_node} exceeds the {hw.gpus_per_node} GPU(s) "
                         f"a {hw.name} node has{bigger_node_hint(hw)}")
    per_node = plan.gpus_per_node or min(hw.gpus_per_node, plan.gpus)
    if plan.gpus > per_node and plan.gpus % per_node:
        raise GhsimError(f"--gpus {plan.gpus} is not a whole number of {per_node}-GPU nodes")
    if model.num_attention_heads % tp:
        raise GhsimError(f"--tp {tp} does not divide {model.name}'s {model.num_attention_heads} attention heads")
    if model.num_kv_heads % tp:
        raise GhsimError(f"--tp {tp} does not divide {model.name}'s {model.num_kv_heads} key/value heads "
                         "(Megatron would replicate them; not modeled)")
    if plan.pp_layers:
        if sum(plan.pp_layers) != model.num_layers:
            raise GhsimError(f"--pp-layers {','.join(map(str, plan.pp_layers))} adds up to {sum(plan.pp_layers)} "
                             f"decoder layers; {model.name} has {model.num_layers}")
    elif model.num_layers % (pp * v):
        what = f"pp*interleave = {pp}*{v}" if v > 1 else f"--pp {pp}"
        raise GhsimError(f"{what} does not divide {model.name}'s {model.num_layers} layers")
    if ep > 1:
        if model.moe is None:
            raise GhsimError(f"--ep {ep} needs a mixture-of-experts model; {model.name} is dense")
        if model.moe.num_experts % ep:
            raise GhsimError(f"--ep {ep} does not divide {model.name}'s {model.moe.num_experts} experts")
        if plan.dp % ep:
            raise GhsimError(f"--ep {ep} must divide the data-parallel size {plan.dp} (experts are spread "
                             "over data-parallel ranks)")
    if v > 1 and plan.grad_accum % pp:
        raise GhsimError(f"interleaved pipelining needs micro-batches per step ({plan.grad_accum}) to be a "
                         f"multiple of --pp {pp}")
    if "params" in plan.offload and plan.dp > 1 and plan.zero < 3:
        raise GhsimError(f"--offload params with {plan.dp} data-parallel ranks needs --zero 3 (ZeRO-Infinity and "
                         "FSDP offload each rank's parameter shard; unsharded replicas are not offloaded)")
    if plan.unified_memory:
        raise GhsimError("--unified-memory is simulated on one GPU only (with several GPUs use --offload)")
    if plan.sequence_parallel and (plan.micro_batch * plan.seq) % tp:
        raise GhsimError(f"sequence parallelism needs tokens per micro-batch divisible by --tp {tp}")


def rank_shard(model: ModelSpec, layout: Layout) -> ModelSpec:
    """The slice of the model one rank computes: heads, kv heads, FFN width and vocabulary
    over tp (Megatron pads the vocabulary to a multiple of tp), experts over ep."""
    tp = layout.tp
    moe = model.moe
    if moe is not None:
        moe = replace(moe, num_experts=max(1, moe.num_experts // layout.ep),
                      expert_intermediate_size=math.ceil(moe.expert_intermediate_size / tp),
                      shared_intermediate_size=math.ceil(moe.shared_intermediate_size / tp))
    return replace(model, num_attention_heads=model.num_attention_heads // tp,
                   num_kv_heads=max(1, model.num_kv_heads // tp),
                   intermediate_size=math.ceil(model.intermediate_size / tp),
                   vocab_size=math.ceil(model.vocab_size / tp), moe=moe)


# --- one micro-batch of one chunk -----------------------------------------------------------

@dataclass(frozen=True)
class Chunk:
    """A pipeline chunk: consecutive layers, with the embedding (first) or the loss (last)."""

    layers: int
    first: bool
    last: bool


@dataclass(frozen=True)
class ChunkParams:
    params: float  # parameters one rank holds for the chunk
    trainable: float
    layer_bytes: float  # one layer's working-precision parameters (what ZeRO-3 gathers)
    layer_trainable: float = 0.0  # trainable parameters of one of its layers
    embedding_trainable: float = 0.0
    head_trainable: float = 0.0  # final norm and LM head
    embedding_params: float = 0.0
    head_params: float = 0.0

    @property
    def layer_share(self) -> float:
        """Share of the chunk's parameters inside its decoder layers."""
        return 1.0 - (self.embedding_params + self.head_params) / self.params if self.params else 0.0


def chunk_params(model: ModelSpec, plan: Plan, layout: Layout, chunk: Chunk,
                 local: ModelSpec | None = None) -> ChunkParams:
    """`local`: rank_shard(model, layout), when the caller has it."""
    local = local or rank_shard(model, layout)
    per_layer = local.layer_params
    counts = param_counts(local, plan)
    trainable_per_layer = counts.trainable / local.num_layers if plan.lora_rank else per_layer
    emb = local.embedding_params if chunk.first else 0.0
    head = local.lm_head_params + local.hidden_size * (2 if local.norm == "layernorm" else 1) if chunk.last else 0.0
    params = chunk.layers * per_layer + emb + head
    emb_t, head_t = (0.0, 0.0) if plan.lora_rank else (emb, head)
    trainable = chunk.layers * trainable_per_layer + emb_t + head_t
    return ChunkParams(params, trainable, per_layer * Dtypes.of(plan).param, trainable_per_layer, emb_t, head_t,
                       emb, head)


def stage_params(model: ModelSpec, plan: Plan, layout: Layout, stage: int,
                 local: ModelSpec | None = None) -> StageParams:
    """The parameters one GPU of pipeline stage `stage` holds, over its chunks (`local`: the
    rank's shard, when the caller has it)."""
    local = local or rank_shard(model, layout)
    params = trainable = outside = 0.0
    for chunk in layout.chunks_of(model.num_layers)[stage::layout.pp]:
        cp = chunk_params(model, plan, layout, chunk, local)
        params, trainable = params + cp.params, trainable + cp.trainable
        outside += cp.embedding_params + cp.head_params
    blocks = pinned_tensor_blocks(optimizer_tensors(model, plan, layout.dp))
    return StageParams(params, trainable, 1.0 - outside / params if params else 0.0, blocks)


@dataclass(frozen=True)
class MicrobatchGraph:
    """One micro-batch of one chunk on one rank, with marks the pipeline needs."""

    graph: OpGraph
    fwd_last: int  # last op of the forward
    bwd_last: int  # last compute-stream op of the backward
    tail_first: int  # first op after the backward (gradient flush, optimizer); len(graph) if none
    saved_bytes: float  # HBM the forward leaves for the backward (activations in flight)


class _RankGraph:
    """OpGraph with 'the next op waits for these' bookkeeping for ops outside templates."""

    def __init__(self) -> None:
        self.g = OpGraph()
        self.pending: tuple[int, ...] = ()

    def add(self, op: Op, then_wait: bool = False) -> int:
        deps = op.deps
        if self.pending:
            deps = tuple(sorted(set(deps + self.pending)))
        elif len(deps) > 1:  # deps as a sorted set, as every op added here has them
            deps = tuple(sorted(set(deps)))
        self.pending = ()
        i = self.g.add(op, deps=deps)  # the graph keeps the deps: the op is not copied
        if then_wait:
            self.pending = (i,)
        return i

    def extend(self, template: list[Op], layer: int = -1) -> tuple[int, int]:
        first, last = self.g.extend(template, layer=layer)
        if self.pending:
            self.g.deps[first] = tuple(sorted(set(self.g.deps[first] + self.pending)))
            self.pending = ()
        return first, last

    def wait_before(self, i: int) -> None:
        self.pending = tuple(sorted(set(self.pending + (i,))))

    @property
    def last(self) -> int:
        return len(self.g) - 1


def _comm(name: str, kind: str, resource: str, nbytes: float, phase: str,
          calls: int = 1, deps: tuple[int, ...] = ()) -> Op:
    """A collective of `calls` calls on the link stream of its group (`resource`)."""
    return Op(name=name, category=Category.COMMUNICATION, kind=K.COLLECTIVE, resource=resource, variant=kind,
              bytes=nbytes, kernels=calls, deps=deps, phase=phase)


def _marker(name: str, phase: str) -> Op:
    """A zero-time op whose place in issue order carries a memory change."""
    return Op(name=name, category=Category.OTHER, kind=K.HOST_WORK, resource=Resource.MEM, kernels=0, phase=phase)


def _grad_bytes(template: list[Op]) -> float:
    return sum(max(0.0, (op.hbm_by_tag or {}).get("grads", 0.0)) for op in template)


def bucket_bytes(plan: Plan, layer_grad_bytes: float) -> float:
    if plan.framework == Framework.TORCH_AMP:
        return DDP_BUCKET_BYTES
    if plan.framework in (Framework.MEGATRON, Framework.MEGATRON_LEGACY):
        # Megatron-LM reduces its contiguous gradient buffer once the backward of the step's last
        # micro-batch is done (--overlap-grad-reduce is off by default): one bucket, not overlapped
        return math.inf
    if plan.framework == Framework.DEEPSPEED:
        if superoffload_whole_sub_groups(plan):
            # DeepSpeed 0.18's SuperOffload reduces a sub-group's gradients only once every one of its
            # parameters has its gradient (superoffload_stage3.py reduce_independent_p_g_buckets_and_remove_grads
            # buffers the others): a bucket is a whole sub-group, its full (unpartitioned) gradients
            return plan.sub_group_size * plan.dp * Dtypes.of(plan).grad
        return plan.reduce_bucket_size * Dtypes.of(plan).grad
    return layer_grad_bytes  # FSDP: one unit per layer


def rank_templates(model: ModelSpec, plan: Plan, layout: Layout) -> LayerTemplates:
    """The op templates of one rank's shard of the model (build once per plan)."""
    return layer_templates(rank_shard(model, layout), plan, layout.split())


def build_microbatch(model: ModelSpec, plan: Plan, layout: Layout, chunk: Chunk, final: bool,
                     templates: LayerTemplates | None = None, widths: Widths | None = None) -> MicrobatchGraph:
    """Forward and backward of one micro-batch of `chunk` on one rank; with `final`, the
    step's last micro-batch: every gradient reduced, then the optimizer and (ZeRO-1/2)
    the all-gather of the updated parameters.

    With offload, graph/offload.py weaves this rank's copies and CPU work into the
    micro-batch (the same schedules as on one GPU): its gradient shards leave after
    their reduction, its optimizer shard runs on its share of the host, its
    activations and (ZeRO-Infinity) parameter shards cross its host link.

    `templates`: rank_templates(), when the caller keeps them for the plan. `widths`:
    what crosses the host link (cost/offload_policy.py), needed when the optimizer is
    offloaded. Nothing here is priced: the simulator prices the graph's ops.
    """
    b = _MicrobatchBuilder(model, plan, layout, chunk, final, templates)
    fwd_last = b.forward()
    bwd_last, tail_first = b.backward()
    return b.finish(widths, fwd_last, bwd_last, tail_first)


class _MicrobatchBuilder:
    """build_microbatch() in parts: the facts every part reads, then the forward, the backward
    and the tail (optimizer, offload, parameter all-gather), appending to one _RankGraph."""

    def __init__(self, model: ModelSpec, plan: Plan, layout: Layout, chunk: Chunk, final: bool,
                 templates: LayerTemplates | None) -> None:
        self.model, self.plan, self.layout, self.chunk, self.final = model, plan, layout, chunk, final
        self.local = local = rank_shard(model, layout)
        self.split = split = layout.split()
        self.dp, self.zero = dp, zero = layout.dp, (plan.zero if layout.dp > 1 else 0)
        self.offload = offload = resolve_offload(plan)
        self.t = t = templates or layer_templates(local, plan, split)
        # autocast caches its bf16 copy of each weight until the forward ends; under ZeRO-3 the
        # weights are gathered per layer and their copies go with the gathered buffer
        self.zero3_cache = t.cache_bytes if (plan.zero >= 3 and layout.dp > 1) else 0.0
        self.cache_bytes = t.cache_bytes - self.zero3_cache
        self.loss_fwd, self.loss_bwd = (t.loss_fwd, t.loss_bwd) if chunk.last else ((), ())
        self.emb_fwd, self.emb_bwd = (t.emb_fwd, t.emb_bwd) if chunk.first else ((), ())
        self.cp = chunk_params(model, plan, layout, chunk)
        self.dt = dt = Dtypes.of(plan)
        # what ZeRO-3 gathers for the embedding and for the final norm and LM head (working precision)
        self.emb_bytes, self.head_bytes = self.cp.embedding_params * dt.param, self.cp.head_params * dt.param
        # FSDP's root unit holds them (the parameters no decoder layer's unit took): gathered when the
        # forward starts and, as the root, not resharded after it (FSDP1 and FSDP2 alike) until its backward ends
        self.root_bytes = (self.emb_bytes + self.head_bytes) if plan.framework == Framework.FSDP_MIXED else 0.0
        if self.root_bytes:
            self.emb_bytes = self.head_bytes = 0.0
        elif model.tie_embeddings and chunk.last and plan.framework == Framework.DEEPSPEED:
            # a tied LM head's weight is the embedding's Parameter: DeepSpeed's pre-forward hook on the head
            # fetches it again (partitioned_param_coordinator.py fetch_sub_module gathers every parameter of
            # the module, shared or not), released after the head's backward as an untied head is
            self.head_bytes += local.embedding_params * dt.param
        # DeepSpeed ZeRO-3 over several ranks: the last layers stay gathered from their forward to their
        # backward, as many as its prefetch window holds beside the LM head (graph/zero3_window.py; the
        # 3B trace on 2 GPUs gathers 28 layers in forward, 22 in backward). On one rank nothing of this
        # costs memory: the gather is a view of the GPU partition (partition_parameters.py
        # all_gather_coalesced -> _no_gather_coalesced), and the builder sees zero 0 there
        self.head_elements = local.vocab_size * local.hidden_size if chunk.last else 0.0
        kept = (layers_kept_for_backward(plan.max_live_parameters, self.head_elements, local.layer_params,
                                         chunk.layers) if self.zero == 3 and plan.framework == Framework.DEEPSPEED
                else 0)
        self.kept = frozenset(range(chunk.layers - kept, chunk.layers))
        self.prefetch_from: int | None = None  # the backward's second-last layer: the embedding is fetched after it
        T, h = plan.micro_batch * plan.seq, model.hidden_size
        self.T = T
        self.tp_bytes = T * h * dt.residual
        reduce_every_microbatch = zero >= 2  # ZeRO-2/3 and FSDP keep only gradient shards
        self.reducing = dp > 1 and (final or reduce_every_microbatch)
        self.layer_grads = _grad_bytes(t.bwd)
        self.bucket = bucket_bytes(plan, self.layer_grads)
        self.whole_sub_groups = superoffload_whole_sub_groups(plan) and dp > 1
        self.grad_kind = ALL_REDUCE if zero == 0 else REDUCE_SCATTER
        # offloaded gradients leave as they are reduced (ZeRO-2/3: every micro-batch; ZeRO-0/1: the last),
        # or with one data-parallel rank as backward makes them; the host accumulates them
        self.streams = offload.streams_gradients
        self.per_microbatch = self.streams and (dp == 1 or zero >= 2)
        self.accumulate = plan.grad_accum > 1 and (not final or self.per_microbatch)  # a non-first micro-batch's
        self.rg = _RankGraph()
        self.sp = sp = split.sequence_parallel
        Tn = T // layout.tp if sp else T
        self.x_bytes = Tn * h * dt.residual  # a chunk's input and output (the residual stream)
        self.g_bytes = Tn * h * (4 if dt.autocast_casts else dt.residual)  # and their gradients
        self.emb_grads, self.loss_grads = _grad_bytes(self.emb_bwd), _grad_bytes(self.loss_bwd)
        self.lazy_shards = zero >= 2 and not persistent_grad_shards(plan, dp)
        self.earlier = final and plan.grad_accum > 1  # memory replay: earlier micro-batches left gradients behind
        self.fresh_grads = not self.earlier or zero >= 2 or self.per_microbatch
        # a later micro-batch's backward adds into the accumulated gradients: it allocates none
        self.acc = accumulating if not self.fresh_grads else (lambda template: template)
        self.gathers: dict[int, int] = {}
        self.gathered: dict[tuple[str, int], int] = {}  # (phase, layer) -> its all-gather, for offloaded shards
        self.sources: list[GradSource] = []  # where gradients are ready to leave for the host, in backward order
        self.last_dp = -1
        self.pending_grads = self.pending_params = 0.0
        self._zero3_ops()

    def _zero3_ops(self) -> None:
        """Every layer's gather and release are alike: built once per phase (the graph keeps their deps)."""
        cp, zero3_cache = self.cp, self.zero3_cache
        self.gather_ops = {phase: _comm("zero3.all_gather", ALL_GATHER, Resource.DP, cp.layer_bytes, phase).with_hbm(
            "gathered_params", cp.layer_bytes) for phase in (Phase.FWD, Phase.BWD)} if self.zero == 3 else {}
        self.release_ops = {phase: _marker("zero3.release", phase).evolve(
            [("gathered_params", -cp.layer_bytes)]
            + ([("weight_copies", -zero3_cache)] if zero3_cache and phase == Phase.FWD else []))
            for phase in (Phase.FWD, Phase.BWD)} if self.zero == 3 else {}
        # a kept layer's forward ends: its gathered weights stay, autocast's copies of them go
        self.keep_op = _marker("zero3.keep", Phase.FWD).evolve(
            [("weight_copies", -zero3_cache)] if zero3_cache else [])

    def tp_collective(self, name: str, kind: str, nbytes: float, phase: str) -> None:
        rg = self.rg
        if self.layout.tp > 1:
            rg.add(_comm(name, kind, Resource.TP, nbytes, phase, deps=(rg.last,) if len(rg.g) else ()), then_wait=True)

    def zero3_gather(self, layer: int, after: int | None, phase: str) -> None:
        deps = (after,) if after is not None and after >= 0 else ()
        self.gathers[layer] = self.gathered[(phase, layer)] = self.rg.g.add(self.gather_ops[phase], deps=deps)

    def zero3_outer(self, what: str, nbytes: float, phase: str, after: int | None = None) -> int | None:
        """ZeRO-3 gathers the embedding's and the LM head's weights as it gathers a layer's: DeepSpeed's
        pre-forward and pre-backward hooks fetch every module's parameters (partitioned_param_coordinator.py
        fetch_sub_module), whatever the op needs. Returns the gather, which the module's ops wait for."""
        if self.zero != 3 or nbytes <= 0:
            return None
        deps = (after,) if after is not None and after >= 0 else ()
        gather = _comm(f"zero3.all_gather.{what}", ALL_GATHER, Resource.DP, nbytes, phase, deps=deps)
        return self.rg.g.add(gather.with_hbm("gathered_params", nbytes))

    def zero3_outer_release(self, nbytes: float, phase: str) -> None:
        if self.zero == 3 and nbytes > 0:
            self.rg.g.add(_marker("zero3.release", phase).with_hbm("gathered_params", -nbytes))

    def forward(self) -> int:
        """The chunk's forward (after the gradients earlier micro-batches left); returns its last op."""
        rg, plan, zero, dp = self.rg, self.plan, self.zero, self.dp
        L = self.chunk.layers
        all_grads = self.layer_grads * L + self.emb_grads + self.loss_grads
        if not self.fresh_grads:  # the full gradients, accumulated
            rg.g.add(_marker("grads.accumulated", FWD).with_hbm("grads", all_grads))
        elif self.earlier and self.lazy_shards and not self.streams:  # the gradient shards, accumulated
            rg.g.add(_marker("grads.accumulated", FWD).with_hbm("grads", all_grads / dp))
        root = self.zero3_outer("root", self.root_bytes, FWD)
        if root is not None:
            rg.wait_before(root)
        if self.emb_fwd:
            data = input_ops(plan)  # the micro-batch's tokens, from the host's data loader
            if data:
                rg.extend(data)
            gather = self.zero3_outer("embedding", self.emb_bytes, FWD)
            if gather is not None:
                rg.wait_before(gather)
            rg.extend(self.emb_fwd)
            # released after its forward: its next use, in backward, is further than DeepSpeed's reuse distance
            self.zero3_outer_release(self.emb_bytes, FWD)
            self.tp_collective("embedding.tp_reduce", REDUCE_SCATTER if self.sp else ALL_REDUCE, self.tp_bytes, FWD)
        else:
            rg.g.add(_marker("input.received", FWD).with_hbm("activations", self.x_bytes))
        layer_ends: list[int] = []
        head_gather = None
        for layer in range(L):
            if zero == 3:
                if layer == 0:
                    self.zero3_gather(0, None, FWD)
                if layer + 1 < L:  # prefetch the next layer once the one before this has finished
                    self.zero3_gather(layer + 1, layer_ends[layer - 1] if layer >= 1 else None, FWD)
                elif self.loss_fwd:  # the LM head after the last layer, prefetched alike
                    head_gather = self.zero3_outer("lm_head", self.head_bytes, FWD,
                                                   layer_ends[layer - 1] if layer >= 1 else None)
                rg.wait_before(self.gathers[layer])
            _, last = rg.extend(self.t.fwd, layer=layer)
            layer_ends.append(last)
            if zero == 3:
                rg.g.add(self.keep_op if layer in self.kept else self.release_ops[FWD])
        cache_bytes = self.cache_bytes
        if self.loss_fwd:
            if self.sp:
                self.tp_collective("lm_head.all_gather", ALL_GATHER, self.tp_bytes, FWD)
            if head_gather is None and zero == 3:  # a chunk without layers
                head_gather = self.zero3_outer("lm_head", self.head_bytes, FWD)
            if head_gather is not None:
                # kept to its backward, which follows within DeepSpeed's max_reuse_distance (1e9 elements,
                # partitioned_param_coordinator.py __params_to_release)
                rg.wait_before(head_gather)
            rg.extend(self.loss_fwd)
            if cache_bytes:  # autocast exits: its cached bf16 weight copies are released
                rg.g.ops[rg.last] = rg.g.ops[rg.last].with_hbm("weight_copies", -cache_bytes * L)
            # vocab-parallel cross entropy: max, sum of exponentials and target logit over tp
            self.tp_collective("cross_entropy.tp_all_reduce", ALL_REDUCE, 3 * self.T * 4, FWD)
        else:
            if cache_bytes:
                rg.g.add(_marker("autocast.release", FWD).with_hbm("weight_copies", -cache_bytes * L))
            rg.g.add(_marker("output.sent", FWD).with_hbm("activations", -self.x_bytes))
        return rg.last

    def reduce_grads(self, nbytes: float, params: float, after: int, phase: str) -> None:
        """A bucket of gradients reduced over data parallelism (the whole bucket, or this rank's shard, kept)."""
        dp, zero = self.dp, self.zero
        calls = max(1, math.ceil(nbytes / self.bucket - 1e-9))
        op = _comm(f"grads.{self.grad_kind}", self.grad_kind, Resource.DP, nbytes, phase, calls=calls, deps=(after,))
        if self.whole_sub_groups:
            op = op.evolve(hbm_transient=self._sub_group_reduce_bytes(nbytes))
        shards = shards_grads(self.plan, zero)  # the full gradients give way to this rank's shard (or leave for the host)
        if shards:
            kept = nbytes / dp if self.lazy_shards and not self.earlier and not self.streams else 0.0
            op = op.with_hbm("grads", -nbytes + kept)
        self.last_dp = self.rg.g.add(op)
        self.sources.append(GradSource(self.last_dp, params, 0.0 if shards else nbytes,
                                       ("bucket", len(self.sources)), -1, 0, self.accumulate, Resource.DP))

    def _sub_group_reduce_bytes(self, nbytes: float) -> float:
        """What DeepSpeed 0.18's SuperOffload allocates reducing a whole sub-group (`nbytes` of full
        gradients, more than reduce_bucket_size): stage3.py reduces it with reduce_scatter_coalesced,
        which copies every gradient into one flat buffer (coalesced_collectives.py, torch.cat), and
        its partition_grads concatenates this rank's partitions and casts them to fp32 while the flat
        copy and the full gradients are still held (superoffload_stage3.py: torch.cat(...).to(fp32))."""
        shard = nbytes / self.dp
        return nbytes + shard + shard * 4 / self.dt.grad

    def _layer_grads_ready(self, layer: int, last: int) -> None:
        """A layer's backward is done: its gradients leave (one rank) or join the bucket being filled."""
        cp = self.cp
        if self.dp == 1:
            self.sources.append(GradSource(last, cp.layer_trainable, self.layer_grads, ("layer", layer), layer, 0,
                                           self.accumulate))
        if self.reducing:
            self.pending_grads += self.layer_grads
            self.pending_params += cp.layer_trainable
            if self.pending_grads >= self.bucket:
                self.reduce_grads(self.pending_grads, self.pending_params, last, BWD)
                self.pending_grads = self.pending_params = 0.0

    def backward(self) -> tuple[int, int]:
        """The chunk's backward, its gradients bucketed and reduced as they are ready; returns the
        last compute-stream op of the backward and the first op after it."""
        rg, plan, cp, zero, dp, acc = self.rg, self.plan, self.cp, self.zero, self.dp, self.acc
        L, loss_bwd = self.chunk.layers, self.loss_bwd
        if not loss_bwd:
            rg.g.add(_marker("grad.received", BWD).with_hbm("activation_grads", self.g_bytes))
        else:
            _, loss_last = rg.extend(acc(loss_bwd))
            self.zero3_outer_release(self.head_bytes, BWD)
            self.tp_collective("lm_head.tp_reduce", REDUCE_SCATTER if self.sp else ALL_REDUCE,
                               self.T * self.model.hidden_size * (4 if self.dt.autocast_casts else self.dt.act), BWD)
        if loss_bwd and dp == 1:
            self.sources.append(GradSource(loss_last, cp.head_trainable, self.loss_grads, ("loss",), -1, 0,
                                           self.accumulate))
        # the LM head's gradients come first in backward and go in the first bucket (DDP and DeepSpeed
        # fill buckets as gradients become ready); FSDP reduces them with its root unit, after the rest
        head_first = plan.framework != Framework.FSDP_MIXED
        if loss_bwd and self.reducing and head_first:
            self.pending_grads, self.pending_params = self.loss_grads, cp.head_trainable
        bwd_ends: list[int] = []
        bwd_ops = acc(self.t.bwd)
        for k, layer in enumerate(reversed(range(L))):
            if zero == 3:  # (a kept layer waits on its forward's gather, long done)
                if k == 0 and layer not in self.kept:
                    self.zero3_gather(layer, None, BWD)
                if layer - 1 >= 0 and layer - 1 not in self.kept:
                    self.zero3_gather(layer - 1, bwd_ends[k - 1] if k >= 1 else None, BWD)
                rg.wait_before(self.gathers[layer])
            _, last = rg.extend(bwd_ops, layer=layer)
            bwd_ends.append(last)
            if layer == 1:
                self.prefetch_from = last
            if zero == 3:
                rg.g.add(self.release_ops[BWD])
            self._layer_grads_ready(layer, last)
        self._embedding_backward()
        if loss_bwd and self.reducing and not head_first:
            self.pending_grads += self.loss_grads
            self.pending_params += cp.head_trainable
        gpu = Resource.GPU
        bwd_last = next(i for i in range(len(rg.g) - 1, -1, -1) if rg.g.ops[i].resource == gpu)
        tail_first = len(rg.g)
        self.zero3_outer_release(self.root_bytes, BWD)
        if self.reducing and self.pending_grads > 0:
            self.reduce_grads(self.pending_grads, self.pending_params, bwd_last, BWD)
        if self.offload.any:  # the end of backward, as an op the rewrite keeps in place
            rg.g.add(_marker("backward.end", BWD))
        return bwd_last, tail_first

    def _embedding_backward(self) -> None:
        rg, cp = self.rg, self.cp
        if self.emb_bwd:
            if self.sp:
                self.tp_collective("embedding.all_gather.bwd", ALL_GATHER, self.tp_bytes, BWD)
            gather = self.zero3_outer("embedding", self.emb_bytes, BWD, self.prefetch_from)
            if gather is not None:
                rg.wait_before(gather)
            rg.extend(self.acc(self.emb_bwd))
            self.zero3_outer_release(self.emb_bytes, BWD)
            if self.dp == 1:
                self.sources.append(GradSource(rg.last, cp.embedding_trainable, self.emb_grads, ("embedding",), -1, 0,
                                               self.accumulate))
            if self.reducing:
                self.pending_grads += self.emb_grads
                self.pending_params += cp.embedding_trainable
        else:
            rg.g.add(_marker("grad.sent", BWD).with_hbm("activation_grads", -self.g_bytes))

    def finish(self, widths: Widths | None, fwd_last: int, bwd_last: int, tail_first: int) -> MicrobatchGraph:
        """The optimizer (final micro-batch), the offload rewrite, ZeRO-1/2's all-gather of the
        updated parameters; the graph with its marks."""
        rg, plan, cp, zero, dp, final = self.rg, self.plan, self.cp, self.zero, self.dp, self.final
        local, L, offload = self.local, self.chunk.layers, self.offload
        opt_last = -1
        # the chunk's share of the model's parameter tensors (the optimizer's per-tensor launches)
        n_tensors = max(1, round(param_counts(local, plan).n_tensors * max(L, 1) / local.num_layers))
        if final and not offload.optimizer:
            shard = dp if zero >= 1 else 1
            counts = ParamCounts(cp.params, cp.trainable / shard, n_tensors)
            opt = _optimizer_ops(local, plan, counts)
            if self.last_dp >= 0:
                rg.wait_before(self.last_dp)
            _, opt_last = rg.extend(opt)
        g = rg.g
        if offload.any:
            dt = self.dt
            facts = StepFacts(trainable=cp.trainable,
                              n_tensors=n_tensors,
                              saved_per_layer=offload_saved_bytes(plan, self.t.saved_per_layer, self.x_bytes),
                              gpu_param_width=dt.param, layer_params=local.layer_params, grad_width=dt.grad,
                              tensor_elements=optimizer_tensors(local, plan, dp),
                              head_params=self.head_elements)
            hooks = RankHooks(tuple(self.sources) if final or self.per_microbatch else (), self.gathered, final,
                              bool(self.loss_bwd))
            g, moved = apply_offload_mapped(g, local, plan, facts, widths, hooks)
            fwd_last, bwd_last, tail_first = moved[fwd_last], moved[bwd_last], moved[tail_first]
        if final and 1 <= zero <= 2:  # updated parameter shards go back to every rank
            after = ([i for i, op in enumerate(g.ops) if op.phase == OPT or op.resource == DP] if offload.optimizer
                     else [opt_last])
            nbytes = cp.params * StateBytes.of(plan).params
            g.add(_comm("params.all_gather", ALL_GATHER, DP, nbytes, OPT,
                        calls=max(1, math.ceil(nbytes / self.bucket - 1e-9)), deps=tuple(after)))
        return MicrobatchGraph(g, fwd_last, bwd_last, tail_first, _saved_bytes(g.ops[:fwd_last + 1]))


def optimizer_tensors(local: ModelSpec, plan: Plan, dp: int) -> tuple[int, ...]:
    """The trainable tensors one rank's optimizer steps (StepFacts.tensor_elements): split over
    tensor parallelism, and over data parallelism under ZeRO."""
    return trainable_tensor_sizes(local, plan, plan.tp * (dp if plan.zero >= 1 else 1))


def _saved_bytes(forward: list[Op]) -> float:
    """HBM the forward leaves allocated, less gradients: each distinct op's change worked out
    once (replicated layers share op objects, compared by identity), summed in issue order."""
    change = {op: op.hbm_alloc - op.hbm_free - (op.hbm_by_tag or {}).get("grads", 0.0) for op in dict.fromkeys(forward)}
    return sum(map(change.__getitem__, forward))
