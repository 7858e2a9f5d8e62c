"""A fast analytic estimate of a plan's per-GPU HBM and per-node host memory.

The plan search calls this for every candidate before simulating anything, to
prune plans that cannot fit. What the GPU holds before the step starts (model
state under ZeRO, tensor/pipeline/expert sharding and offload; the frameworks'
buckets) and what offload keeps on the host is read from the simulator's own
account (graph/states.py); on top of it come closed forms (no op graph) for
gradients, activations and the loss, written to track the simulator's replayed
peak (ghsim/sim/memory.py over ghsim/graph/*) and to be a *lower* reading where
they cannot follow it exactly: underestimating only costs a wasted simulation,
overestimating would drop a plan that fits.

The contract the search relies on, tested in tests/test_search_memory.py over
every plan the search enumerates:

    estimate <= simulated peak * (1 + MARGIN)      (HBM and host) for every plan simulate accepts

so "estimate > capacity * (1 + MARGIN)" proves the plan does not fit.

The peak is the largest of a few moments of the step on each kind of pipeline
stage (first, middle, last), as the replay finds them:
- the loss at the end of a forward pass: states, gradients already accumulated
  (from an earlier micro-batch), the saved activations of the micro-batches in
  flight, and (last stage) the fp32 logits, their log-softmax and gradient;
- the optimizer step: states, the gradients left on the GPU and the foreach
  kernels' fp32 temporary.
With full recompute, a layer's backward re-creates its saved set; that is a
third candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

from ghsim.graph.offload import OffloadSetup
from ghsim.graph.offload import resolve as resolve_offload
from ghsim.graph.parallel import Layout, rank_shard, stage_params
from ghsim.graph.states import RankStates, node_gpus, rank_states, shards_grads
from ghsim.graph.step import deepspeed_run_plan, param_counts
from ghsim.graph.dtypes import Dtypes
from ghsim.graph.layer_ops import lora_targeted
from ghsim.hardware import GB, Hardware
from ghsim.model import ModelSpec
from ghsim.plan import Plan, Precision, Recompute

# Stated accuracy: on every single-GPU plan the simulator accepts, the estimate
# lies within 10% of the replayed HBM peak; for other plans it is never above
# the peak by more than this (tests/test_search_memory.py).
MARGIN = 0.10
# frameworks whose buffers the estimate follows; for others it counts weights and optimizer
# states only (a lower reading that stays safe for pruning)
KNOWN_FRAMEWORKS = ("torch-amp", "fsdp-mixed", "deepspeed")


@dataclass(frozen=True, slots=True)  # a search keeps one per plan
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


# what graph/states.py puts on HBM before the step, and the gradients and optimizer temporaries
STATE_PARTS = ("params", "master_params", "optimizer_states", "grad_partition", "grads", "comm_buckets",
               "fp8_weight_cache",
               "optimizer_temp")


def _layer_saved(m: ModelSpec, plan: Plan, dt: Dtypes, T: int, ep: int = 1) -> tuple[float, float]:
    """(activation bytes one layer keeps for its backward, its autocast weight copies; with `ep`
    expert-parallel ranks, of the rank's own experts)."""
    h, q, kv = m.hidden_size, m.q_dim, m.kv_dim
    act, rs = dt.act, dt.residual
    fp8 = plan.precision == Precision.FP8
    casts = dt.autocast_casts and not fp8 and not plan.compile  # compiled: the norms write bf16
    casts_in = dt.autocast_casts
    r = plan.lora_rank
    if m.moe is None:
        f, experts, Tm = m.intermediate_size, 1, T
    else:
        f, experts, Tm = m.moe.expert_intermediate_size, max(1, m.moe.num_experts // ep), T * m.moe.experts_per_token
    n_mlp_in = m.mlp_matrices - 1  # gated (SwiGLU, GeGLU): gate and up
    # (tokens, n_in, n_out, experts, fed by a norm's fp32 output) of every projection
    projs = [(T, h, q, 1, True), (T, h, kv, 1, True), (T, h, kv, 1, True), (T, q, h, 1, False)]
    projs += [(Tm, h, f, experts, True)] * n_mlp_in + [(Tm, f, h, experts, False)]
    names = ["q_proj", "k_proj", "v_proj", "o_proj", *("gate_proj", "up_proj")[:n_mlp_in], "down_proj"]
    # peft (graph/eager_layer.peft_input_casts): each adapter keeps its own 16-bit copy of its input and
    # nothing keeps the shared norm outputs; down's copy replaces the product it would keep
    peft = bool(r) and plan.peft_input_cast and not plan.framework.fused_kernels and act < 4

    torchao = bool(plan.torchao_recipe)  # Megatron's fp8 is Transformer Engine's
    if plan.compile:  # Inductor (graph/compiled_layer.py): no fp32 normalised copies or silu output
        # kept; k and v expanded to the query heads for SDPA; the norms' bf16 outputs (the lower
        # reading: only when every projection keeps its input, and not under fp8)
        kv_sdpa = q if plan.modeling == "hf" else kv  # HF's compiled mask path expands k and v
        saved = 2 * T * 4 + T * (q + 2 * kv_sdpa) * act + T * q * act
        if not (r or fp8):
            saved += 2 * T * h * act
    else:
        saved = 2 * (T * h * 4 + T * 4)  # both norms' fp32 normalised input and rstd
        if not (dt.autocast_casts or fp8 or peft):
            saved += 2 * T * h * rs  # the norms' outputs feed the projections directly
        # rotated q, k; v (torchtitan's repeat_kv: k and v copied to every query head); attention output
        kv_sdpa = q if plan.modeling == "torchtitan" else kv
        saved += T * (q + 2 * kv_sdpa) * act + T * q * act
    if plan.recompute != Recompute.SELECTIVE:
        saved += plan.micro_batch * m.num_attention_heads * plan.seq * 4  # log-sum-exp
    saved += T * h * rs  # the attention residual's output
    # gate/up outputs, activation, product (with experts spread over ranks, the graph keeps one
    # fewer: the lower reading)
    saved += (n_mlp_in + (2 if ep == 1 and not plan.compile else 1)) * Tm * f * act
    copies = 0.0
    for name, (tokens, n_in, n_out, e, from_norm) in zip(names, projs):
        if peft and name != "down_proj" and lora_targeted(plan, name):
            saved += tokens * n_in * act
        if fp8 and plan.framework.fused_kernels:
            # Transformer Engine: one fp8 copy of the input (its transpose, for the weight gradient);
            # the fp8 weights are a cache held all step (graph/states.fp8_weight_cache)
            saved += tokens * n_in
        elif torchao:
            # torchao keeps autocast's bf16 input (eager; compiled: nothing, backward recomputes the fp8 copy)
            saved += tokens * n_in * 2 if casts_in and from_norm and not plan.compile else 0.0
        elif fp8:
            # fp8 input and weight kept for backward (the simulator quantises one expert's weight)
            saved += tokens * n_in + n_in * n_out
        else:
            if casts and from_norm:
                saved += tokens * n_in * 2  # autocast's bf16 copy of the fp32 input
            if dt.autocast_casts and not fp8 and not r:
                copies += n_in * n_out * e * 2  # autocast's cached bf16 weight
        if r:
            saved += tokens * r * act  # LoRA's down-projected input
    return saved, copies



@dataclass(frozen=True)
class GradParts:
    """Bytes of the .grad tensors one GPU's backward creates, by where they arise (before ZeRO)."""

    layers: float  # the stage's decoder layers
    embedding: float
    head: float  # final norm and LM head

    @property
    def total(self) -> float:
        return self.layers + self.embedding + self.head


def _grad_parts(local: ModelSpec, plan: Plan, dt: Dtypes, layers: int, first: bool, last: bool) -> GradParts:
    """Gradients of `layers` decoder layers of the rank's shard `local`, with the embedding
    (`first`) and the final norm and LM head (`last`).

    Projection weight gradients are fp32 under autocast (cast back to the fp32
    parameter) and under fp8 (the wgrad writes fp32); the embedding's is a dense
    fp32 scatter-add; norms and the LM head follow the stored gradient dtype.
    """
    if plan.lora_rank:  # fp32 adapters only
        return GradParts(param_counts(local, plan).trainable / local.num_layers * 4 * layers, 0.0, 0.0)
    fp8 = plan.precision == Precision.FP8
    matrix_bytes = 4 if (dt.autocast_casts or fp8) else dt.grad
    head_bytes = 4 if dt.autocast_casts else dt.grad
    norms = local.norm_params
    per_layer = (local.layer_params - norms) * matrix_bytes + norms * dt.grad
    # the LM head's gradient exists even when tied to the embedding (a separate wgrad)
    head = local.vocab_size * local.hidden_size * head_bytes + local.hidden_size * dt.grad
    return GradParts(per_layer * layers, local.embedding_params * 4 if first else 0.0, head if last else 0.0)


def _held_grads(nbytes: float, plan: Plan, dp: int, setup: OffloadSetup) -> float:
    """Of `nbytes` of gradients backward creates, what the GPU still holds when the optimizer
    steps: ZeRO-2/3 (and DeepSpeed's stage 1) keep a 1/dp shard (none beyond graph/states.py's preallocated partition, or
    when the shards leave for the host); streamed to the host, the share whose optimizer stays
    on the GPU; otherwise all of them."""
    if dp > 1 and shards_grads(plan, plan.zero):
        if setup.streams_gradients or plan.framework.value == "deepspeed":
            return 0.0
        return nbytes / dp
    return nbytes * (1.0 - setup.cpu_share) if setup.streams_gradients else nbytes


@dataclass(frozen=True)
class Activations:
    """One GPU's closed-form activation terms (tensor parallelism applied)."""

    per_layer: float  # kept per layer and micro-batch in flight (its input, and its saved set)
    saved: float  # one layer's saved set (re-created by full recompute)
    copies: float  # one layer's autocast weight copies
    held_copies: float  # every layer's autocast weight copies held until the forward ends
    loss: float  # final norm output, fp32 logits and their log-softmax or gradient, LM-head copy
    offloaded: float  # what one micro-batch's layers leave on the host


def _activations(m: ModelSpec, plan: Plan, dt: Dtypes, layers: float) -> Activations:
    """TP splits a layer's tensors (sequence parallel), PP its layers (`layers` per pipeline chunk:
    autocast's weight copies and offloaded activations are a chunk's forward's)."""
    tp, fp8 = plan.tp, plan.precision == Precision.FP8
    T = plan.micro_batch * plan.seq
    h, V = m.hidden_size, m.vocab_size
    saved, copies = _layer_saved(m, plan, dt, T, plan.ep)
    x = T * h * dt.residual  # each layer's input, kept for its backward
    full = plan.recompute == Recompute.FULL
    offload_acts = "activations" in plan.offload and not full
    per_layer = x + (0.0 if full or offload_acts else saved)
    fn = T * h * (4 + dt.residual) if not (dt.autocast_casts or fp8) else T * h * (4 + 2)
    lm_copy = V * h * 2 if dt.autocast_casts and not plan.lora_rank else 0.0
    # fp32 logits and their log-softmax or gradient: two T x V fp32 tensors at once (the
    # one-GPU replay can hold a third for a moment: the lower reading); compiled, the 16-bit
    # logits and their gradient
    logits = 2 * T * V * dt.act if plan.compile else 8 * T * V
    if plan.compile:
        fn = T * h * dt.act
    loss = (fn + x + logits) / tp + lm_copy / tp
    # save_on_cpu offloads every saved tensor, autocast's weight copies included
    held_copies = 0.0 if offload_acts else copies * layers / tp
    # (one micro-batch's worth: pipelines may prefetch the others back)
    offloaded = (saved + copies) * layers / tp if offload_acts else 0.0
    return Activations(per_layer / tp, saved / tp, copies / tp, held_copies, loss, offloaded)


def _stage_moments(plan: Plan, setup: OffloadSetup, states: RankStates, grads: GradParts, acts: Activations,
                   layers: float, first: bool, last: bool, opt_temp: float) -> list[tuple[str, dict[str, float]]]:
    """The candidate peak moments of one GPU of a pipeline stage, each as HBM by part.

    - the loss at the end of a forward pass: states, gradients already accumulated (from an
      earlier micro-batch), the saved activations of every micro-batch 1F1B keeps in flight
      (`pp` on the first stage), autocast's weight copies and (last stage) the loss;
    - the optimizer step: states, the gradients left and the foreach kernels' temporary;
    - with full recompute, a layer's backward re-creating its saved set.
    """
    dp, k = plan.dp, plan.grad_accum
    static = dict(states.hbm)
    held = _held_grads(grads.total, plan, dp, setup)
    # gradients of the earlier micro-batches: none on the GPU when they stream to the host (the
    # replay counts the GPU's share only as the last micro-batch's backward makes it)
    earlier = held if k > 1 and not setup.streams_gradients else 0.0
    in_flight = min(plan.pp, k) if first else 1
    acts_all = acts.per_layer * layers * in_flight
    forward_end = {**static, "grads": earlier, "activations": acts_all,
                   "weight_copies": acts.held_copies, "logits": acts.loss if last else 0.0}
    optimizer = {**static, "grads": held, "optimizer_temp": opt_temp}
    moments = [("forward end", forward_end), ("optimizer", optimizer)]
    if plan.recompute == Recompute.FULL:
        # one layer's saved set on top. With one micro-batch, gradients grow as layer inputs
        # are freed, so the worst layer is the top one (all inputs, few gradients) or the
        # bottom one (the reverse; the embedding's gradient comes last).
        one_layer = {"weight_copies": acts.copies}
        if k > 1:
            moments.append(("recompute", {**static, **one_layer, "grads": earlier,
                                          "activations": acts_all + acts.saved}))
        else:
            top = _held_grads(grads.head, plan, dp, setup)
            bottom = _held_grads(grads.total - grads.embedding, plan, dp, setup)
            moments += [("recompute", {**static, **one_layer, "grads": top, "activations": acts_all + acts.saved}),
                        ("recompute", {**static, **one_layer, "grads": bottom,
                                       "activations": acts.per_layer + acts.saved})]
    if plan.framework.value not in KNOWN_FRAMEWORKS:
        # fused-kernel frameworks keep other buffers: only what is held from the start is sure
        moments = [("states", static)]
    return moments


@dataclass(frozen=True)
class StageStates:
    """One pipeline stage's share of what does not depend on recompute or the micro-batch."""

    first: bool
    last: bool
    states: RankStates
    grads: GradParts
    opt_temp: float


@dataclass(frozen=True)
class PlanStates:
    """The part of a plan's estimate that recompute, the micro-batch and CUDA graphs leave
    alone (weights, gradients, optimizer states by stage): the search computes it once per
    group of plans and estimates each member on top of it (memory_states, estimate_memory)."""

    dt: Dtypes
    setup: OffloadSetup
    stage_layers: int
    chunk_layers: int
    stages: tuple[StageStates, ...]
    node_gpus: int


def memory_states(model: ModelSpec, hw: Hardware, plan: Plan) -> PlanStates:
    """`plan`'s PlanStates (its recompute, micro-batch and CUDA graphs do not matter)."""
    dt = Dtypes.of(plan)
    layout = Layout.of(plan, hw)
    pp = layout.pp
    local = rank_shard(model, layout)
    chunk_layers = model.num_layers // layout.chunks
    # the optimizer split DeepSpeed ZeRO-3 runs (whole sub-groups), as simulate() prices it
    setup = resolve_offload(deepspeed_run_plan(model, plan)[0])
    on_gpu_optimizer = not setup.optimizer
    shard_opt = plan.dp if plan.zero >= 1 and plan.dp > 1 else 1
    stages = []
    # the first stage (embedding, most micro-batches in flight), the last (the loss) and a
    # middle one stand for all
    for d in sorted({0, pp - 1} | ({1} if pp > 2 else set())):
        first, last = d == 0, d == pp - 1
        stage = stage_params(model, plan, layout, d, local)
        states = rank_states(plan, layout.dp, stage, setup)
        # the replay runs an interleaved stage's chunks one at a time, each with its own gradients
        # and optimizer: those of its largest chunk (the one with the embedding or the loss)
        grads = _grad_parts(local, plan, dt, chunk_layers, first, last)
        # torch's foreach AdamW materialises an fp32 temporary per step (an average chunk's: a lower reading)
        opt_temp = (stage.trainable / layout.interleave * 4 / shard_opt
                    if plan.optimizer_impl == "foreach" and on_gpu_optimizer else 0.0)
        stages.append(StageStates(first, last, states, grads, opt_temp))
    return PlanStates(dt, setup, model.num_layers // pp, chunk_layers, tuple(stages), node_gpus(plan, hw))


def estimate_memory(model: ModelSpec, hw: Hardware, plan: Plan, states: PlanStates | None = None) -> MemoryEstimate:
    """The plan's estimate; `states` (memory_states of a plan differing from it at most in
    recompute, micro-batch and CUDA graphs) saves recomputing what they share."""
    ps = states or memory_states(model, hw, plan)
    acts = _activations(model, plan, ps.dt, ps.chunk_layers)
    moments: list[tuple[str, dict[str, float]]] = []
    floor = host = 0.0
    for st in ps.stages:
        mine = _stage_moments(plan, ps.setup, st.states, st.grads, acts, ps.stage_layers, st.first, st.last,
                              st.opt_temp)
        moments += mine
        floor = max(floor, sum(dict(mine)["optimizer"].values()) if len(mine) > 1 else sum(mine[0][1].values()))
        host = max(host, sum(st.states.host.values()) + acts.offloaded)
    moment, parts = max(moments, key=lambda kv: sum(kv[1].values()))
    if plan.framework.value not in KNOWN_FRAMEWORKS:
        host = 0.0
    return MemoryEstimate(sum(parts.values()), host * ps.node_gpus, {k_: v for k_, v in parts.items() if v},
                          moment, floor)


def may_fit(est: MemoryEstimate, hw: Hardware, plan: Plan) -> bool:
    """False only when the estimate proves the plan cannot fit (see MARGIN).

    With unified memory, allocations may spill from HBM to host memory, so only
    HBM and host together bound it.
    """
    slack = 1.0 + MARGIN
    if plan.unified_memory:
        per_node = node_gpus(plan, hw)
        return est.hbm_bytes * per_node + est.host_bytes <= (
            (hw.hbm.capacity_bytes * per_node + hw.host.capacity_bytes) * slack)
    return est.hbm_bytes <= hw.hbm.capacity_bytes * slack and est.host_bytes <= hw.host.capacity_bytes * slack
