"""The AdamW step: the GPU op as PyTorch runs it (its kernel launches and temporary memory),
and the names of the AdamW implementations a step can run on the GPU or the CPU."""

from __future__ import annotations

import math
from enum import StrEnum

from ghsim.graph.ops import Category, Kind, Op, Phase, Resource
from ghsim.plan import CpuOptimizer, Framework, OffloadSchedule, Plan


class GpuAdam(StrEnum):
    """torch.optim.AdamW on CUDA tensors (Plan.optimizer_impl)."""

    FOREACH = "foreach"  # foreach=True: multi-tensor kernels per _foreach_ call
    FUSED = "fused"  # fused=True: one _fused_adamw_ call


def resolve_cpu_optimizer(plan: Plan) -> CpuOptimizer:
    """The host AdamW a plan runs, "auto" resolved to its library's own: DeepSpeed (and its
    SuperOffload) runs DeepSpeedCPUAdam; plain PyTorch and FSDP run torch.optim.AdamW with default
    flags, which on CPU tensors is the single-tensor for-loop."""
    if plan.cpu_optimizer != CpuOptimizer.AUTO:
        return plan.cpu_optimizer
    if plan.framework == Framework.DEEPSPEED or plan.offload_schedule == OffloadSchedule.SUPEROFFLOAD:
        return CpuOptimizer.DEEPSPEED
    return CpuOptimizer.TORCH_FORLOOP

def cpu_adamw_temporaries(impl: CpuOptimizer, params: float, largest_tensor: float) -> float:
    """Host bytes the CPU AdamW allocates while it steps `params` fp32 parameters whose largest
    tensor has `largest_tensor` elements (torch 2.11 torch/optim/adam.py, which AdamW runs with
    decoupled weight decay; every other update is in place):

    - foreach (_multi_tensor_adam): `exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)`
      over the whole (device, dtype) group at once, then `_foreach_div_` / `_foreach_add_` on it:
      one fp32 copy of the second moments, 4 B per parameter;
    - for-loop (_single_tensor_adam): `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`
      per tensor: the square root and the quotient exist together, two fp32 copies of one tensor;
      the previous tensor's `denom` is still bound meanwhile, a third copy where equally large
      tensors follow each other; in a Hugging Face model the largest (the embedding) comes first;
    - fused (torch._fused_adamw_) and DeepSpeedCPUAdam (one C++ pass per element): none.

    Measured (validation/measured_libraries/_raw/host_memory.json adam_*, a step's peak over its
    states): foreach 5.612 GB for 1.40e9 parameters (4 B each: 5.614), for-loop 2.100 GB on a list
    led by a 2.63e8-element tensor (2 copies: 2.101) and 0.200 GB on 16 x 16.8M (3 copies), fused 0.
    The step holds them once, whatever pieces ghsim prices it in: `params` is the whole step's."""
    if impl == CpuOptimizer.TORCH_FOREACH:
        return 4.0 * params
    if impl == CpuOptimizer.TORCH_FORLOOP:
        return 2 * 4.0 * largest_tensor
    return 0.0


# torch.optim.AdamW(foreach=True) makes this many _foreach_ calls per step, one
# launch each when all tensors fit one launch: measured, validation/microbench/
# h100-overhead.json framework_overhead (opt_launches = 8 for 39 tensors).
# fused=True makes one _fused_adamw_ call.
FOREACH_ADAMW_CALLS = 8
FUSED_ADAMW_CALLS = 1
# multi_tensor_apply splits each call into launches of at most 110 tensors
# (depth 4: params, grads, exp_avg, exp_avg_sq) and at most 320 blocks of 65536
# elements (aten/src/ATen/native/cuda/MultiTensorApply.cuh: depth_to_max_tensors,
# depth_to_max_blocks, kChunkSize).
MAX_TENSORS_PER_LAUNCH = 110
ELEMENTS_PER_LAUNCH = 320 * 65536


def adamw_launches(n_tensors: int, n_params: float, impl: str) -> int:
    calls = FOREACH_ADAMW_CALLS if impl == GpuAdam.FOREACH else FUSED_ADAMW_CALLS
    per_call = max(1, math.ceil(n_tensors / MAX_TENSORS_PER_LAUNCH), math.ceil(n_params / ELEMENTS_PER_LAUNCH))
    return calls * per_call


def gpu_adamw(name: str, params: float, n_tensors: int, impl: str) -> Op:
    """AdamW over `params` fp32 parameters on the GPU. foreach materialises
    _foreach_sqrt(exp_avg_sq), a full fp32 copy of the second moments; fused does not."""
    return Op(name=name, category=Category.OPTIMIZER, kind=Kind.OPT_GPU, resource=Resource.GPU, params=params,
              variant=impl, kernels=adamw_launches(n_tensors, params, impl), phase=Phase.OPT,
              hbm_transient=4 * params if impl == GpuAdam.FOREACH else 0.0, mem_tag="optimizer_temp")
