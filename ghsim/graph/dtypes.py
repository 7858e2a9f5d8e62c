"""Byte widths and GEMM dtype a plan implies, and the measured curve an op of a given width runs on.

Precision semantics (DESIGN.md, modeling notes):
- torch-amp (fp32 parameters, autocast): every projection casts its fp32 input
  to bf16 (one cast per projection, each copy saved for backward) and its fp32
  weight to bf16 (cached per forward, held until the layer's backward); each
  weight gradient arrives in bf16 and is cast to fp32.
- fsdp-mixed / deepspeed (bf16 working weights): no per-op casts; the
  residual stream is bf16.
- fp32 / tf32: no casts, everything fp32.
- fp8: the seven projections quantise activation and weight per tensor in
  every forward and the output gradient in backward (dynamic scaling), and
  run the GEMMs at the fp8 rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from ghsim.plan import Framework, Plan, Precision


# The measured curves of autocast's dtype casts. A bf16 -> fp32 cast (a gradient arriving in
# bf16 for an fp32 tensor, logits.float()) runs PyTorch's unrolled direct_copy kernel, about 1.5x
# the time of the vectorized fp32 -> bf16 cast for the same bytes (microbench cast_bf16_to_fp32 vs
# cast_fp32_to_bf16; the HF Llama traces of validation/measured_libraries show the same kernels).
DOWNCAST = "cast_fp32_to_bf16"
UPCAST = "cast_bf16_to_fp32"
INDUCTOR = "inductor:"  # a region torch.compile fuses into one kernel (cost/inductor.py prices it)


def inductor(region: str) -> str:
    """The variant of an Inductor-fused region (its measured curve)."""
    return INDUCTOR + region


def fused_variant(inputs: int, width: int) -> str:
    """The measured curve a fused kernel streams at: the device copy with one input stream,
    the add with several (time = fixed + bytes/rate; bytes = inputs read once + outputs written once)."""
    return dtyped("copy" if inputs <= 1 else "add", width)


@dataclass(frozen=True)
class Dtypes:
    """Byte widths and GEMM dtype a plan implies."""

    gemm: str  # dtype the projections' GEMMs run in (cost model key)
    act: int  # bytes per element of activations feeding GEMMs
    residual: int  # bytes per element of the residual stream (and norm math input)
    param: int  # bytes per stored parameter
    grad: int  # bytes per stored gradient
    autocast_casts: bool  # per-op input and weight casts (torch-amp with fp32 params)

    @staticmethod
    def of(plan: Plan) -> "Dtypes":
        p = plan.precision
        if p in (Precision.FP32, Precision.TF32):
            return Dtypes(p.value, 4, 4, 4, 4, False)
        half = "fp16" if p == Precision.FP16 else "bf16"
        gemm = "fp8" if p == Precision.FP8 else half
        if plan.lora_rank:  # frozen base stored in half precision (fp8 with --fp8-params); adapters fp32
            return Dtypes(gemm, 2, 2, 1 if plan.fp8_params else 2, 4, False)
        if plan.framework == Framework.TORCH_AMP:
            return Dtypes(gemm, 2, 4, 4, 4, True)
        if plan.framework.fused_kernels and p in (Precision.BF16, Precision.FP8):
            # Megatron accumulates (and all-reduces) bf16 gradients in fp32 main_grad buffers
            # (megatron/training/arguments.py: bf16 sets accumulate_allreduce_grads_in_fp32; fp8 runs
            # with bf16 too); --fp8-params: 1-byte working weights (the embedding and LM head, bf16 in
            # Megatron, are counted at 1 byte too: a small undercount)
            return Dtypes(gemm, 2, 2, 1 if plan.fp8_params else 2, 4, False)
        return Dtypes(gemm, 2, 2, 2, 2, False)


def dtyped(op: str, width: int) -> str:
    """The measured curve of `op` in the dtype it runs in (the norm math follows the residual stream)."""
    return f"{op}:{'fp32' if width == 4 else 'bf16'}"
