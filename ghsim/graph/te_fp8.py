"""The projections of a Megatron layer under `--precision fp8`: FP8 as Transformer Engine runs it.

Megatron-LM and NeMo run their linear layers through Transformer Engine (TE), whose FP8 path
differs from a naive per-op quantisation (graph/layer_ops.projection_fwd):

- one fused cast+transpose kernel per operand (TE's `fp8_cast_transpose_fused`): the bf16
  tensor is read once and written as fp8 and, where a later GEMM needs the other layout
  (Hopper's FP8 GEMMs take K-major operands only), as its fp8 transpose in the same pass.
  Inputs fed by a TE LayerNormLinear (QKV, fc1) come out of the fused norm already in fp8
  under delayed scaling; backward transposes that copy for the weight gradient.
- the scale: delayed scaling (TE's DelayedScaling, Megatron's `--fp8-recipe delayed`) takes it
  from an amax history of earlier steps, so the cast is one pass; current (per-tensor) scaling
  (TE's Float8CurrentScaling, Megatron's `--fp8-recipe tensorwise`) first reads the tensor for
  its amax (one more pass, and the norm can no longer emit fp8 itself).
- weights are cast (and transposed, for dgrad) on the first micro-batch of a step only and
  reused by the others (TE's `is_first_microbatch`, which Megatron-core sets per step).
- the GEMMs run at the measured `torch._scaled_mm` rate (cuBLASLt FP8, as TE calls it); the
  weight-gradient GEMM accumulates straight into Megatron's fp32 main_grad. Attention and the
  LM head stay in bf16 (graph/fused_layer.py, graph/step.py).
- LoRA (NeMo's fine-tuning in fp8): the frozen base GEMMs in fp8 with no weight gradient (so
  no transposed input is made or kept), the adapters in bf16 (graph/layer_ops.py).

Every cast is priced as a fused kernel on its minimal bytes at the measured device-copy rate
(graph/dtypes.fused_variant), as the module's other fused kernels are: no constant here is
fitted to a published step.
"""

from __future__ import annotations

from ghsim.graph.dtypes import fused_variant
from ghsim.graph.layer_ops import LayerOps, Projection, lora_targeted
from ghsim.graph.ops import Category
from ghsim.plan import Precision

# the projections whose input a TE LayerNormLinear makes (the norm fused in front of the GEMM)
NORM_FED = ("qkv_proj", "fc1", "shared_fc1")
# TE's delayed scaling keeps this many steps of amax per fp8 tensor: NeMo's Llama pretraining configs
# (github.com/NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/llama/llama2_7b.yaml at
# 064e676: fp8_amax_history_len 1024; MLPerf's Llama-2-70B LoRA runs 32). Its cost is negligible either way.
AMAX_HISTORY = 1024
FP8_TENSORS_PER_PROJECTION = 3  # input, weight, output gradient


def current_scaling(plan) -> bool:
    """Whether the plan's FP8 recipe computes each scale from the tensor itself (Megatron's
    'tensorwise': TE's Float8CurrentScaling) rather than from the amax history ('delayed')."""
    return plan.fp8_recipe == "tensorwise"


class TeFp8Projections(LayerOps):
    """The fp8 projections of Framework.MEGATRON (module docstring); other plans are LayerOps's."""

    @property
    def te_fp8(self) -> bool:
        return self.fused and self.plan.precision == Precision.FP8

    def _te_cast(self, name: str, numel: float, src_width: int, outputs: int, creates: dict[str, float],
                 transient: float = 0.0) -> None:
        """One fused cast(+transpose) of `numel` elements: the source read once (twice with
        current scaling: its amax first), `outputs` fp8 copies written."""
        reads = 2 if current_scaling(self.plan) else 1
        self.mem(name, fused_variant(1, self.dt.act), numel * (reads * src_width + outputs),
                 reads, Category.ELEMENTWISE, creates=creates, transient=transient)

    def projection_fwd(self, p: Projection, inp: str, inp_bytes_per_el: int, out: str) -> list[str]:
        if not self.te_fp8:
            return super().projection_fwd(p, inp, inp_bytes_per_el, out)
        T = self._proj_tokens(p)
        lora = self.plan.lora_rank if self.plan.lora_rank and lora_targeted(self.plan, p.name) else 0
        wgrad = not self.plan.lora_rank  # LoRA: the base weight is frozen, no weight gradient
        n, w = T * p.n_in, p.n_in * p.n_out * p.experts
        x8 = f"{p.name}.x8"  # what backward reads: the fp8 input's transpose (its norm output, for a LayerNormLinear)
        if p.name in NORM_FED and not current_scaling(self.plan):
            # the fused norm wrote the fp8 copy (its bf16 output is the caller's to free)
            creates = {x8: n}
        else:  # cast (+ transpose for the weight gradient): the GEMM reads the one, backward the other
            self._te_cast(f"{p.name}.fp8_cast_x", n, inp_bytes_per_el, 2 if wgrad else 1, {x8: n},
                          transient=n if wgrad else 0.0)
            creates = {}
        # weights: cast and transposed on a step's first micro-batch, cached for the rest: the
        # pass priced here is that one spread over the step's micro-batches (the cache itself is
        # held all step: graph/states.fp8_weight_cache)
        per_microbatch = w / max(self.plan.grad_accum, 1)
        if self.plan.fp8_params:  # fp8 weights already: only their transpose is made
            self.mem(f"{p.name}.fp8_transpose_w", fused_variant(1, 1), 2 * per_microbatch, 1, Category.ELEMENTWISE)
        else:
            self._te_cast(f"{p.name}.fp8_cast_w", per_microbatch, self.dt.param, 2, {})
        out_bytes = T * p.n_out * self.dt.act
        self.gemm(p.name, T, p.n_out, p.n_in, "fp8", creates={out: out_bytes, **creates})
        keep = []
        if wgrad:
            keep.append(x8)
        else:  # a frozen projection needs only its weight for the input gradient
            self.ops[-1] = self.t.free(self.ops[-1], [x8])
        if lora:
            keep += self.lora_fwd(p, lora, T, out_bytes)
        return keep

    def projection_bwd(self, p: Projection, grad_out: str, grad_in: str, kept: list[str],
                       free_grad: bool = True) -> None:
        if not self.te_fp8:
            return super().projection_bwd(p, grad_out, grad_in, kept, free_grad)
        T, act = self._proj_tokens(p), self.dt.act
        lora = self.plan.lora_rank if self.plan.lora_rank and lora_targeted(self.plan, p.name) else 0
        wgrad = not self.plan.lora_rank
        g = T * p.n_out
        # the output gradient: fp8 for dgrad, and transposed for wgrad, in one pass
        self._te_cast(f"{p.name}.fp8_cast_grad", g, act, 2 if wgrad else 1, {f"{p.name}.g8": g * (2 if wgrad else 1)})
        if wgrad and p.name in NORM_FED and not current_scaling(self.plan):
            n = T * p.n_in  # the norm's fp8 output, transposed for the weight gradient
            self.mem(f"{p.name}.fp8_transpose", fused_variant(1, 1), 2 * n, 1, Category.ELEMENTWISE, transient=n)
        self.gemm(f"{p.name}.dgrad", T, p.n_in, p.n_out, "fp8", creates={grad_in: T * p.n_in * act})
        if wgrad:  # into Megatron's fp32 main_grad (gradient-accumulation fusion)
            w = p.n_in * p.n_out * p.experts
            self.gemm(f"{p.name}.wgrad", p.n_out, p.n_in, T, "fp8", creates={f"grad.{p.name}": w * 4})
        self.ops[-1] = self.t.free(self.ops[-1], [f"{p.name}.g8"])
        if lora:
            self.lora_bwd(p, lora, T, T * p.n_in * act)
        self.ops[-1] = self.t.free(self.ops[-1], kept + ([grad_out] if free_grad else []))

    def amax_update(self, projections: int) -> None:
        """Delayed scaling: the amax histories of the layer's fp8 tensors rolled and their scales
        recomputed (TE's fused amax_and_scale_update: each history read and written once)."""
        if not self.te_fp8 or current_scaling(self.plan):
            return
        nbytes = 2 * 4 * AMAX_HISTORY * FP8_TENSORS_PER_PROJECTION * projections
        self.mem("te.amax_and_scale_update", fused_variant(1, 4), nbytes, 1, Category.NORM_REDUCTION)
