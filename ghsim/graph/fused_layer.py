"""One decoder layer as Megatron-LM runs it, with fused kernels, forward and backward.

Fused kernels (Framework.MEGATRON: Megatron-LM, NeMo, TransformerEngine): the
same layer as Megatron runs it, with bf16/fp16 working weights (no casts):
one fused LayerNorm/RMSNorm kernel each way, one fused QKV GEMM and one fc1
GEMM (gate and up together under SwiGLU), fused rotary (one kernel per q and
k; none with learned positions), flash attention, fused bias-GeLU/SwiGLU,
fused bias(-dropout)-add for the residuals, and in the loss one fused
vocab-parallel cross-entropy kernel each way. Each fused kernel reads its
inputs once and writes its outputs once; ghsim prices those minimal bytes on
the calibration's measured device copy (one input stream) or add (several)
curve, time = fixed + bytes/rate: that streaming rate is what a well-written
fused elementwise kernel reaches, and no other efficiency enters. Biases
ride in the GEMM epilogue or the fused kernel that follows (not separate
ops); dropout is not modeled (rate 0). What the forward saves for backward
is what Megatron saves (Korthikanti et al. 2022, Sec. 4.1, Table 2: the
norms' inputs, the QKV input, Q/K/V, the attention output, the MLP input,
the fc1 output and the activation output: 32sbh per layer with 16-bit
activations, plus fp32 norm statistics and flash attention's log-sum-exp
instead of the 5as^2b softmax terms; their 34sbh also counts the two
1-byte dropout masks, sbh each).
"""

from __future__ import annotations


from ghsim.graph.dtypes import fused_variant
from ghsim.graph.kernels import FUSED_ROPE_KERNELS, sdpa_backward_kernels
from ghsim.graph.te_fp8 import TeFp8Projections
from ghsim.graph.ops import Category, Kind, Op, Phase, Resource
from ghsim.plan import Precision, Recompute


class FusedLayer(TeFp8Projections):
    """The fused-kernel forward and backward of one layer (Framework.MEGATRON); its fp8
    projections are Transformer Engine's (graph/te_fp8.py)."""

    def fused_op(self, name: str, nbytes: float, inputs: int, category: Category, creates=None, frees=None,
              kernels: int = 1, transient: float = 0.0) -> Op:
        """One fused kernel moving its minimal `nbytes` (inputs read once, outputs written once)."""
        return self.mem(name, fused_variant(inputs, self.dt.act), nbytes, kernels, category,
                        creates=creates, frees=frees, transient=transient)

    def _norm_stats(self, tokens: int) -> float:
        """fp32 statistics a fused norm saves per token: mean and 1/std (LayerNorm), 1/rms (RMSNorm)."""
        return tokens * 4 * (2 if self.m.norm == "layernorm" else 1)

    def _fused_norm_fwd(self, name: str, prefix: str, inp_bytes_per_el: int, tokens: int) -> None:
        """Fused LayerNorm/RMSNorm forward: reads its input, writes the normalised output and stats."""
        h, act = self.m.hidden_size, self.dt.act
        stats = self._norm_stats(tokens)
        self.fused_op(name, tokens * h * (inp_bytes_per_el + act) + stats, 1, Category.NORM_REDUCTION,
                   creates={f"{prefix}.stats": stats, f"{prefix}.out": tokens * h * act})

    def _forward_fused(self, save: bool, phase: Phase) -> dict[str, list[str]]:
        """One layer's forward as Megatron runs it (module docstring, "Fused kernels")."""
        self.save, self.phase = save, phase
        m, dt, T = self.m, self.dt, self.T
        h, q, kv = m.hidden_size, m.q_dim, m.kv_dim
        rs, act, Tn = dt.residual, dt.act, self.Tn
        # fp8: only the projections' fp8 copies of their inputs are kept (LoRA's adapters read the 16-bit one)
        fp8 = self.plan.precision == Precision.FP8 and not self.plan.lora_rank
        kept: dict[str, list[str]] = {}

        self._fused_norm_fwd("input_norm", "n1", rs, Tn)
        gathered = self.tp_gather("n1.all_gather", T * h * act, "n1.g")
        kept["qkv_proj"] = self.projection_fwd(self.qkv_proj, gathered or "n1.out", act, "qkv")
        if gathered:  # not saved: backward gathers it again
            self.ops[-1] = self.t.free(self.ops[-1], [gathered])
        self.release(["n1.stats"])
        if fp8:
            self.ops[-1] = self.t.free(self.ops[-1], ["n1.out"])  # only its fp8 copy is kept
        else:
            self.release(["n1.out"])
        # q, k and v are views of the one QKV output; rotary writes rotated q and k (the
        # QKV buffer stays alive through v until the attention backward)
        if m.position == "rope":
            self.fused_op("rope", 2 * T * (q + kv) * act, 1, Category.ELEMENTWISE, kernels=FUSED_ROPE_KERNELS,
                          creates={"q_rot": T * q * act, "k_rot": T * kv * act})
        self._attention_core_fwd()
        kept["o_proj"] = self.projection_fwd(self.o_proj, "o", act, "attn_out")
        self.release(["qkv", "q_rot", "k_rot", "o", "lse", "probs", "probs.mask", "probs.drop"])
        attn_out = self.tp_reduce("attn_out.tp_reduce", "attn_out", T * h * act)
        self._fused_residual_fwd("attn_residual", attn_out, "h1", "drop1.mask")
        self._fused_norm_fwd("post_attn_norm", "n2", rs, Tn)
        gathered = self.tp_gather("n2.all_gather", T * h * act, "n2.g")
        self.moe_dispatch_fwd()
        kept["fc1"] = self.projection_fwd(self.fc1, gathered or "n2.out", act, "fc1")
        if self.shared_in:
            kept["shared_fc1"] = self.projection_fwd(self.shared_fc1, gathered or "n2.out", act, "s_fc1")
        if gathered:
            self.ops[-1] = self.t.free(self.ops[-1], [gathered])
        self.release(["n2.stats"])
        if fp8:
            self.ops[-1] = self.t.free(self.ops[-1], ["n2.out"])
        else:
            self.release(["n2.out"])
        ff_in = self.mlp_tokens * self.fc1.n_out * act
        ff = self.mlp_tokens * self.down.n_in * act
        # fused bias-GeLU / SwiGLU: fc1's output read once, the activation written once; both saved
        self.fused_op("swiglu" if len(self.mlp_in) == 2 else "gelu", ff_in + ff, 1, Category.ELEMENTWISE,
                      creates={"act": ff})
        kept["down_proj"] = self.projection_fwd(self.down, "act", act, "mlp_out")
        if fp8:  # the activation's backward reads fc1's output; the down projection kept its fp8 input
            self.ops[-1] = self.t.free(self.ops[-1], ["act"])
        self.release(["fc1", "act"])
        self.moe_combine_fwd()
        self._shared_experts_fused_fwd(kept)
        mlp_out = self.tp_reduce("mlp_out.tp_reduce", "mlp_out", T * h * act)
        self._fused_residual_fwd("mlp_residual", mlp_out, "x_next", "drop2.mask")
        self.release(["h1"])
        self.amax_update(4 + (2 if self.shared_in else 0))  # qkv, o, fc1, down (+ the shared experts')
        if not save:
            for names in kept.values():
                self.ops[-1] = self.t.free(self.ops[-1], [n for n in names if n in self.t.live])
        return kept

    def _fused_residual_fwd(self, name: str, branch: str, out: str, mask: str) -> None:
        """Fused bias-dropout-add: the branch output and the residual read once, the sum written
        once (with dropout, also its 1-byte mask, saved for backward)."""
        Tn, h, rs, act = self.Tn, self.m.hidden_size, self.dt.residual, self.dt.act
        drop = self.m.dropout > 0
        creates = {out: Tn * h * rs, **({mask: Tn * h} if drop else {})}
        self.fused_op(name, Tn * h * (act + 2 * rs + (1 if drop else 0)), 2, Category.ELEMENTWISE,
                      creates=creates, frees=[branch])
        self.release([mask])

    def _fused_residual_bwd(self, name: str, mask: str, out: str) -> None:
        """The branch's output gradient. Without dropout the residual's backward passes g to the
        branch as it is (no kernel, a view of g); with dropout one kernel applies the mask."""
        if self.m.dropout <= 0:
            self.t.live[out] = 0.0
            return
        Tn, h, rs, act = self.Tn, self.m.hidden_size, self.dt.residual, self.dt.act
        self.fused_op(name, Tn * h * (rs + 1 + act), 2, Category.ELEMENTWISE, creates={out: Tn * h * act}, frees=[mask])

    def _attention_dims(self) -> tuple[int, int, float]:
        """Batched heads, sequence and the bytes of one s x s score tensor (softmax attention)."""
        m, S = self.m, self.plan.seq
        B = self.plan.micro_batch * m.num_attention_heads
        return B, S, B * S * S * self.dt.act

    def _attention_core_fwd(self, phase: Phase | None = None) -> None:
        """Attention from q, k, v to its output "o". Flash attention: one kernel, keeping the
        log-sum-exp. Softmax attention (megatron-legacy): QK^T as a batched GEMM, Megatron's fused
        scale-mask-softmax, dropout on the probabilities, the batched GEMM with V, and the copy
        of the context into [s, b, h] layout; it keeps the probabilities (and the dropout mask
        and output), Korthikanti et al.'s 5as^2b. Selective recompute keeps none of them."""
        m, dt, T, b, seq = self.m, self.dt, self.T, self.plan.micro_batch, self.plan.seq
        q, act = m.q_dim, dt.act
        selective = self.plan.recompute == Recompute.SELECTIVE
        recompute = phase == Phase.RECOMPUTE
        if self.plan.framework.flash_attention:
            lse = b * m.num_attention_heads * seq * 4
            shape, flops, variant = self.attention_call(backward=False)
            if recompute:
                op = Op(name="flash_attn.recompute", category=Category.ATTENTION, kind=Kind.ATTN_FWD,
                        resource=Resource.GPU, dtype=self.attn_dtype, shape=shape, flops=flops, variant=variant)
                self._emit(op, {"lse": lse}, None, T * q * act, Phase.RECOMPUTE)
                return
            attn = Op(name="flash_attn", category=Category.ATTENTION, kind=Kind.ATTN_FWD, resource=Resource.GPU,
                      dtype=self.attn_dtype, flops=flops, shape=shape, variant=variant)
            self._emit(attn, {"o": T * q * act, **({} if selective else {"lse": lse})}, None, 0.0)
            return
        B, S, s2 = self._attention_dims()
        bmm = "bf16" if dt.gemm == "fp8" else dt.gemm
        name = "attn.recompute" if recompute else "attn"
        first = len(self.ops)
        self.bmm(f"{name}.qk", B, S, S, m.head_dim, bmm, creates={"scores": s2})
        self.fused_op(f"{name}.softmax", 2 * s2, 1, Category.NORM_REDUCTION, creates={"probs": s2}, frees=["scores"])
        if m.dropout > 0:
            n = B * S * S
            self.fused_op(f"{name}.dropout", s2 * 2 + n, 1, Category.ELEMENTWISE,
                          creates={"probs.mask": n, "probs.drop": s2})
        ctx = T * q * act
        if recompute:  # the context is recomputed and dropped: the projection kept its own input
            self.bmm(f"{name}.pv", B, S, m.head_dim, S, bmm, transient=ctx)
            self.fused_op(f"{name}.context_copy", 2 * ctx, 1, Category.ELEMENTWISE, transient=ctx)
            self.ops[first:] = [op.evolve(phase=Phase.RECOMPUTE) for op in self.ops[first:]]
            return
        self.bmm(f"{name}.pv", B, S, m.head_dim, S, bmm, creates={"ctx": ctx})
        self.fused_op(f"{name}.context_copy", 2 * ctx, 1, Category.ELEMENTWISE, creates={"o": ctx}, frees=["ctx"])
        if selective:
            self.ops[-1] = self.t.free(self.ops[-1], [n for n in ("probs", "probs.mask", "probs.drop") if n in self.t.live])

    def _attention_core_bwd(self) -> None:
        """Attention backward from "g_o" to "g_qkv" (the QKV GEMM's output gradient)."""
        m, dt, T, b, seq = self.m, self.dt, self.T, self.plan.micro_batch, self.plan.seq
        q, kv, act = m.q_dim, m.kv_dim, dt.act
        selective = self.plan.recompute == Recompute.SELECTIVE
        rotated = [n for n in ("q_rot", "k_rot") if n in self.t.live]
        if self.plan.framework.flash_attention:
            if selective:
                self._attention_core_fwd(Phase.RECOMPUTE)
            shape, flops, variant = self.attention_call(backward=True)
            # flash attention's backward writes dq, dk, dv into one buffer
            bwd = Op(name="flash_attn.bwd", category=Category.ATTENTION, kind=Kind.ATTN_BWD, resource=Resource.GPU,
                     dtype=self.attn_dtype, kernels=sdpa_backward_kernels(m.num_attention_heads, m.num_kv_heads),
                     flops=flops, shape=shape, variant=variant)
            self._emit(bwd, {"g_qkv": T * (q + 2 * kv) * act}, ["g_o", "o", "lse", "qkv", *rotated], T * q * 4)
            if rotated:  # fused rotary backward, in place on dq and dk
                self.fused_op("rope.bwd", 2 * T * (q + kv) * act, 1, Category.ELEMENTWISE, kernels=FUSED_ROPE_KERNELS)
            return
        B, S, s2 = self._attention_dims()
        bmm = "bf16" if dt.gemm == "fp8" else dt.gemm
        ctx = T * q * act
        self.fused_op("attn.context_copy.bwd", 2 * ctx, 1, Category.ELEMENTWISE, creates={"g_ctx": ctx}, frees=["g_o"])
        if selective:
            self._attention_core_fwd(Phase.RECOMPUTE)
        drop = m.dropout > 0
        # dP = dO V^T and dV = P^T dO, batched over heads
        self.bmm("attn.pv.dgrad", B, S, S, m.head_dim, bmm, creates={"g_probs": s2})
        self.bmm("attn.pv.dv", B, S, m.head_dim, S, bmm, creates={"g_v": T * kv * act},
                  frees=["g_ctx", *(["probs.drop"] if drop else [])])
        g_probs = "g_probs"
        if drop:
            n = B * S * S
            self.fused_op("attn.dropout.bwd", s2 * 2 + n, 2, Category.ELEMENTWISE, creates={"g_probs.d": s2},
                          frees=["g_probs", "probs.mask"])
            g_probs = "g_probs.d"
        self.fused_op("attn.softmax.bwd", 3 * s2, 2, Category.NORM_REDUCTION, creates={"g_scores": s2},
                      frees=[g_probs, "probs"])
        # dQ = dS K and dK = dS^T Q
        self.bmm("attn.qk.dq", B, S, m.head_dim, S, bmm, creates={"g_q": T * q * act})
        self.bmm("attn.qk.dk", B, S, m.head_dim, S, bmm, creates={"g_k": T * kv * act},
                  frees=["g_scores", "o", "qkv", *rotated])
        if rotated:
            self.fused_op("rope.bwd", 2 * T * (q + kv) * act, 1, Category.ELEMENTWISE, kernels=FUSED_ROPE_KERNELS)
        # the split of the QKV output into q, k and v: its backward concatenates their gradients
        self.fused_op("attn.qkv_grad_cat", 2 * T * (q + 2 * kv) * act, 1, Category.ELEMENTWISE,
                      creates={"g_qkv": T * (q + 2 * kv) * act}, frees=["g_q", "g_k", "g_v"])

    def _shared_experts_fused_fwd(self, kept: dict[str, list[str]]) -> None:
        """The shared experts' fused activation and down projection, added to the routed output."""
        if not self.shared_in:
            return
        T, h, act = self.T, self.m.hidden_size, self.dt.act
        ff_in, ff = T * self.shared_fc1.n_out * act, T * self.shared_down.n_in * act
        self.fused_op("shared_swiglu" if len(self.shared_in) == 2 else "shared_gelu", ff_in + ff, 1,
                      Category.ELEMENTWISE, creates={"s_act": ff})
        kept["shared_down"] = self.projection_fwd(self.shared_down, "s_act", act, "s_out")
        self.release(["s_fc1", "s_act"])
        self.fused_op("shared_add", 3 * T * h * act, 2, Category.ELEMENTWISE, frees=["s_out"])

    def _shared_experts_fused_bwd(self, grad: str, kept: dict[str, list[str]]) -> None:
        """The shared experts' backward, down to their input gradient "g_n2.shared"."""
        if not self.shared_in:
            return
        T, act = self.T, self.dt.act
        ff_in, ff = T * self.shared_fc1.n_out * act, T * self.shared_down.n_in * act
        self.projection_bwd(self.shared_down, grad, "g_s_act", kept["shared_down"], free_grad=False)
        self.fused_op("shared_swiglu.bwd" if len(self.shared_in) == 2 else "shared_gelu.bwd", ff + 2 * ff_in, 2,
                      Category.ELEMENTWISE, creates={"g_s_fc1": ff_in},
                      frees=["g_s_act", *[n for n in ("s_fc1", "s_act") if n in self.t.live]])
        self.projection_bwd(self.shared_fc1, "g_s_fc1", "g_n2.shared", kept["shared_fc1"])

    def _backward_fused(self, kept: dict[str, list[str]], phase: Phase) -> None:
        """One layer's backward as Megatron runs it; "g" (16-bit, the residual-stream gradient) is
        live before and after."""
        self.phase = phase
        m, dt, T = self.m, self.dt, self.T
        h, act = m.hidden_size, dt.act
        # MLP branch
        self._fused_residual_bwd("mlp_residual.bwd", "drop2.mask", "g_mlp_out")
        g_mlp_out = self.gathered_grad("g_mlp_out", T * h * act)
        self._shared_experts_fused_bwd(g_mlp_out, kept)
        self.moe_combine_bwd()
        self.projection_bwd(self.down, g_mlp_out, "g_act", kept["down_proj"])
        ff_in = self.mlp_tokens * self.fc1.n_out * act
        ff = self.mlp_tokens * self.down.n_in * act
        # fused bias-GeLU / SwiGLU backward: the activation's gradient and fc1's output read once,
        # fc1's output gradient written once
        self.fused_op("swiglu.bwd" if len(self.mlp_in) == 2 else "gelu.bwd", ff + 2 * ff_in, 2, Category.ELEMENTWISE,
                      creates={"g_fc1": ff_in}, frees=["g_act", *[n for n in ("fc1", "act") if n in self.t.live]])
        regathered = self.tp_gather("n2.all_gather.bwd", T * h * act, "n2.g", for_wgrad=True)
        if m.moe is None:
            self.projection_bwd(self.fc1, "g_fc1", "g_n2", kept["fc1"])
        else:  # the experts' input gradients go back to their tokens, summed over the top-k
            self.projection_bwd(self.fc1, "g_fc1", "g_n2.experts", kept["fc1"])
            self.ep_all_to_all("moe_dispatch.bwd.all_to_all", self.mlp_tokens * h * act)
            self.mem("moe_dispatch.bwd", "copy", (self.mlp_tokens + T) * h * act, 1, Category.OTHER,
                     creates={"g_n2": T * h * act}, frees=["g_n2.experts"])
            self.gemm("router.bwd", T, h, m.moe.num_experts, dt.gemm)
            if self.shared_in:  # the shared experts' input gradient joins the routed ones'
                self.fused_op("shared_grad_add", 3 * T * h * act, 2, Category.ELEMENTWISE, frees=["g_n2.shared"])
        self.ops[-1] = self.t.free(self.ops[-1], [n for n in ["n2.out"] + ([regathered] if regathered else []) if n in self.t.live])
        g_n2 = self.tp_reduce("g_n2.tp_reduce", "g_n2", T * h * act)
        self._fused_norm_bwd("post_attn_norm", "n2", g_n2, "h1")
        # attention branch
        self._fused_residual_bwd("attn_residual.bwd", "drop1.mask", "g_attn_out")
        g_attn_out = self.gathered_grad("g_attn_out", T * h * act)
        self.projection_bwd(self.o_proj, g_attn_out, "g_o", kept["o_proj"])
        self._attention_core_bwd()
        regathered = self.tp_gather("n1.all_gather.bwd", T * h * act, "n1.g", for_wgrad=True)
        self.projection_bwd(self.qkv_proj, "g_qkv", "g_n1", kept["qkv_proj"])
        self.ops[-1] = self.t.free(self.ops[-1], [n for n in ["n1.out"] + ([regathered] if regathered else []) if n in self.t.live])
        g_n1 = self.tp_reduce("g_n1.tp_reduce", "g_n1", T * h * act)
        self._fused_norm_bwd("input_norm", "n1", g_n1, "x")

    def _fused_norm_bwd(self, name: str, prefix: str, grad: str, norm_input: str) -> None:
        """Fused norm backward (one kernel: the output gradient, the saved input and stats read once,
        the input gradient written once; weight and bias gradients from its per-block partial sums),
        then autograd's residual sum: g += the gradient through the norm."""
        T, h, rs, act = self.Tn, self.m.hidden_size, self.dt.residual, self.dt.act
        stats = self._norm_stats(T)
        saved = [n for n in (f"{prefix}.stats", norm_input) if n in self.t.live]
        n_weights = 2 if self.m.norm == "layernorm" else 1
        weight_grad = {} if self.plan.lora_rank else {f"grad.{name}": n_weights * h * self.dt.grad}
        self.fused_op(f"{name}.bwd", T * h * (act + 2 * rs) + stats, 2, Category.NORM_REDUCTION,
                   creates={f"{grad}.x": T * h * rs, **weight_grad}, frees=[grad] + saved)
        self.fused_op(f"{name}.residual_sum", 3 * T * h * rs, 2, Category.ELEMENTWISE,
                   creates={"g.new": T * h * rs}, frees=["g", f"{grad}.x"])
        self.t.live["g"] = self.t.live.pop("g.new")
