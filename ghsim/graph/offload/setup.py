"""What a plan's offload is, resolved (which state moves, how, who updates what), and the plain
values the offload rewrite (graph/offload.py) takes: facts of the step, where gradients
become ready, and what crosses the link (Widths, decided by cost/offload_policy.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ghsim.errors import GhsimError
from ghsim.graph.ops import Resource
from ghsim.graph.optimizer import resolve_cpu_optimizer
from ghsim.plan import DEEPSPEED_REDUCE_BUCKET, DEEPSPEED_SUB_GROUP, CpuOptimizer, Framework, OffloadSchedule, Plan, Recompute

# SuperOffload sizes buckets to saturate the link: large enough that the per-copy
# latency costs at most this share of a bucket's transfer time.
BUCKET_LATENCY_SHARE = 0.05


@dataclass(frozen=True)
class OffloadSetup:
    """The offload a plan asks for, resolved: which state moves, how, and who updates what."""

    schedule: OffloadSchedule  # never AUTO
    optimizer: bool  # fp32 masters and AdamW states on the host (gradients must reach it)
    params: bool  # parameters live on the host, fetched per layer
    activations: bool  # saved activations go to the host in forward
    cpu_share: float  # fraction of the optimizer work on the CPU (offload_ratio)
    shard: int  # ranks sharing optimizer state and gradients (ZeRO >= 1): each offloads 1/shard
    cpu_impl: CpuOptimizer  # the host AdamW implementation, never AUTO
    pinned: bool
    # DeepSpeed ZeRO-Offload at stage 1/2 (overlap_comm false by default): each gradient is cast
    # to fp32 on the GPU and copied into the pinned fp32 buffer on the stream that made it, and
    # the host step runs pass by pass (schedules._zero_offload_step)
    serial_grad_copies: bool = False
    # DeepSpeed's ZeRO-Offload (stage 1/2): each gradient's bucket copy, fp64 norm and overflow
    # check run on the GPU as it leaves (deepspeed_optimizer.offload_grad_checks)
    gpu_grad_checks: bool = False
    # gradients leave on the stream that made them (stage 1/2 above; clipped SuperOffload's
    # copies into pageable memory, which block the backward thread)
    grads_on_compute_stream: bool = False
    # DeepSpeed 0.19 ZeRO-3 with offload_optimizer only: each sub-group's updated fp32 partition is
    # copied into the GPU's 16-bit partition by the training thread from pageable memory
    # (aten::copy_ with a dtype change; its trace: Pageable -> Device), whatever pin_memory says
    pageable_param_return: bool = False
    # SuperOffload steps each sub-group on the CPU during backward as its gradients complete; with
    # gradient clipping DeepSpeed 0.19 does not (superoffload_stage3.py partition_grads: "not
    # self.clip_grad"), and _step_with_clipping steps sub-group by sub-group after backward
    speculative: bool = False
    # DeepSpeed 0.18's SuperOffload with clipping: the speculative steps run during backward as
    # without it; once the global norm is known, _handle_gradient_clipping rolls each CPU sub-group's
    # step back, clips its gradient and steps it again, waiting for the worker each time
    # (superoffload_stage3.py v0.18.3 _sync_cpu_optimizer_step)
    rollback_clip: bool = False
    # DeepSpeed stage 3 scales every fp32 gradient partition by 1 / (loss scale x clip factor) in its
    # step, sub-group by sub-group, clipping or not (stage3.py unscale_and_clip_grads: grad.mul_,
    # also from 0.18's SuperOffload step): with the optimizer offloaded, a host pass over the gradients
    host_unscale: bool = False
    grad_clip: bool = False
    # FSDP2's CPUOffloadPolicy: each layer's parameters come up on the compute stream (its trace:
    # every Pinned -> Device copy on the kernels' stream), so they never overlap the layer's kernels
    params_on_compute_stream: bool = False
    # DeepSpeed 0.19 ZeRO-3 with offload_optimizer (stage3.py partition_grads): each 16-bit gradient
    # partition is copied into the pinned 16-bit flat buffer and straight back to the GPU
    # (grad_buffer.to(device)) before its fp32 copy leaves; its traces: 6.4 GB each way for 3.2e9
    # parameters on the reduction stream
    grad_round_trip: bool = False
    # the host buffers were allocated pinned (pin_memory), whatever later made copies pageable
    host_pinned_blocks: bool = True
    # DeepSpeed's reduce_bucket_size and sub_group_size (elements): its gradient buckets, and the
    # sub-groups ZeRO-3 offloads and steps (per GPU)
    bucket_elements: float = DEEPSPEED_REDUCE_BUCKET
    sub_group: float = DEEPSPEED_SUB_GROUP
    # DeepSpeed 0.18's SuperOffload (superoffload_stage3.py partition_grads) hands each CPU sub-group's
    # fp32 gradient to its worker process as the CUDA tensor it cast it into (async_step(...,
    # concatenated_buffer.data)): torch shares it over CUDA IPC and keeps the block allocated until the
    # worker has dropped it (torch.multiprocessing, "Sharing CUDA tensors"), so one sub-group's fp32
    # gradient stays on the GPU from one hand-over to the next; 0.19 hands over the pinned host copy
    gpu_grad_handoff: bool = False
    # DeepSpeed ZeRO-3 with offload_param: stage3_max_live_parameters, the elements its parameter
    # prefetch keeps available (schedules._layers_kept_for_backward); 0: not DeepSpeed's
    max_live: float = 0.0

    @property
    def any(self) -> bool:
        return self.optimizer or self.params or self.activations

    @property
    def fsdp_like(self) -> bool:
        """Parameters offloaded by plain PyTorch: FSDP CPUOffload semantics."""
        return self.params and self.schedule == OffloadSchedule.SYNC

    @property
    def streams_gradients(self) -> bool:
        """Gradients leave for the host as backward produces them (or as their reduction ends),
        and their GPU copies are freed; otherwise (plain PyTorch optimizer offload) they
        accumulate on the GPU and are copied down once, after the step's last backward."""
        return self.optimizer and (self.schedule != OffloadSchedule.SYNC or self.params)


def resolve_schedule(plan: Plan) -> OffloadSchedule:
    """The plan's offload schedule, "auto" resolved: the framework's own (DeepSpeed overlaps, plain PyTorch syncs)."""
    if plan.offload_schedule == OffloadSchedule.AUTO:
        return OffloadSchedule.OVERLAPPED if plan.framework == Framework.DEEPSPEED else OffloadSchedule.SYNC
    return plan.offload_schedule


def superoffload_whole_sub_groups(plan: Plan) -> bool:
    """DeepSpeed 0.18's SuperOffload (ZeRO-3): gradients reduced a whole sub-group at a time, each CPU
    sub-group's fp32 gradient handed to the worker on the GPU (OffloadSetup.gpu_grad_handoff)."""
    return (plan.framework == Framework.DEEPSPEED and plan.zero == 3 and plan.deepspeed_version == "0.18"
            and resolve_schedule(plan) == OffloadSchedule.SUPEROFFLOAD and "optimizer" in plan.offload)


def resolve(plan: Plan) -> OffloadSetup:
    schedule = resolve_schedule(plan)
    params = "params" in plan.offload
    # Gradients must reach the CPU optimizer, and offloaded parameters are updated
    # where their fp32 masters live (ZeRO-Infinity, FSDP CPUOffload): both imply the rest.
    optimizer = "optimizer" in plan.offload or "grads" in plan.offload or params
    zero_offload = schedule == OffloadSchedule.OVERLAPPED and not params and plan.zero <= 2
    v018 = superoffload_whole_sub_groups(plan)
    # 0.19's clipped SuperOffload (0.18 steps speculatively and rolls back instead: rollback_clip)
    clipped_superoffload = schedule == OffloadSchedule.SUPEROFFLOAD and plan.grad_clip and not params and not v018
    return OffloadSetup(
        schedule=schedule,
        optimizer=optimizer,
        params=params,
        activations="activations" in plan.offload,
        cpu_share=plan.offload_ratio if optimizer else 0.0,
        shard=plan.dp if plan.zero >= 1 else 1,
        cpu_impl=resolve_cpu_optimizer(plan),
        # DeepSpeed 0.19's SuperOffload keeps its host buffers pageable whatever pin_memory says
        # (its trace on the lent x86 host: Device -> Pageable, Pageable -> Device); on GH200's
        # coherent C2C pageable memory moves at near the pinned rate, on PCIe at a fraction
        pinned=plan.offload_pinned and schedule != OffloadSchedule.SUPEROFFLOAD,
        serial_grad_copies=zero_offload,
        gpu_grad_checks=zero_offload and plan.framework == Framework.DEEPSPEED,
        grads_on_compute_stream=zero_offload or clipped_superoffload,
        pageable_param_return=(schedule == OffloadSchedule.OVERLAPPED and not params and plan.zero == 3)
        or clipped_superoffload,
        speculative=schedule == OffloadSchedule.SUPEROFFLOAD and (not plan.grad_clip or v018),
        rollback_clip=v018 and plan.grad_clip and not params,
        host_unscale=plan.framework == Framework.DEEPSPEED and plan.zero == 3 and optimizer
        and (schedule == OffloadSchedule.OVERLAPPED or v018),
        grad_clip=plan.grad_clip,
        params_on_compute_stream=params and plan.fsdp2,
        # (0.18's SuperOffload has its own partition_grads, without the round trip)
        grad_round_trip=plan.framework == Framework.DEEPSPEED and plan.zero == 3 and optimizer
        and schedule != OffloadSchedule.SYNC and not v018,
        host_pinned_blocks=plan.offload_pinned,
        bucket_elements=plan.reduce_bucket_size,
        sub_group=plan.sub_group_size,
        gpu_grad_handoff=v018 and not params and plan.offload_ratio > 0,
        max_live=plan.max_live_parameters if params and plan.zero == 3 and plan.framework == Framework.DEEPSPEED
        else 0.0,
    )


def sub_group_sizes(tensors: list[int], size: float) -> list[int]:
    """DeepSpeed ZeRO-3's sub-groups (elements each) of one rank's parameter partitions (`tensors`,
    elements each, in the model's order): stage3.py _create_fp16_sub_groups closes a sub-group once it
    holds at least `size` elements, the last one at the last parameter."""
    groups, held = [], 0
    for n in tensors:
        held += n
        if held >= size:
            groups.append(held)
            held = 0
    return groups + [held] if held else groups


def sub_group_count(tensors: list[int], size: float) -> int:
    return max(1, len(sub_group_sizes(tensors, size)))


def deepspeed_sub_group_ratio(plan: Plan, tensors: Callable[[], list[int]] | list[int]) -> tuple[Plan, str | None]:
    """The plan with the offload_ratio DeepSpeed ZeRO-3 really runs, and a note when it differs.
    Stage 3 splits the optimizer by whole sub-groups of sub_group_size parameters (default 1e9):
    the first int((1 - ratio) x sub-groups) stay on the GPU (stage3.py subgroup_to_device, in float
    arithmetic: 0.8 of 5 sub-groups keeps int(0.19999999999999996 x 5) = 0), so a 3B model's 4
    sub-groups at ratio 0.9 all go to the CPU. `tensors`: the rank's parameter partitions in the
    model's order (graph/step.partition_sizes), or a function giving them (called only when needed:
    the plan search asks this of every plan)."""
    if not (plan.framework == Framework.DEEPSPEED and plan.zero == 3 and plan.offload_ratio < 1
            and "optimizer" in plan.offload):
        return plan, None
    groups = sub_group_count(tensors() if callable(tensors) else tensors, plan.sub_group_size)
    ratio = 1 - int((1 - plan.offload_ratio) * groups) / groups
    if abs(ratio - plan.offload_ratio) < 1e-9:
        return plan, None
    return plan.with_(offload_ratio=ratio), (
        f"DeepSpeed ZeRO-3 offloads whole sub-groups ({groups} of about {plan.sub_group_size:.0e} parameters per GPU): "
        f"offload ratio {plan.offload_ratio:g} runs as {ratio:g}")


def check_offload(plan: Plan) -> None:
    """Offload choices that make no sense whatever the hardware: one line each."""
    setup = resolve(plan)
    if plan.offload_schedule == OffloadSchedule.SUPEROFFLOAD and not setup.optimizer:
        raise GhsimError("--offload-schedule superoffload schedules the optimizer: add --offload optimizer")


def library_refusal(plan: Plan) -> str | None:
    """Why the plan's library would not run the plan as stated (None: it would). The simulator
    still prices such what-ifs; the commands refuse them and the search never proposes them."""
    if plan.framework != Framework.DEEPSPEED:
        return None
    if plan.offload_schedule == OffloadSchedule.SUPEROFFLOAD and plan.zero != 3:
        # deepspeed/runtime/engine.py builds SuperOffloadOptimizer_Stage3 only in the stage-3 path
        return (f"DeepSpeed runs SuperOffload only with ZeRO stage 3 (at stage {plan.zero} it ignores super_offload "
                "and runs ZeRO-Offload): add --zero 3 or drop --offload-schedule superoffload")
    if plan.pp > 1 and plan.zero >= 2:
        # deepspeed/runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
        return (f"DeepSpeed's pipeline engine refuses ZeRO stage {plan.zero} ('ZeRO-2 and ZeRO-3 are incompatible "
                "with pipeline parallelism'): use --zero 0 or 1 with --pp")
    return None


@dataclass(frozen=True)
class StepFacts:
    """What the rewrite needs to know about the step it rewrites."""

    trainable: float  # trainable parameters (per GPU, before ZeRO sharding)
    n_tensors: int
    saved_per_layer: float  # activation bytes a layer keeps for its backward (recompute: its input)
    gpu_param_width: int  # bytes per parameter the GPU computes with (fp32 under torch-amp)
    layer_params: float  # parameters of one decoder layer (all, trainable or not)
    grad_width: float = 0.0  # bytes per gradient element; 0: from the graph's gradient allocations
    tensor_elements: tuple[int, ...] = ()  # the trainable tensors' sizes, (elements, count) pairs flattened
    head_params: float = 0.0  # the LM head's weight elements where this graph runs it (0: not here)


@dataclass(frozen=True)
class GradSource:
    """Gradients ready to leave for the host: after a backward run, or after their reduction."""

    after: int  # index of the op after which they are ready
    params: float  # parameters they cover, before ZeRO sharding
    held: float  # HBM bytes their copy down frees
    key: tuple  # the same piece of the model in every micro-batch
    layer: int = -1
    mb: int = 0
    accumulate: bool = False  # the host adds them to earlier micro-batches' gradients
    stream: str = Resource.GPU  # where they are produced (a GPU cast of them is queued there)


@dataclass(frozen=True)
class RankHooks:
    """What a multi-GPU micro-batch graph tells the rewrite (graph/parallel.py)."""

    grad_sources: tuple[GradSource, ...]  # in backward order
    gathers: dict[tuple[str, int], int]  # (FWD|BWD, layer) -> the ZeRO-3 all-gather of that layer
    steps: bool  # the optimizer step follows this graph (the step's last micro-batch)
    loss: bool  # the graph holds the final norm, LM head and loss


@dataclass(frozen=True)
class Widths:
    """What crosses the host link and where the casts run (cost/offload_policy.py decides)."""

    grad: int  # bytes per parameter of a gradient on the link
    param: int  # bytes per parameter of an updated parameter on the link
    grad_gpu_cast: bool
    grad_cpu_cast: bool
    param_cpu_cast: bool
    param_gpu_cast: bool
    bucket_d2h: float  # bytes per copy of SuperOffload's link-sized buckets, each direction
    bucket_h2d: float


def saved_bytes_for(plan: Plan, saved: float, x_bytes: float) -> float:
    """What a layer offloads: its saved activations, or under full recompute its checkpointed input."""
    return x_bytes if plan.recompute == Recompute.FULL else saved
