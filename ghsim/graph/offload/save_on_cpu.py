"""torch.autograd.graph.save_on_cpu: the sync schedule's activation offload."""

from __future__ import annotations

from ghsim.graph import ops as K
from ghsim.graph.offload.rewrite import BWD, FWD, Rewriter
from ghsim.graph.ops import Op, Phase, Resource
from ghsim.model import ModelSpec
from ghsim.plan import Plan

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
         + SAVE_ON_CPU_TENSORS["gelu" if model.mlp == "gelu" else "swiglu"])
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
    d2h = Op(name="activations.d2h", category=K.COPY, kind=K.D2H, resource=Resource.GPU, bytes=nbytes, kernels=copies,
             phase=Phase.FWD, host_waits=True, host_alloc=nbytes, mem_tag="offloaded_activations")
    h2d = Op(name="activations.h2d", category=K.COPY, kind=K.H2D, resource=Resource.GPU, bytes=nbytes, kernels=copies,
             phase=Phase.BWD, host_free=nbytes, mem_tag="offloaded_activations")
    return [*fwd, d2h.with_hbm("activations", -saved)], [h2d.with_hbm("activations", saved), *bwd]


def _sync_loss_offload(rw: Rewriter, by_mb, model: ModelSpec, plan: Plan, new) -> None:
    """save_on_cpu also packs what the final norm, the LM head and the loss save."""
    nbytes, copies = save_on_cpu_loss(model, plan)
    d2h = Op(name="loss_activations.d2h", category=K.COPY, kind=K.D2H, resource=Resource.GPU, bytes=nbytes, kernels=copies,
             phase=Phase.FWD, host_waits=True, host_alloc=nbytes, mem_tag="offloaded_activations")
    h2d = Op(name="loss_activations.h2d", category=K.COPY, kind=K.H2D, resource=Resource.GPU, bytes=nbytes, kernels=copies,
             phase=Phase.BWD, host_free=nbytes, mem_tag="offloaded_activations")
    for mb, dirs in by_mb.items():
        fwd_loss = [r for r in dirs[FWD] if r.layer < 0]
        bwd_loss = [r for r in dirs[BWD] if r.layer < 0]
        if len(fwd_loss) < 2 or not bwd_loss:
            continue
        sent = rw.insert_after(fwd_loss[-1].last, new(d2h, [fwd_loss[-1].last], -1, mb))
        back = rw.insert_before(bwd_loss[0].first, new(h2d, [sent], -1, mb))
        rw.add_dep(bwd_loss[0].first, back)
