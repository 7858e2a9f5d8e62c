"""A fast analytic estimate of a plan's per-GPU HBM and per-node host memory.

The plan search calls this for every candidate before simulating anything, to
prune plans that cannot fit. It is a closed form (no op graph), written to track
the simulator's replayed peak (ghsim/sim/memory.py over ghsim/graph/*) for the
plans the simulator handles, and to be a *lower* estimate where ghsim cannot yet
check it (multi-GPU sharding, offload): underestimating only costs a wasted
simulation, overestimating would drop a plan that fits.

The contract the search relies on, tested in tests/test_search_memory.py:

    estimate <= simulated peak * (1 + MARGIN)      for every plan simulate accepts

so "estimate > capacity * (1 + MARGIN)" proves the plan does not fit.

The peak is the larger of two moments of the step (what the replay finds):
- the loss at the end of a forward pass: weights, optimizer states, gradients
  already accumulated (from an earlier micro-batch), every layer's saved
  activations, and the fp32 logits, their log-softmax and gradient;
- the optimizer step: weights, states, all gradients and the foreach kernels'
  fp32 temporary.
With full recompute, a layer's backward re-creates its saved set; that is a
third candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

from ghsim.graph.offload import resolve_schedule
from ghsim.graph.step import param_counts
from ghsim.graph.dtypes import Dtypes
from ghsim.hardware import GB, Hardware
from ghsim.model import ModelSpec
from ghsim.plan import Framework, OffloadSchedule, Plan, Precision, Recompute

# Stated accuracy: on every single-GPU plan the simulator accepts, the estimate
# lies within 10% of the replayed HBM peak; for other plans it is never above
# the peak by more than this (tests/test_search_memory.py).
MARGIN = 0.10
# frameworks whose buffers the estimate follows; for others it counts weights and optimizer
# states only (a lower reading that stays safe for pruning)
KNOWN_FRAMEWORKS = ("torch-amp", "fsdp-mixed", "deepspeed")


@dataclass(frozen=True)
class MemoryEstimate:
    hbm_bytes: float  # per GPU, at the peak moment
    host_bytes: float  # per node
    parts: dict[str, float]  # HBM by category at the peak moment
    moment: str  # "forward end" | "optimizer" | "recompute"
    floor_bytes: float = 0.0  # HBM no choice of recompute or micro-batch avoids: the optimizer moment

    @property
    def states_bytes(self) -> float:
        """Everything that does not scale with tokens: weights, gradients, optimizer states."""
        return sum(v for k, v in self.parts.items() if k in STATE_PARTS)

    @property
    def activation_bytes(self) -> float:
        return self.hbm_bytes - self.states_bytes

    def explain_floor(self, capacity: float) -> str:
        """Why no recompute or micro-batch setting can help."""
        return (f"weights, gradients and optimizer states alone need {self.floor_bytes / GB:.0f} GB per GPU "
                f"> {capacity / GB:.0f} GB")

    def explain(self, capacity: float, what: str = "") -> str:
        """E.g. 'ZeRO-2 needs 97 GB per GPU: 78 GB states + 19 GB activations > 96 GB'."""
        head = f"{what} needs" if what else "needs"
        rel = ">" if self.hbm_bytes > capacity else "<="
        return (f"{head} {self.hbm_bytes / GB:.0f} GB per GPU: {self.states_bytes / GB:.0f} GB states + "
                f"{self.activation_bytes / GB:.0f} GB activations {rel} {capacity / GB:.0f} GB")


STATE_PARTS = ("params", "grads", "optimizer_states", "optimizer_temp")


def _layer_saved(m: ModelSpec, plan: Plan, dt: Dtypes, T: int) -> tuple[float, float]:
    """(activation bytes one layer keeps for its backward, its autocast weight copies)."""
    h, q, kv = m.hidden_size, m.q_dim, m.kv_dim
    act, rs = dt.act, dt.residual
    fp8 = plan.precision == Precision.FP8
    casts = dt.autocast_casts and not fp8
    r = plan.lora_rank
    if m.moe is None:
        f, experts, Tm = m.intermediate_size, 1, T
    else:
        f, experts, Tm = m.moe.expert_intermediate_size, m.moe.num_experts, T * m.moe.experts_per_token
    n_mlp_in = 2 if m.mlp == "swiglu" else 1
    # (tokens, n_in, n_out, experts, fed by a norm's fp32 output) of every projection
    projs = [(T, h, q, 1, True), (T, h, kv, 1, True), (T, h, kv, 1, True), (T, q, h, 1, False)]
    projs += [(Tm, h, f, experts, True)] * n_mlp_in + [(Tm, f, h, experts, False)]

    saved = 2 * (T * h * 4 + T * 4)  # both norms' fp32 normalised input and rstd
    if not (dt.autocast_casts or fp8):
        saved += 2 * T * h * rs  # the norms' outputs feed the projections directly
    saved += T * (q + 2 * kv) * act + T * q * act  # rotated q, k; v; attention output
    if plan.recompute != Recompute.SELECTIVE:
        saved += plan.micro_batch * m.num_attention_heads * plan.seq * 4  # log-sum-exp
    saved += T * h * rs  # the attention residual's output
    saved += (n_mlp_in + 2) * Tm * f * act  # gate/up outputs, activation, product
    copies = 0.0
    for tokens, n_in, n_out, e, from_norm in projs:
        if fp8:
            # fp8 input and weight kept for backward (the simulator quantises one expert's weight)
            saved += tokens * n_in + n_in * n_out
        elif casts:
            if from_norm:
                saved += tokens * n_in * 2  # autocast's bf16 copy of the fp32 input
            if not r:
                copies += n_in * n_out * e * 2  # autocast's cached bf16 weight
        if r:
            saved += tokens * r * act  # LoRA's down-projected input
    return saved, copies


def _streams_gradients(plan: Plan) -> bool:
    """Offload schedules that stream gradients out during backward (all but plain PyTorch's
    sync, which copies them after it)."""
    return resolve_schedule(plan) != OffloadSchedule.SYNC


def _grad_bytes(m: ModelSpec, plan: Plan, dt: Dtypes, trainable: float) -> float:
    """Bytes of the .grad tensors of `trainable` parameters, by where they arise.

    Projection weight gradients are fp32 under autocast (cast back to the fp32
    parameter) and under fp8 (the wgrad writes fp32); the embedding's is a dense
    fp32 scatter-add; norms and the LM head follow the stored gradient dtype.
    """
    if plan.lora_rank:
        return trainable * 4  # fp32 adapters
    fp8 = plan.precision == Precision.FP8
    matrix_bytes = 4 if (dt.autocast_casts or fp8) else dt.grad
    head_bytes = 4 if dt.autocast_casts else dt.grad
    layers = trainable - m.embedding_params - m.lm_head_params - m.hidden_size  # what is left: layers
    per_layer_norms = m.norm_params
    n_layers = layers / m.layer_params if m.layer_params else 0
    norms = per_layer_norms * n_layers + m.hidden_size
    matrices = layers - per_layer_norms * n_layers
    # the LM head's gradient exists even when tied to the embedding (a separate wgrad)
    head = m.vocab_size * m.hidden_size
    return matrices * matrix_bytes + norms * dt.grad + head * head_bytes + m.embedding_params * 4


def estimate_memory(model: ModelSpec, hw: Hardware, plan: Plan) -> MemoryEstimate:
    m, dt = model, Dtypes.of(plan)
    fp8 = plan.precision == Precision.FP8
    tp, pp, dp = plan.tp, plan.pp, max(plan.dp, 1)
    # the share of the model's states one GPU holds. One GPU: all of it. Several: tp splits
    # the layers, pp stacks them in stages; where the embedding and LM head sit (a stage,
    # vocabulary-parallel, replicated) is not counted: a lower reading
    layer_share = model.num_layers * model.layer_params / model.total_params
    mp = 1.0 if plan.gpus == 1 else tp * pp / layer_share
    zero_dp = dp if plan.zero else 1
    counts = param_counts(m, plan)
    T = plan.micro_batch * plan.seq
    h, V = m.hidden_size, m.vocab_size
    k = plan.grad_accum

    # --- states, per GPU: model parallelism splits them, ZeRO shards them over data parallel
    shard_params = zero_dp if plan.zero >= 3 else 1
    shard_grads = zero_dp if plan.zero >= 2 else 1
    shard_opt = zero_dp if plan.zero >= 1 else 1
    params = counts.total * dt.param / mp / shard_params
    if plan.lora_rank:
        params += counts.trainable * 4 / mp / shard_params  # fp32 adapters
    if "params" in plan.offload or (plan.framework == Framework.FSDP_MIXED and plan.zero >= 3 and plan.gpus > 1
                                     and not plan.lora_rank and dt.param < 4):
        params = 0.0  # offloaded, or FSDP's bf16 weights that exist only gathered
    grads = _grad_bytes(m, plan, dt, counts.trainable) / mp / shard_grads
    if plan.offload & {"optimizer", "grads", "params"} and _streams_gradients(plan):
        # overlapped offload sends gradients to the host bucket by bucket during backward;
        # only the share whose optimizer stays on the GPU is kept whole
        grads *= 1.0 - plan.offload_ratio
    gpu_opt_share = 1.0 - plan.offload_ratio if "optimizer" in plan.offload else 1.0
    # AdamW's two moments, plus fp32 master weights where the working weights are bf16/fp16
    master = 4 if dt.param < 4 and not plan.lora_rank else 0
    opt_states = counts.trainable * (8 + master) * gpu_opt_share / mp / shard_opt
    # torch's foreach AdamW materialises an fp32 temporary per step (the offloaded
    # schedules' GPU share runs without it)
    opt_temp = (counts.trainable * 4 / mp / shard_opt
                if plan.optimizer_impl == "foreach" and "optimizer" not in plan.offload else 0.0)

    # --- activations, per GPU: TP splits a layer's tensors (sequence parallel), PP its layers,
    # and 1F1B keeps up to `pp` micro-batches in flight on the first stage
    saved, copies = _layer_saved(m, plan, dt, T)
    x = T * h * dt.residual  # each layer's input, kept for its backward
    layers = m.num_layers / pp
    in_flight = min(pp, k)
    full = plan.recompute == Recompute.FULL
    offload_acts = "activations" in plan.offload and not full
    per_layer = x + (0.0 if full or offload_acts else saved)
    acts = per_layer * layers * in_flight / tp
    # save_on_cpu offloads every saved tensor, autocast's weight copies included
    copies_all = 0.0 if offload_acts else copies * layers / tp
    if not (dt.autocast_casts or fp8):
        fn = T * h * (4 + dt.residual)
    else:
        fn = T * h * (4 + 2)
    lm_copy = V * h * 2 if dt.autocast_casts and not plan.lora_rank else 0.0
    # fp32 logits and their log-softmax or gradient: two T x V fp32 tensors at once (the
    # one-GPU replay can hold a third for a moment: the lower reading)
    loss = (fn + x + 8 * T * V) / tp + lm_copy / tp

    static = {"params": params, "optimizer_states": opt_states}
    grads_at_fwd_end = grads if k > 1 else 0.0  # an earlier micro-batch's grads are held
    forward_end = {**static, "grads": grads_at_fwd_end, "activations": acts, "weight_copies": copies_all,
                   "logits": loss}
    optimizer = {**static, "grads": grads, "optimizer_temp": opt_temp}
    moments = [("forward end", forward_end), ("optimizer", optimizer)]
    if pp > 1:
        # 1F1B: the first stage holds `pp` micro-batches in flight but no loss; the last
        # stage holds the loss but one micro-batch in flight
        moments[0] = ("first stage", {**forward_end, "logits": 0.0})
        moments.append(("last stage", {**forward_end, "activations": acts / in_flight}))
    if full:
        # a layer's backward re-runs its forward: one layer's saved set on top. With
        # one micro-batch, gradients grow as layer inputs are freed, so the worst layer
        # is the top one (all inputs, few gradients) or the bottom one (the reverse;
        # the embedding's gradient comes last).
        one_layer = {"activations": saved / tp, "weight_copies": copies / tp}
        if k > 1:
            moments.append(("recompute", {**static, **one_layer, "grads": grads, "activations": acts + saved / tp}))
        else:
            layer_grads = 0.0 if plan.lora_rank else \
                _grad_bytes(m, plan, dt, m.num_layers * m.layer_params) / mp / shard_grads
            emb_grad = 0.0 if plan.lora_rank else m.embedding_params * 4 / mp / shard_grads
            top = {**static, **one_layer, "grads": grads - layer_grads - emb_grad, "activations": acts + saved / tp}
            bottom = {**static, **one_layer, "grads": grads - emb_grad, "activations": per_layer / tp + saved / tp}
            moments += [("recompute", top), ("recompute", bottom)]
    if plan.framework.value not in KNOWN_FRAMEWORKS:
        # fused-kernel frameworks keep other buffers: only weights and optimizer states are sure
        moments = [("states", dict(static))]
    moment, parts = max(moments, key=lambda kv: sum(kv[1].values()))

    # --- host memory per node: what offload put there, for the GPUs of a node
    per_node = min(plan.gpus, plan.gpus_per_node or hw.gpus_per_node or plan.gpus)
    host = 0.0
    if "optimizer" in plan.offload:
        # fp32 master params, grads and both AdamW moments in pinned host memory
        host += counts.trainable * 16 * plan.offload_ratio / mp / shard_opt
    if "params" in plan.offload:
        host += counts.total * dt.param / mp / shard_params
    if offload_acts:  # (one micro-batch's worth: pipelines may prefetch the others back)
        host += (saved + copies) * layers / tp
    if plan.framework.value not in KNOWN_FRAMEWORKS:
        host = 0.0
    return MemoryEstimate(sum(parts.values()), host * per_node, {k_: v for k_, v in parts.items() if v},
                          moment, sum(optimizer.values()))


def may_fit(est: MemoryEstimate, hw: Hardware, plan: Plan) -> bool:
    """False only when the estimate proves the plan cannot fit (see MARGIN).

    With unified memory, allocations may spill from HBM to host memory, so only
    HBM and host together bound it.
    """
    slack = 1.0 + MARGIN
    if plan.unified_memory:
        per_node = min(plan.gpus, plan.gpus_per_node or hw.gpus_per_node or plan.gpus)
        return est.hbm_bytes * per_node + est.host_bytes <= (
            (hw.hbm.capacity_bytes * per_node + hw.host.capacity_bytes) * slack)
    return est.hbm_bytes <= hw.hbm.capacity_bytes * slack and est.host_bytes <= hw.host.capacity_bytes * slack
