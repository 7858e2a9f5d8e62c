"""DeepSpeed's ZeRO optimizer step on the GPU (bf16/fp16 weights, fp32 masters, no offload), as
DeepSpeed 0.19 runs it: the passes its profiler trace shows around FusedAdam
(validation/measured_libraries/h100-ds-z2-llama3b-ckpt-mb2-s2048: the gradient copies of the
backward hooks into the reduce bucket and the flat partition, aten::to, the fp64 linalg_vector_norm
with amax/amin per tensor, mul_, FusedAdam, copy_), each a pass over this rank's gradient
partition priced at the measured device-copy rate.

Memory: stage 1/2 gathers the 16-bit gradients into one flat partition and widens it to an fp32
gradient (stage_1_and_2.py step(): _get_preflattened_grad_partition(...).to(fp32));
both live until the step has copied the updated masters into the 16-bit weights. Stage 3's
gradient partition is already flat, and stage3.py widens it one sub-group at a time
(sub_group_size parameters, default 1e9), so only one sub-group's fp32 copy exists at once.
"""

from __future__ import annotations

from ghsim.graph import ops as K
from ghsim.graph.dtypes import dtyped
from ghsim.graph.ops import Category, Op, Phase, Resource
from ghsim.graph.optimizer import gpu_adamw
from ghsim.plan import DEEPSPEED_SUB_GROUP, Framework

# Kernels DeepSpeed launches per gradient tensor for the global norm and its inf/nan checks
# (linalg_vector_norm, isfinite x 2, amax, amin, logical_and, logical_not, add_ and their
# reductions): 4,100 kernels for 254 tensors in the trace named above.
NORM_KERNELS_PER_TENSOR = 16
_TAG = "optimizer_temp"


# the variant of the host op carrying DeepSpeed ZeRO-3's module hooks (priced per module and
# direction from a measurement: cost/compute.py)
ZERO3_HOOKS = "zero3_hooks"


def zero3_hooks(model, plan, phase: str) -> list[Op]:
    """DeepSpeed ZeRO-3's fetch/release hooks around every module of one decoder layer, as host
    time on the training thread (the host waits; the GPU runs what is already queued). DeepSpeed
    hooks every submodule, not only those holding parameters (stage3's hooks are registered on
    module.modules()): a Hugging Face Llama layer runs 13 (the layer, attention, MLP and its
    activation around the 7 projections and 2 norms; its trace: 369 pre-backward hooks for 28
    layers and 5 outside them). Each is priced at the measured cost of a module with parameters
    (an assumption for the ones without: their fetch is empty, the hook bookkeeping is not).
    Experts add their MLP and activation; LoRA two adapter modules per target."""
    if not (plan.framework == Framework.DEEPSPEED and plan.zero >= 3):
        return []
    experts = model.moe.num_experts if model.moe is not None else 1
    containers = 3 + experts  # the layer, attention, the MLP (or MoE block), each expert's activation
    if model.moe is not None:
        containers += experts  # each expert's MLP module
    modules = 4 + model.mlp_matrices * experts + 2 + (1 if model.moe is not None else 0) + containers
    if plan.lora_rank:
        modules += 2 * (4 + model.mlp_matrices)
    return [Op(name="zero3.hooks", category=Category.OTHER, kind=K.HOST_WORK, resource=Resource.HOST,
               variant=ZERO3_HOOKS, params=float(modules), kernels=0, phase=phase, host_waits=True)]


def _pass(name: str, nbytes: float, kernels: int, width: int, phase: str = Phase.OPT,
          stream: str = Resource.GPU) -> Op:
    return Op(name=name, category=Category.ELEMENTWISE, kind=K.MEMBOUND, resource=stream,
              variant=dtyped("copy", width), bytes=nbytes, kernels=kernels, phase=phase)


def offload_grad_checks(params: float, grad_width: int, stream: str, boundary: bool) -> list[Op]:
    """ZeRO-Offload at stage 1/2, per gradient as the backward hooks move it (stage_1_and_2.py
    copy_grads_in_partition with cpu_offload): its copy into the reduce bucket, every micro-batch;
    at the accumulation boundary (`boundary`: the step's last micro-batch) also its norm in fp64
    (set_norm_for_param_grad_in_gpu) and its overflow check (amax, amin), on the GPU before the
    gradient leaves for the host; the ZeRO-2 offload traces show the same fp64 NormTwoOps and
    16-bit reductions as the step without offload."""
    g = grad_width
    ops = [_pass("ds.grads_to_bucket", 2 * g * params, 1, g, Phase.BWD, stream)]
    if boundary:
        ops.append(_pass("ds.grad_checks", grad_norm_bytes(2, g) * params, NORM_KERNELS_PER_TENSOR, g,
                         Phase.BWD, stream))
    return ops


def grad_norm_bytes(zero: int, g: int) -> float:
    """Bytes per parameter of the gradient norm and its overflow check. Stage 1/2
    (get_grad_norm_direct, has_inf_or_nan in DeepSpeed 0.19) casts every 16-bit gradient to fp64
    before vector_norm (get_norm_dtype: fp64 where the device has it) and checks it with an amax
    and an amin: read g + write 8, read 8, read g twice (the h100-ds-z2 trace: a copy_ into fp64,
    a double NormTwoOps reduction and 2 x 254 16-bit reductions after backward). Stage 3 keeps the
    earlier estimate (one fp32 read plus the 16-bit check), its trace not yet read this way."""
    return 3 * g + 16 if zero <= 2 else 4 + 2 * g


def deepspeed_optimizer_ops(params: float, n_tensors: int, zero: int, grad_width: int, clip: bool,
                            sub_group: float = DEEPSPEED_SUB_GROUP) -> list[Op]:
    """The step over `params` (this rank's partition) held in `n_tensors` tensors; `sub_group`:
    zero_optimization.sub_group_size."""
    P, g = params, grad_width
    ops = []
    if zero <= 2:
        # contiguous_gradients (the default): each gradient goes into the reduce bucket as
        # backward produces it, and after the bucket's reduction into the flat gradient partition
        # (reduce_ipg_grads -> copy_grads_in_partition), which the step then uses as is
        # (_get_preflattened_grad_partition): two 16-bit copies, run by the backward hooks on the
        # compute stream (overlap_comm off) and placed here, at the step they precede.
        ops.append(_pass("ds.grads_to_bucket", 2 * g * P, 2, g))
        ops.append(_pass("ds.bucket_to_partition", 2 * g * P, 2, g).with_hbm(_TAG, g * P))
    fp32 = 4 * (P if zero <= 2 else min(P, sub_group))  # the fp32 gradient held at once
    widen = _pass("ds.grads_to_fp32", (g + 4) * P, 2, 4).with_hbm(_TAG, fp32)
    ops.append(widen.with_hbm(_TAG, -g * P) if zero <= 2 else widen)
    ops.append(_pass("ds.grad_norm", grad_norm_bytes(zero, g) * P, NORM_KERNELS_PER_TENSOR * n_tensors, 4))
    if clip:
        ops.append(_pass("ds.clip_grads", 8 * P, 1, 4))
    ops.append(gpu_adamw("adamw.fused", P, n_tensors, "fused"))
    ops.append(_pass("ds.masters_to_weights", (4 + g) * P, 1, 4).with_hbm(_TAG, -fp32))
    return ops
