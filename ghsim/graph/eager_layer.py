"""One decoder layer as eager PyTorch runs it (Hugging Face style), forward and backward.

It follows what eager PyTorch really runs, kernel group by kernel group, for a
Hugging Face style Llama layer (validation/harness/model.py is the reference):
RMSNorm as its eager composite in fp32, q/k/v/o and gate/up/down projections,
eager rotary embedding, flash attention, SwiGLU, fp32 residual stream, and the
loss over the vocabulary on fp32 logits.

Fused kernels (Framework.MEGATRON) are graph/fused_layer.py.
"""

from __future__ import annotations

from ghsim.graph.dtypes import DOWNCAST, UPCAST, dtyped
from ghsim.graph.kernels import (
    RMSNORM_BWD_KERNELS,
    RMSNORM_FWD_KERNELS,
    HF_ROPE_FP32_BWD_KERNELS,
    ROPE_BWD_KERNELS,
    ROPE_FWD_KERNELS,
    SDPA_BWD_KERNELS,
    SWIGLU_BWD_KERNELS,
    SWIGLU_FWD_KERNELS,
    sdpa_backward_kernels,
)
from ghsim.graph.layer_ops import Projection
from ghsim.graph.ops import Category, Kind, Op, Phase, Resource
from ghsim.graph.torchao_fp8 import TorchaoFp8Projections
from ghsim.plan import Precision, Recompute


_SHARED_OUTS = ("s_gate", "s_up")  # the shared experts' gate and up outputs


class EagerLayer(TorchaoFp8Projections):
    """The eager (unfused) forward and backward of one layer."""

    def _forward_eager(self, save: bool, phase: Phase) -> dict[str, list[str]]:
        """One layer's forward as eager PyTorch runs it (module docstring)."""
        self.save, self.phase = save, phase
        m, dt, T, b, seq = self.m, self.dt, self.T, self.plan.micro_batch, self.plan.seq
        h, q, kv = m.hidden_size, m.q_dim, m.kv_dim
        rs, act = dt.residual, dt.act
        kept: dict[str, list[str]] = {}

        # input RMSNorm (fp32 math): keeps rstd and the normalised tensor (and x, the input)
        Tn = self.Tn
        self._eager_norm_fwd("input_norm", "n1", Tn)
        gathered = self.tp_gather("n1.all_gather", T * h * rs, "n1.g")
        for p, out in zip(self.attn_in, ("q", "k", "v")):
            kept[p.name] = self.projection_fwd(p, gathered or "n1.out", self.norm_out_width, out)
        if gathered:  # not saved: backward gathers it again
            self.ops[-1] = self.t.free(self.ops[-1], [gathered])
        self.release(["n1.normed", "n1.rstd"])
        if self.norm_out_cast or self.plan.precision == Precision.FP8 or not self.input_needed(self.attn_in):
            self.ops[-1] = self.t.free(self.ops[-1], ["n1.out"])  # only its casts are kept, or nothing reads it
        else:
            self.release(["n1.out"])
        self._rope_fwd()
        # flash attention keeps q, k, v, its output and the log-sum-exp
        lse = b * m.num_attention_heads * seq * 4
        shape, flops, variant = self.attention_call(backward=False)
        selective = self.plan.recompute == Recompute.SELECTIVE
        self._kv_for_sdpa()
        attn = Op(name="flash_attn", category=Category.ATTENTION, kind=Kind.ATTN_FWD, resource=Resource.GPU,
                  dtype=self.attn_dtype, flops=flops, shape=shape, variant=variant or self.sdpa_mask)
        self._emit(attn, {"o": T * q * act, **({} if selective else {"lse": lse})}, None, 0.0)
        kept["o_proj"] = self.projection_fwd(self.o_proj, "o", act, "attn_out")
        self.release(["q_rot", "k_rot", "v", "o"] + ([] if selective else ["lse"]))
        attn_out = self.tp_reduce("attn_out.tp_reduce", "attn_out", T * h * act)
        self._residual_add("attn_residual", attn_out, "h1")
        # post-attention RMSNorm and the MLP
        self._eager_norm_fwd("post_attn_norm", "n2", Tn)
        gathered = self.tp_gather("n2.all_gather", T * h * rs, "n2.g")
        self.moe_dispatch_fwd()
        mlp_outs = ("gate", "up")[: len(self.mlp_in)]
        for p, out in zip(self.mlp_in + self.shared_in, mlp_outs + _SHARED_OUTS[: len(self.shared_in)]):
            kept[p.name] = self.projection_fwd(p, gathered or "n2.out", self.norm_out_width, out)
        if gathered:
            self.ops[-1] = self.t.free(self.ops[-1], [gathered])
        self.release(["n2.normed", "n2.rstd", "h1"])
        if self.norm_out_cast or self.plan.precision == Precision.FP8 or not self.input_needed(self.mlp_in):
            self.ops[-1] = self.t.free(self.ops[-1], ["n2.out"])
        else:
            self.release(["n2.out"])
        ff = self.mlp_tokens * self.mlp_in[0].n_out * act
        self._mlp_act_fwd("swiglu" if len(self.mlp_in) == 2 else "gelu", ff, len(self.mlp_in), "act", "prod")
        kept["down_proj"] = self.projection_fwd(self.down, "prod", act, "mlp_out")
        # only down's weight (or adapter) gradient reads it; compiled float8 keeps its fp8 copy instead
        if not self.input_needed([self.down]) or self.plan.compile and self.torchao_recipe:
            self.ops[-1] = self.t.free(self.ops[-1], ["prod"])
        self.release(list(mlp_outs) + ["act"] + (["prod"] if "prod" in self.t.live else []))
        self.moe_combine_fwd()
        self._shared_experts_fwd(kept)
        mlp_out = self.tp_reduce("mlp_out.tp_reduce", "mlp_out", T * h * act)
        self._residual_add("mlp_residual", mlp_out, "x_next")
        if not save:
            for names in kept.values():
                self.ops[-1] = self.t.free(self.ops[-1], [n for n in names if n in self.t.live and not n.endswith(".w16")])
            # autocast's weight cache holds the bf16 copies until the forward ends
        return kept

    def _backward_eager(self, kept: dict[str, list[str]], phase: Phase) -> None:
        """One layer's backward as eager PyTorch runs it; "g" (the residual-stream gradient) is live
        before and after."""
        self.phase = phase
        m, dt, T, b, seq = self.m, self.dt, self.T, self.plan.micro_batch, self.plan.seq
        h, q, kv = m.hidden_size, m.q_dim, m.kv_dim
        act = dt.act
        g = 4 if dt.autocast_casts else dt.residual  # bytes of the residual-stream gradient
        grad_cast = dt.autocast_casts
        Tn = self.Tn
        # MLP branch
        self.mem("mlp_residual.bwd", self.downcast, Tn * h * (g + act), 1 if grad_cast else 0,
                 Category.ELEMENTWISE,
                 creates={"g_mlp_out": Tn * h * act})
        g_mlp_out = self.gathered_grad("g_mlp_out", T * h * act)
        shared_grads = self._shared_experts_bwd(g_mlp_out, kept)
        self.moe_combine_bwd()
        self.projection_bwd(self.down, g_mlp_out, "g_prod", kept["down_proj"])
        ff = self.mlp_tokens * self.mlp_in[0].n_out * act
        grads_in = {f"g_{n}": ff for n in ("gate", "up")[: len(self.mlp_in)]}
        self._mlp_act_bwd("swiglu.bwd", ff, grads_in,
                          ["g_prod", *[n for n in ("gate", "up", "act", "prod") if n in self.t.live]])
        regathered = self.tp_gather("n2.all_gather.bwd", T * h * self.dt.residual, "n2.g", for_wgrad=True)
        if m.moe is not None:
            self.ep_all_to_all("moe_dispatch.bwd.all_to_all", self.mlp_tokens * h * act)
        self._input_grads(self.mlp_in + self.shared_in, list(grads_in) + shared_grads, kept, "g_n2",
                          extra_free=["n2.out"] + ([regathered] if regathered else []))
        if m.moe is not None:
            self.gemm("router.bwd", T, h, m.moe.num_experts, dt.gemm)
        g_n2 = self.tp_reduce("g_n2.tp_reduce", "g_n2", T * h * (4 if dt.autocast_casts else act))
        self._norm_bwd("post_attn_norm", "n2", g_n2, "h1")
        # attention branch
        self.mem("attn_residual.bwd", self.downcast, Tn * h * (g + act), 1 if grad_cast else 0,
                 Category.ELEMENTWISE,
                 creates={"g_attn_out": Tn * h * act})
        g_attn_out = self.gathered_grad("g_attn_out", T * h * act)
        self.projection_bwd(self.o_proj, g_attn_out, "g_o", kept["o_proj"])
        shape, flops, variant = self.attention_call(backward=False)
        if self.plan.recompute == Recompute.SELECTIVE:
            recompute = Op(name="flash_attn.recompute", category=Category.ATTENTION, kind=Kind.ATTN_FWD,
                           resource=Resource.GPU, dtype=self.attn_dtype, flops=flops, shape=shape,
                           variant=variant or self.sdpa_mask)
            self._emit(recompute, {"lse": b * m.num_attention_heads * seq * 4}, None, T * q * act, Phase.RECOMPUTE)
        shape, flops, variant = self.attention_call(backward=True)
        bwd = Op(name="flash_attn.bwd", category=Category.ATTENTION, kind=Kind.ATTN_BWD, resource=Resource.GPU,
                 dtype=self.attn_dtype, kernels=self._sdpa_bwd_kernels(),
                 flops=flops, shape=shape, variant=variant or self.sdpa_mask)
        kvs = self.sdpa_kv_dim
        self._emit(bwd, {"g_q": T * q * act, "g_k": T * kvs * act, "g_v": T * kvs * act},
                   ["g_o", "q_rot", "k_rot", "v", "o", "lse"], T * q * 4)
        self._kv_grads_from_sdpa()
        self._rope_bwd()
        regathered = self.tp_gather("n1.all_gather.bwd", T * h * self.dt.residual, "n1.g", for_wgrad=True)
        self._input_grads(self.attn_in, ["g_qp", "g_kp", "g_v"], kept, "g_n1",
                          extra_free=["n1.out"] + ([regathered] if regathered else []))
        g_n1 = self.tp_reduce("g_n1.tp_reduce", "g_n1", T * h * (4 if dt.autocast_casts else act))
        self._norm_bwd("input_norm", "n1", g_n1, "x")

    @property
    def peft_input_casts(self) -> bool:
        """peft keeps LoRA adapters in fp32 (autocast_adapter_dtype) beside a 16-bit base: each adapter
        casts its input up and autocast casts it back (validation/microbench/issue15/
        h100-microbench15b.json "peft": 2 casts forward, 2 backward, a bf16 copy of x saved per adapter);
        plan.peft_input_cast False: our harness's LoRALinear (validation/harness/model.py), x stays bf16."""
        return not self.fused and bool(self.plan.lora_rank) and self.plan.peft_input_cast and self.dt.act < 4

    # --- the regions torch.compile fuses (graph/compiled_layer.py overrides these) --------------
    @property
    def norm_out_width(self) -> int:
        """Bytes per element of a norm's output: HF's norm writes the residual stream's dtype."""
        return self.dt.residual

    @property
    def norm_out_cast(self) -> bool:
        """Whether autocast casts the norm's output per projection (each copy saved, not the output)."""
        return self.dt.autocast_casts

    @property
    def sdpa_mask(self) -> str:
        """How SDPA is called: is_causal (eager HF passes no mask; GQA through enable_gqa)."""
        return ""

    @property
    def _eager_repeat_kv(self) -> bool:
        """torchtitan's Llama (and models copied from it, e.g. ETH's src/model.py) expands k and v to
        every query head before SDPA (Attention.forward: repeat_kv, an expand and a reshape that copies),
        so SDPA reads and saves the copies; eager Hugging Face hands SDPA k and v as they are."""
        return self.plan.modeling == "torchtitan" and not self.plan.compile and self.m.kv_dim != self.m.q_dim

    @property
    def sdpa_kv_dim(self) -> int:
        """Width of the k and v SDPA reads (and saves): the kv heads', GQA handled inside SDPA
        (torchtitan's eager repeat_kv: every query head's)."""
        return self.m.q_dim if self._eager_repeat_kv else self.m.kv_dim

    def _sdpa_bwd_kernels(self) -> int:
        if self._eager_repeat_kv:  # k and v come expanded: no GQA reduction inside SDPA's backward
            return SDPA_BWD_KERNELS
        return sdpa_backward_kernels(self.m.num_attention_heads, self.m.num_kv_heads)

    def _kv_for_sdpa(self) -> None:
        """k and v as SDPA takes them (eager HF: as they are, GQA handled inside SDPA; torchtitan:
        each copied to every query head, the copies replacing them)."""
        if self._eager_repeat_kv:
            self._replace_kv("repeat_kv", ("k_rot", "v"), self.sdpa_kv_dim)

    def _kv_grads_from_sdpa(self) -> None:
        """torchtitan's repeat_kv backward: SDPA's k and v gradients summed over the heads they were copied to."""
        if self._eager_repeat_kv:
            self._replace_kv("repeat_kv.bwd", ("g_k", "g_v"), self.m.kv_dim)

    def _replace_kv(self, name: str, tensors: tuple[str, str], width: int) -> None:
        """One kernel each that reads k's and v's tensors (`tensors`) and writes them `width` wide in their place."""
        T, act = self.T, self.dt.act
        new = {f"{t}.{name}": T * width * act for t in tensors}
        self.mem(name, DOWNCAST, 2 * T * (self.m.kv_dim + self.sdpa_kv_dim) * act, 2, Category.ELEMENTWISE,
                 creates=new, frees=list(tensors))
        for t in tensors:
            self.t.live[t] = self.t.live.pop(f"{t}.{name}")

    def _residual_add(self, name: str, branch_out: str, out: str) -> None:
        """The residual stream plus a branch's output: one add kernel."""
        h, rs, act, Tn = self.m.hidden_size, self.dt.residual, self.dt.act, self.Tn
        self.mem(name, "add", Tn * h * (2 * rs + act), 1, Category.ELEMENTWISE, creates={out: Tn * h * rs},
                 frees=[branch_out])

    def _mlp_act_fwd(self, name: str, ff: float, inputs: int, act: str, prod: str) -> None:
        """SwiGLU (silu and mul) or GELU; bytes as the microbenchmark counts them: inputs read once,
        the product written once."""
        self.mem(name, "silu_mul", ff * (inputs + 1), SWIGLU_FWD_KERNELS, Category.ELEMENTWISE,
                 creates={act: ff, prod: ff})

    def _mlp_act_bwd(self, name: str, ff: float, grads: dict[str, float], frees: list[str]) -> None:
        self.mem(name, "silu_mul", ff * 5, SWIGLU_BWD_KERNELS, Category.ELEMENTWISE, creates=grads, frees=frees)

    @property
    def _rope_fp32(self) -> bool:
        """Hugging Face's rotary embedding hands cos/sin over in the residual stream's dtype: with
        fp32 parameters under autocast (torch-amp) q*cos promotes to fp32, so the rotation runs in
        fp32 and autocast casts the rotated q and k back to bf16 for SDPA (the HF Llama traces of
        validation/measured_libraries). plan.rope_cast: the tables are cast to q's dtype first
        (validation/harness/model.py), and the rotation stays in bf16."""
        return not self.plan.rope_cast and self.dt.residual == 4 and self.dt.act == 2

    def _rope_fwd(self) -> None:
        """Rotary embedding: rotated copies replace q and k."""
        T, act = self.T, self.dt.act
        n = T * (self.m.q_dim + self.m.kv_dim)
        rotated = {"q_rot": T * self.m.q_dim * act, "k_rot": T * self.m.kv_dim * act}
        if not self._rope_fp32:
            self.mem("rope", "rope", 2 * n * act, 2 * ROPE_FWD_KERNELS + 2, Category.ELEMENTWISE,
                     creates=rotated, frees=["q", "k"], transient=n * act)
            return
        # the measured (bf16) rotary curve at the bytes of a bf16 input and fp32 output
        self.mem("rope", "rope", n * (act + 4), 2 * ROPE_FWD_KERNELS, Category.ELEMENTWISE, transient=2 * n * 4)
        self.mem("rope.cast", DOWNCAST, n * (4 + act), 2, Category.ELEMENTWISE, creates=rotated, frees=["q", "k"],
                 transient=n * 4)

    def _rope_bwd(self) -> None:
        """The rotation's backward: "g_q", "g_k" become "g_qp", "g_kp" (in fp32 with HF's fp32 rotation:
        SDPA's bf16 gradients are cast up, and each product's gradient cast back to q's dtype)."""
        T, act = self.T, self.dt.act
        n = T * (self.m.q_dim + self.m.kv_dim)
        grads = {"g_qp": T * self.m.q_dim * act, "g_kp": T * self.m.kv_dim * act}
        if not self._rope_fp32:
            self.mem("rope.bwd", "rope", 2 * n * act, 2 * ROPE_BWD_KERNELS, Category.ELEMENTWISE,
                     creates=grads, frees=["g_q", "g_k"])
            return
        self.mem("rope.grad_cast", UPCAST, n * (act + 4), 2, Category.ELEMENTWISE, transient=n * 4)
        self.mem("rope.bwd", "rope", n * (4 + act), 2 * HF_ROPE_FP32_BWD_KERNELS, Category.ELEMENTWISE,
                 creates=grads, frees=["g_q", "g_k"], transient=2 * n * 4)

    def _shared_experts_fwd(self, kept: dict[str, list[str]]) -> None:
        """The shared experts' activation and down projection (their gate/up ran beside the routed
        experts'), added to the routed experts' output."""
        if not self.shared_in:
            return
        T, h, act = self.T, self.m.hidden_size, self.dt.act
        outs = list(_SHARED_OUTS[: len(self.shared_in)])
        ff = T * self.shared_down.n_in * act
        self._mlp_act_fwd("shared_swiglu" if len(outs) == 2 else "shared_gelu", ff, len(outs), "s_act", "s_prod")
        kept["shared_down"] = self.projection_fwd(self.shared_down, "s_prod", act, "s_out")
        self.release(outs + ["s_act", "s_prod"])
        self.mem("shared_add", "add", 3 * T * h * act, 1, Category.ELEMENTWISE, frees=["s_out"])

    def _shared_experts_bwd(self, grad: str, kept: dict[str, list[str]]) -> list[str]:
        """The shared experts' down projection and activation backward; returns the gradients of
        their gate/up outputs (their input gradients are summed with the routed experts')."""
        if not self.shared_in:
            return []
        ff = self.T * self.shared_down.n_in * self.dt.act
        self.projection_bwd(self.shared_down, grad, "g_s_prod", kept["shared_down"], free_grad=False)
        grads = {f"g_{n}": ff for n in _SHARED_OUTS[: len(self.shared_in)]}
        self._mlp_act_bwd("shared_swiglu.bwd", ff, grads,
                          ["g_s_prod", *[n for n in (*_SHARED_OUTS, "s_act", "s_prod") if n in self.t.live]])
        return list(grads)

    def _input_grads(self, projs: list[Projection], grads: list[str], kept: dict[str, list[str]],
                     into: str, extra_free: list[str] | None = None) -> None:
        """Backward of projections sharing one input, summing their input gradients into `into`."""
        dt, T, h = self.dt, self.T, self.m.hidden_size
        parts = []
        for i, (p, g) in enumerate(zip(projs, grads)):
            part = f"{into}.{i}"
            self.projection_bwd(p, g, part, kept[p.name])
            if dt.autocast_casts:  # the input cast's backward: bf16 gradient to fp32
                self.mem(f"{p.name}.cast_in.bwd", self.upcast, T * h * 6, 1, Category.ELEMENTWISE,
                         creates={part + ".f32": T * h * 4}, frees=[part])
                part += ".f32"
            parts.append(part)
        width = 4 if dt.autocast_casts else dt.act
        live_extra = [n for n in (extra_free or []) if n in self.t.live]
        self.mem(f"{into}.sum", "add", (len(parts) + 1) * T * h * width, len(parts) - 1, Category.ELEMENTWISE,
                 creates={into: T * h * width}, frees=parts + live_extra)

    def _eager_norm_fwd(self, name: str, prefix: str, tokens: int) -> None:
        """HF's LlamaRMSNorm: six eager kernels in fp32 math, keeping the normalised fp32 tensor and
        1/rms for backward. torch.nn.RMSNorm (plan.fused_norm): one kernel reading the input and
        writing the output and 1/rms, keeping only 1/rms (the input is kept anyway)."""
        h, rs = self.m.hidden_size, self.dt.residual
        if self.plan.fused_norm:
            self.fused_op(name, tokens * h * 2 * rs + tokens * 4, 1, Category.NORM_REDUCTION,
                          creates={f"{prefix}.rstd": tokens * 4, f"{prefix}.out": tokens * h * rs})
            return
        self.mem(name, dtyped("rmsnorm_fwd", rs), tokens * h * 2 * rs, RMSNORM_FWD_KERNELS, Category.NORM_REDUCTION,
                 creates={f"{prefix}.normed": tokens * h * 4, f"{prefix}.rstd": tokens * 4,
                          f"{prefix}.out": tokens * h * rs}, transient=tokens * h * 4)

    def _norm_bwd(self, name: str, prefix: str, grad: str, norm_input: str) -> None:
        """RMSNorm backward, then the residual sum: g += grad through the norm."""
        T, h, rs = self.Tn, self.m.hidden_size, self.dt.residual
        g = 4 if self.dt.autocast_casts else rs
        saved = [n for n in (f"{prefix}.normed", f"{prefix}.rstd", norm_input) if n in self.t.live]
        weight_grad = {} if self.plan.lora_rank else {f"grad.{name}": h * self.dt.grad}
        if self.plan.fused_norm:  # one kernel: gradient, saved input and 1/rms read once, input gradient written
            self.fused_op(f"{name}.bwd", T * h * (g + 2 * rs) + T * 4, 2, Category.NORM_REDUCTION,
                          creates={f"{grad}.x": T * h * g, **weight_grad}, frees=[grad] + saved)
        else:
            self.mem(f"{name}.bwd", dtyped("rmsnorm_bwd", rs), 3 * T * h * rs,
                     RMSNORM_BWD_KERNELS, Category.NORM_REDUCTION,
                     creates={f"{grad}.x": T * h * g, **weight_grad}, frees=[grad] + saved, transient=T * h * 4)
        self.mem(f"{name}.residual_sum", "add", 3 * T * h * g, 1, Category.ELEMENTWISE,
                 creates={"g.new": T * h * g}, frees=["g", f"{grad}.x"])
        self.t.live["g"] = self.t.live.pop("g.new")
