"""Op templates of a training step: a layer's forward and backward, the loss, the embedding,
the optimizer and the data loader's batch; parameter counts and the static HBM they imply.

Layers are identical, so one layer's forward and backward are built once as
templates and replicated (graph/parallel.build_microbatch); that is what makes an
80-layer model cheap to build.
"""

from __future__ import annotations

from dataclasses import dataclass

from ghsim.graph import ops as K
from ghsim.graph.ops import Category, Op, Phase, Resource
from ghsim.graph.deepspeed_optimizer import deepspeed_optimizer_ops, zero3_hooks
from ghsim.graph.optimizer import adamw_launches, gpu_adamw
from ghsim.graph.compiled_layer import compiled_cross_entropy_bwd, compiled_cross_entropy_fwd, compiled_final_norm_bwd
from ghsim.graph.dtypes import Dtypes
from ghsim.graph.dtypes import dtyped as _dtyped
from ghsim.graph.kernels import LEARNED_POSITION_FWD_KERNELS, RMSNORM_BWD_KERNELS, RMSNORM_FWD_KERNELS
from ghsim.graph.layer_ops import LayerSplit
from ghsim.graph.transformer import LayerBuilder
from ghsim.model import ModelSpec
from ghsim.graph.offload import deepspeed_sub_group_ratio
from ghsim.graph.offload import resolve as resolve_offload
from ghsim.graph.offload import sync_activation_offload
from ghsim.plan import Framework, OffloadSchedule, Plan, Recompute



@dataclass(frozen=True)
class ParamCounts:
    total: float
    trainable: float
    n_tensors: int  # trainable tensors (optimizer launches, per-tensor copies)


def param_counts(model: ModelSpec, plan: Plan) -> ParamCounts:
    if plan.lora_rank:
        m, r = model, plan.lora_rank
        h, q, kv = m.hidden_size, m.q_dim, m.kv_dim
        f = m.intermediate_size if m.moe is None else m.moe.expert_intermediate_size
        # (n_in + n_out) of each projection an adapter can sit on
        sizes = {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h,
                 "gate_proj": h + f, "up_proj": h + f, "down_proj": f + h}
        if m.mlp_matrices == 2:  # an ungated MLP's one input projection is built as gate_proj
            del sizes["up_proj"]
        targets = [t for t in plan.lora_targets if t in sizes]
        per_layer = r * sum(sizes[t] for t in targets)
        return ParamCounts(model.total_params, m.num_layers * per_layer, m.num_layers * 2 * len(targets))
    per_layer_tensors = 4 + model.mlp_matrices + 2
    if plan.framework.fused_kernels:  # fused QKV and fc1 weights; LayerNorm has weight and bias
        per_layer_tensors = 4 + 2 * (2 if model.norm == "layernorm" else 1)
    return ParamCounts(model.total_params, model.total_params, model.num_layers * per_layer_tensors + 3)


def trainable_tensor_sizes(model: ModelSpec, plan: Plan, split: int = 1) -> tuple[int, ...]:
    """The sizes of the trainable tensors a CPU optimizer steps, as (elements, count) pairs
    flattened (what prices torch's CPU AdamW per tensor size: cost/cpu_optimizer.py); each matrix
    divided over `split` ranks (tensor parallelism, FSDP shards). Biases are left out."""
    m, h = model, model.hidden_size
    L = m.num_layers
    if plan.lora_rank:
        r, f = plan.lora_rank, m.intermediate_size if m.moe is None else m.moe.expert_intermediate_size
        dims = {"q_proj": (h, m.q_dim), "k_proj": (h, m.kv_dim), "v_proj": (h, m.kv_dim), "o_proj": (m.q_dim, h),
                "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}
        pairs = [(r * n, L) for t in plan.lora_targets if t in dims for n in dims[t]]
    else:
        experts = m.moe.num_experts if m.moe is not None else 1
        f = m.moe.expert_intermediate_size if m.moe is not None else m.intermediate_size
        pairs = [(m.vocab_size * h, 1 if m.tie_embeddings else 2), (h, L * m.norms_per_layer + 1),
                 (h * m.q_dim, 2 * L), (h * m.kv_dim, 2 * L), (h * f, L * m.mlp_matrices * experts)]
    return tuple(v for n, c in pairs if n > 0 and c > 0 for v in (max(1, n // split), c))


def partition_sizes(model: ModelSpec, plan: Plan, shard: int) -> list[int]:
    """One rank's share of each trainable tensor, in the model's order (embedding, each layer's
    projections, experts' matrices and norms, the final norm, an untied LM head), each divided over
    `shard` ranks and rounded up as ZeRO-3 partitions a parameter (DeepSpeed's sub-groups follow this
    order: graph/offload/setup.sub_group_count). LoRA adapters by size."""
    m, h = model, model.hidden_size
    if plan.lora_rank:
        pairs = trainable_tensor_sizes(model, plan)
        order = [n for n, c in zip(pairs[::2], pairs[1::2]) for _ in range(c)]
    else:
        experts = m.moe.num_experts if m.moe is not None else 1
        f = m.moe.expert_intermediate_size if m.moe is not None else m.intermediate_size
        layer = [h * m.q_dim, h * m.kv_dim, h * m.kv_dim, m.q_dim * h] + [h * f] * (m.mlp_matrices * experts)
        layer += [h] * m.norms_per_layer
        order = [m.vocab_size * h] + layer * m.num_layers + [h] + ([] if m.tie_embeddings else [m.vocab_size * h])
    return [-(-n // max(1, shard)) for n in order]


def deepspeed_run_plan(model: ModelSpec, plan: Plan) -> tuple[Plan, str | None]:
    """The plan with the offload ratio DeepSpeed ZeRO-3 really runs over this rank's partitions (whole
    sub-groups: graph/offload/setup.deepspeed_sub_group_ratio), and the note saying so; the partitions
    are listed only for plans it applies to."""
    return deepspeed_sub_group_ratio(plan, lambda: partition_sizes(model, plan, plan.tp * max(1, plan.dp)))


def _layer_templates(model: ModelSpec, plan: Plan, split: LayerSplit = LayerSplit()
                     ) -> tuple[list[Op], list[Op], list[Op], float]:
    """Forward ops, backward ops (including any recompute) and the saved bytes of one layer.

    Returns (forward, backward, weight copies held until the forward ends, saved bytes).
    `split` shards the layer over tensor/expert-parallel ranks (graph/parallel.py).
    """
    full = plan.recompute == Recompute.FULL
    b = LayerBuilder(model, plan, split)
    x_bytes = b.Tn * model.hidden_size * b.dt.residual
    b.t.live["x"] = x_bytes
    kept = b.forward(save=not full)
    fwd = zero3_hooks(model, plan, Phase.FWD) + b.ops
    weight_cache = [n for n in b.t.live if n.endswith(".w16")] if full else []
    cache_bytes = sum(b.t.live[n] for n in weight_cache)
    for n in weight_cache:  # autocast's cache frees them when the forward ends (see graph/parallel.build_microbatch)
        del b.t.live[n]
    saved = sum(v for k, v in b.t.live.items() if k not in ("x", "x_next"))
    del b.t.live["x_next"]  # from here on, it is the next layer's "x"
    b.ops = []
    if full:  # the checkpointed forward runs again, keeping what backward needs
        b.ops += zero3_hooks(model, plan, Phase.RECOMPUTE)
        kept = b.forward(save=True, phase=Phase.RECOMPUTE)
        b.ops[-1] = b.t.free(b.ops[-1], ["x_next"])
    b.t.live["g"] = x_bytes if not b.dt.autocast_casts else b.Tn * model.hidden_size * 4
    b.ops += zero3_hooks(model, plan, Phase.BWD)
    b.backward(kept)
    return fwd, b.ops, cache_bytes, saved


def _loss_ops(model: ModelSpec, plan: Plan) -> tuple[list[Op], list[Op]]:
    """Final norm, LM head and cross-entropy over fp32 logits: forward and backward."""
    if plan.framework.fused_kernels:
        return _fused_loss_ops(model, plan)
    b = LayerBuilder(model, plan)
    T, h, V = b.T, model.hidden_size, model.vocab_size
    dt = b.dt
    rs, act = dt.residual, dt.act
    b.t.live["x"] = T * h * rs
    if plan.compile:
        b._eager_norm_fwd("final_norm", "fn", T)  # Inductor's norm (graph/compiled_layer.py)
    else:
        b.mem("final_norm", _dtyped("rmsnorm_fwd", rs), T * h * 2 * rs, RMSNORM_FWD_KERNELS, Category.NORM_REDUCTION,
              creates={"fn.normed": T * h * 4, "fn.rstd": T * 4, "fn.out": T * h * rs}, transient=T * h * 4)
    cast_in = b.norm_out_cast
    if cast_in:
        b.mem("lm_head.cast_in", b.downcast, T * h * 6, 1, Category.ELEMENTWISE, creates={"fn.x16": T * h * 2},
              frees=["fn.out"])
    if dt.autocast_casts and not plan.lora_rank:
        b.mem("lm_head.cast_w", b.downcast, V * h * 6, 1, Category.ELEMENTWISE, creates={"lm.w16": V * h * 2})
    gemm_dt = "bf16" if dt.gemm == "fp8" else dt.gemm  # the LM head stays in bf16 under fp8
    b.gemm("lm_head", T, V, h, gemm_dt, creates={"logits": T * V * act})
    (compiled_cross_entropy_fwd if plan.compile else _eager_cross_entropy_fwd)(b, T, V, act)
    fwd = b.ops
    b.ops = []
    b.phase = Phase.BWD
    (compiled_cross_entropy_bwd if plan.compile else _eager_cross_entropy_bwd)(b, T, V, act)
    g_logits = "g_logits"
    b.gemm("lm_head.dgrad", T, h, V, gemm_dt, creates={"g_fn": T * h * act})
    if plan.lora_rank:
        b.ops[-1] = b.t.free(b.ops[-1], [g_logits])
    elif dt.autocast_casts:
        b.gemm("lm_head.wgrad", V, h, T, gemm_dt, transient=V * h * 2)
        b.mem("lm_head.wgrad_cast", b.upcast, V * h * 6, 1, Category.ELEMENTWISE, creates={"grad.lm": V * h * 4},
              frees=[g_logits, "lm.w16"])
    else:
        b.gemm("lm_head.wgrad", V, h, T, gemm_dt, creates={"grad.lm": V * h * dt.grad}, frees=[g_logits])
    g_bytes = T * h * (4 if dt.autocast_casts else rs)
    if cast_in:
        b.mem("lm_head.cast_in.bwd", b.upcast, T * h * 6, 1, Category.ELEMENTWISE, creates={"g_fn32": T * h * 4},
              frees=["g_fn", "fn.x16"])
        g_fn = "g_fn32"
    else:
        g_fn = "g_fn"
    saved = [n for n in ("fn.normed", "fn.rstd", "fn.out", "x") if n in b.t.live]
    grads = {"g": g_bytes, **({} if plan.lora_rank else {"grad.final_norm": h * dt.grad})}
    if plan.compile:
        compiled_final_norm_bwd(b, grads, [g_fn] + saved)
    else:
        b.mem("final_norm.bwd", _dtyped("rmsnorm_bwd", rs), 3 * T * h * rs, RMSNORM_BWD_KERNELS,
              Category.NORM_REDUCTION, creates=grads, frees=[g_fn] + saved, transient=T * h * 4)
    return fwd, b.ops


def _eager_cross_entropy_fwd(b: LayerBuilder, T: int, V: int, act: int) -> None:
    """logits.float() (when the logits are 16-bit), then F.cross_entropy: "logits" becomes "lsm"."""
    logits = "logits"
    if act != 4:
        b.mem("logits.float", b.upcast, T * V * (act + 4), 1, Category.ELEMENTWISE,
              creates={"logits32": T * V * 4}, frees=["logits"])
        logits = "logits32"
    b.mem("cross_entropy", "cross_entropy_fwd", T * V * 4, 4, Category.NORM_REDUCTION, creates={"lsm": T * V * 4},
          frees=[logits])


def _eager_cross_entropy_bwd(b: LayerBuilder, T: int, V: int, act: int) -> None:
    """The cross entropy's backward and the cast's: "lsm" becomes "g_logits" in the logits' dtype."""
    b.mem("cross_entropy.bwd", "cross_entropy_bwd", T * V * 8, 4, Category.NORM_REDUCTION,
          creates={"g_logits32": T * V * 4}, frees=["lsm"], transient=T * V * 4)
    if act != 4:
        b.mem("logits.float.bwd", b.downcast, T * V * (act + 4), 1, Category.ELEMENTWISE,
              creates={"g_logits": T * V * act}, frees=["g_logits32"])
    else:
        b.t.live["g_logits"] = b.t.live.pop("g_logits32")


def _fused_loss_ops(model: ModelSpec, plan: Plan) -> tuple[list[Op], list[Op]]:
    """The loss as Megatron runs it: fused final norm, the LM head GEMM on 16-bit logits, and
    one fused vocab-parallel cross-entropy kernel each way (transformer.py, "Fused kernels");
    megatron-legacy runs the cross entropy as PyTorch ops on fp32 logits, priced as eager.

    The cross entropy reads the logits once and keeps the fp32 softmax for backward (Megatron
    casts the logits to fp32 and computes the softmax in place); its backward reads the softmax
    once and writes the 16-bit logit gradient. The per-token max, sum and target logit are
    all-reduced over the tensor-parallel ranks (graph/parallel.py)."""
    b = LayerBuilder(model, plan)
    T, h, V = b.T, model.hidden_size, model.vocab_size
    dt = b.dt
    rs, act = dt.residual, dt.act
    b.t.live["x"] = T * h * rs
    b._fused_norm_fwd("final_norm", "fn", rs, T)
    gemm_dt = "bf16" if dt.gemm == "fp8" else dt.gemm  # the LM head stays in bf16 under fp8
    b.gemm("lm_head", T, V, h, gemm_dt, creates={"logits": T * V * act})
    fused_ce = plan.framework.fused_cross_entropy
    if fused_ce:
        b.fused_op("cross_entropy", T * V * (act + 4), 1, Category.NORM_REDUCTION, creates={"lsm": T * V * 4},
                   frees=["logits"])
    else:  # megatron-legacy: logits.float(), then the cross entropy in PyTorch ops (the eager curves)
        _eager_cross_entropy_fwd(b, T, V, act)
    fwd = b.ops
    b.ops = []
    b.phase = Phase.BWD
    if fused_ce:
        b.fused_op("cross_entropy.bwd", T * V * (4 + act), 1, Category.NORM_REDUCTION, creates={"g_logits": T * V * act},
                   frees=["lsm"])
    else:
        _eager_cross_entropy_bwd(b, T, V, act)
    b.gemm("lm_head.dgrad", T, h, V, gemm_dt, creates={"g_fn": T * h * act})
    if plan.lora_rank:
        b.ops[-1] = b.t.free(b.ops[-1], ["g_logits"])
    else:
        b.gemm("lm_head.wgrad", V, h, T, gemm_dt, creates={"grad.lm": V * h * dt.grad}, frees=["g_logits"])
    stats = b._norm_stats(T)
    n_weights = 2 if model.norm == "layernorm" else 1
    b.fused_op("final_norm.bwd", T * h * (act + 2 * rs) + stats, 2, Category.NORM_REDUCTION,
               creates={"g": T * h * rs, **({} if plan.lora_rank else {"grad.final_norm": n_weights * h * dt.grad})},
               frees=["g_fn", "fn.stats", "fn.out", "x"])
    return fwd, b.ops


def _embedding_fwd(model: ModelSpec, plan: Plan) -> Op:
    T, h, rs = plan.micro_batch * plan.seq, model.hidden_size, Dtypes.of(plan).residual
    if plan.framework.fused_kernels and model.position == "learned":
        # Megatron's Embedding: word lookup, position lookup, then their sum (three kernels)
        op = Op(name="embedding", category=Category.ELEMENTWISE, kind=K.MEMBOUND, resource=Resource.GPU, variant="copy",
                bytes=(2 + 2 + 3) * T * h * rs, kernels=LEARNED_POSITION_FWD_KERNELS, phase=Phase.FWD)
        return op.with_hbm("activations", T * h * rs)
    op = Op(name="embedding", category=Category.ELEMENTWISE, kind=K.MEMBOUND, resource=Resource.GPU, variant="copy",
            bytes=2 * T * h * rs, kernels=1, phase=Phase.FWD)
    return op.with_hbm("activations", T * h * rs)


def _embedding_bwd(model: ModelSpec, plan: Plan) -> list[Op]:
    """Dense embedding backward: zero a vocab x hidden fp32 gradient and scatter-add into it."""
    T, h, V = plan.micro_batch * plan.seq, model.hidden_size, model.vocab_size
    dt = Dtypes.of(plan)
    g = T * h * (4 if dt.autocast_casts else dt.residual)
    if plan.lora_rank:  # frozen embedding: the gradient just dies
        op = Op(name="embedding.grad_free", category=Category.OTHER, kind=K.MEMBOUND, resource=Resource.GPU, variant="copy",
                kernels=0, phase=Phase.BWD)
        return [op.with_hbm("activation_grads", -g)]
    if plan.framework.fused_kernels:
        # Megatron: the embedding gradient in the working gradient dtype (its main_grad buffer);
        # learned positions add the same zero-and-scatter for the position table
        width = dt.grad
        learned = model.position == "learned"
        op = Op(name="embedding.bwd", category=Category.ELEMENTWISE, kind=K.MEMBOUND, resource=Resource.GPU, variant="copy",
                bytes=V * h * width + 2 * g + (plan.seq * h * width + 2 * g if learned else 0.0),
                kernels=8 if learned else 4, phase=Phase.BWD)
        return [op.with_hbm("grads", V * h * width).with_hbm("activation_grads", -g)]
    op = Op(name="embedding.bwd", category=Category.ELEMENTWISE, kind=K.MEMBOUND, resource=Resource.GPU, variant="copy",
            bytes=V * h * 4 + 2 * g, kernels=4, phase=Phase.BWD)
    return [op.with_hbm("grads", V * h * 4).with_hbm("activation_grads", -g)]


def _optimizer_ops(model: ModelSpec, plan: Plan, counts: ParamCounts) -> list[Op]:
    """AdamW on the GPU (offloaded optimizers: graph/offload.py)."""
    if plan.framework.fused_kernels:
        return _fused_optimizer_ops(model, plan, counts)
    dt = Dtypes.of(plan)
    if plan.framework == Framework.DEEPSPEED and plan.zero >= 1 and dt.param < 4 and not plan.lora_rank:
        return deepspeed_optimizer_ops(counts.trainable, counts.n_tensors, plan.zero, dt.grad, plan.grad_clip,
                                       plan.sub_group_size)
    return [gpu_adamw(f"adamw.{plan.optimizer_impl}", counts.trainable, counts.n_tensors, plan.optimizer_impl)]


def _fused_optimizer_ops(model: ModelSpec, plan: Plan, counts: ParamCounts) -> list[Op]:
    """Megatron's optimizer step: the gradient norm for clipping (multi_tensor_l2norm reads every
    gradient once), fused Adam on the fp32 masters (the measured fused AdamW curve, whatever
    plan.optimizer_impl says), and, with 16-bit working weights, the updated masters copied
    into them (multi_tensor_scale: fp32 read once, 16-bit written once). The two extra passes
    stream at the measured device-copy rate; each is one multi-tensor call, chunked into
    launches as the AdamW call is."""
    P, n = counts.trainable, counts.n_tensors
    dt = Dtypes.of(plan)
    launches = adamw_launches(n, P, "fused")
    ops = [Op(name="optimizer.grad_norm", category=Category.OPTIMIZER, kind=K.MEMBOUND, resource=Resource.GPU,
              variant=_dtyped("copy", dt.grad), bytes=P * dt.grad, kernels=launches, phase=Phase.OPT),
           gpu_adamw("adamw.fused", P, n, "fused")]
    if dt.param < 4 and not plan.lora_rank:
        ops.append(Op(name="optimizer.copy_to_working", category=Category.OPTIMIZER, kind=K.MEMBOUND, resource=Resource.GPU,
                      variant=_dtyped("copy", 4), bytes=P * (4 + dt.param), kernels=launches, phase=Phase.OPT))
    return ops


@dataclass(frozen=True)
class LayerTemplates:
    """The op templates of a plan's rank shard: a layer's forward and backward (with torch's
    save_on_cpu when the plan asks for it), the loss and the embedding, the same for every
    layer, micro-batch and chunk; and the layer's autocast weight-copy bytes and saved bytes."""

    fwd: tuple[Op, ...]
    bwd: tuple[Op, ...]
    loss_fwd: tuple[Op, ...]
    loss_bwd: tuple[Op, ...]
    emb_fwd: tuple[Op, ...]
    emb_bwd: tuple[Op, ...]
    cache_bytes: float  # autocast's bf16 weight copies one layer holds until the forward ends
    saved_per_layer: float  # activation bytes one layer's forward leaves for its backward


def layer_templates(model: ModelSpec, plan: Plan, split: LayerSplit = LayerSplit()) -> LayerTemplates:
    """The plan's op templates (graph/parallel.build_microbatch replicates them), unpriced."""
    offload = resolve_offload(plan)
    fwd, bwd, cache_bytes, saved_per_layer = _layer_templates(model, plan, split)
    if offload.activations and plan.recompute != Recompute.FULL and offload.schedule == OffloadSchedule.SYNC:
        fwd, bwd = sync_activation_offload(fwd, bwd, model, plan, saved_per_layer)  # torch's save_on_cpu
    loss_fwd, loss_bwd = _loss_ops(model, plan)
    return LayerTemplates(tuple(fwd), tuple(bwd), tuple(loss_fwd), tuple(loss_bwd), (_embedding_fwd(model, plan),),
                          tuple(_embedding_bwd(model, plan)), cache_bytes, saved_per_layer)


def input_ops(plan: Plan) -> list[Op]:
    """Preparing a micro-batch on the host and copying its token ids to the GPU.

    With 0 workers the training process prepares each batch itself, so the
    host (and then the GPU) waits for it. With N workers the pool prefetches
    while the step runs: the micro-batch finds its batch ready, and the pool's
    rate (a batch every prep/N seconds) paces the step's micro-batches in the
    pipeline schedule (graph/pipeline.py). No ops when the plan has no
    host-side preparation cost (synthetic batches already on the GPU).
    """
    if plan.batch_prep_s <= 0:
        return []
    token_bytes = 2 * plan.micro_batch * plan.seq * 8  # input ids and labels, int64
    in_process = plan.dataloader_workers == 0
    prep = Op(name="dataloader.batch", category=K.CPU, kind=K.HOST_WORK, resource=Resource.CPU if in_process else Resource.LOADER,
              seconds=loader_seconds(plan) if in_process else 0.0, host_waits=in_process, kernels=0, phase=Phase.DATA)
    h2d = Op(name="batch.h2d", category=K.COPY, kind=K.H2D, resource=Resource.GPU, bytes=token_bytes, deps=(0,),
             kernels=0, phase=Phase.DATA)
    return [prep, h2d]


def loader_seconds(plan: Plan) -> float:
    """Seconds between two batches of the data loader (its preparation time over its workers)."""
    return plan.batch_prep_s / max(1, plan.dataloader_workers)


def accumulating(template: list[Op]) -> list[Op]:
    """The template as a micro-batch after the first runs it: gradients add into the existing
    .grad, so no op allocates gradient memory (the changed ops are copies; the template keeps its own)."""
    out = []
    for op in template:
        grads = (op.hbm_by_tag or {}).get("grads", 0.0)
        out.append(op.with_hbm("grads", -grads) if grads > 0 else op)
    return out
