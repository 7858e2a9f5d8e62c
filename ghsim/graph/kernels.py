"""Kernels per eager composite and how a profiler files them: the launch counts set the
host's launch cost, the category splits the predicted breakdown."""

from __future__ import annotations

from ghsim.graph.ops import Category

# Kernels per eager composite, counted from the PyTorch ops they run
# (validation/harness/model.py): they set the host's launch cost.
RMSNORM_FWD_KERNELS = 6  # pow, mean, add eps, rsqrt, mul, mul weight
RMSNORM_BWD_KERNELS = 10  # mul/sum for the weight, rsqrt/mean/pow backward, accumulation
# cuDNN SDPA backward (PyTorch's default on Hopper) launches compute_dot_do_o, the
# bprop kernel and convert_dq_to_16bits, plus fmha_reduce_head for dK and dV under GQA
# (kernel names in PyTorch 2.11 profiler traces of validation/cases).
SDPA_BWD_KERNELS = 3
SDPA_BWD_GQA_REDUCE_KERNELS = 2


def sdpa_backward_kernels(heads: int, kv_heads: int) -> int:
    return SDPA_BWD_KERNELS + (SDPA_BWD_GQA_REDUCE_KERNELS if kv_heads != heads else 0)


# How a profiler files those kernels (ghsim.traces.categories): the reductions (mean;
# the two sums of the backward; amax) as norm_reduction, the rest as elementwise.
# Time is split in proportion to kernel counts.
RMSNORM_FWD_SPLIT = ((Category.ELEMENTWISE, 5 / 6), (Category.NORM_REDUCTION, 1 / 6))
RMSNORM_BWD_SPLIT = ((Category.ELEMENTWISE, 8 / 10), (Category.NORM_REDUCTION, 2 / 10))
FP8_QUANT_SPLIT = ((Category.ELEMENTWISE, 7 / 8), (Category.NORM_REDUCTION, 1 / 8))
COMPOSITE_SPLITS = {"rmsnorm_fwd": RMSNORM_FWD_SPLIT, "rmsnorm_bwd": RMSNORM_BWD_SPLIT, "fp8_quant": FP8_QUANT_SPLIT}
ROPE_FWD_KERNELS = 5  # per tensor: mul cos, neg, cat, mul sin, add
ROPE_BWD_KERNELS = 5
# HF's fp32 rotation's backward, per tensor, as the HF Llama traces show it (PyTorch 2.11): two muls,
# each gradient cast back to q's dtype, neg, cat's backward (two zeros + two slice_backward copies)
# and two accumulating adds
HF_ROPE_FP32_BWD_KERNELS = 11
SWIGLU_FWD_KERNELS = 2  # silu, mul
SWIGLU_BWD_KERNELS = 3  # two muls, silu backward
# model._quant of the harness: abs, amax, clamp, scale, mul, clamp, cast, reciprocal
FP8_QUANT_KERNELS = 8
# Fused mode (Framework.MEGATRON): apex/TransformerEngine rotary applies one kernel to q and one to k
FUSED_ROPE_KERNELS = 2
# Learned absolute positions, as Megatron's Embedding runs them: word lookup, position lookup, add
LEARNED_POSITION_FWD_KERNELS = 3
