"""One account of what each GPU holds where: model state and framework buffers, on HBM and the host.

Model state is the parameters, their gradients, the fp32 master weights and the
optimizer's moments; buffers are the data-parallel frameworks' flat gradient
buckets (DDP, DeepSpeed). For one GPU of a pipeline stage (its tensor/expert
shard of the stage's parameters: `StageParams`, graph/parallel.stage_params)
the account says

- `hbm`: what HBM holds from the start of the step, before any op runs (the
  memory replay starts from it; gradients, gathered parameters and activations
  come and go with the op graph),
- `host`: what its offload keeps in host memory all step (every GPU of a node
  holds its own: `node_gpus`),
and `kept_states` the model state it keeps on the GPU, as the ZeRO paper counts
it (the report's "model_state_bytes").

The simulator's memory replay, its host report and check, and the plan search's
fast estimate (memory_estimate.py) all read it.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

from ghsim.errors import GhsimError
from ghsim.graph.offload import OffloadSetup
from ghsim.graph.dtypes import Dtypes
from ghsim.hardware import Hardware
from ghsim.plan import Framework, OffloadSchedule, Plan, Precision

ADAMW_MOMENTS = 8.0  # exp_avg and exp_avg_sq, fp32


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each model-state fragment before any sharding.

    torch-amp: fp32 params and grads, AdamW moments (8 B). deepspeed: bf16/fp16
    params and grads, fp32 master copy and moments (2 + 2 + 12: the ZeRO
    paper's K = 12). fsdp-mixed: the fp32 flat parameters are the masters; the
    bf16 parameters exist only gathered (ZeRO-3) or from forward to backward.
    """

    params: float
    grads: float
    master: float
    optimizer: float = ADAMW_MOMENTS

    @staticmethod
    def of(plan: Plan) -> "StateBytes":
        dt = Dtypes.of(plan)
        if plan.lora_rank or dt.param == 4:
            return StateBytes(dt.param, dt.grad, 0.0)
        if plan.framework == Framework.FSDP_MIXED and plan.zero >= 3:
            return StateBytes(0.0, dt.grad, 4.0)
        return StateBytes(dt.param, dt.grad, 4.0)


@dataclass(frozen=True)
class StageParams:
    """The parameters one GPU of a pipeline stage holds (its tp/ep shard of the stage's chunks)."""

    params: float
    trainable: float
    layer_share: float  # share of `params` inside decoder layers (the rest: embedding, final norm, LM head)
    # host bytes per byte of fp32 state when each trainable tensor is pinned on its own (torch's
    # power-of-two blocks: pinned_block), as FSDP2's CPUOffloadPolicy and a plain loop pin them
    pinned_tensor_blocks: float = 1.0


@dataclass(frozen=True)
class RankStates:
    """What one GPU holds where, by fragment (bytes)."""

    hbm: dict[str, float]  # on HBM from the start of the step
    host: dict[str, float]  # in host memory all step, for this GPU's offloaded share

def node_gpus(plan: Plan, hw: Hardware) -> int:
    """GPUs of the plan on one node: each holds its own offloaded state in the node's host memory."""
    return max(1, min(plan.gpus, plan.gpus_per_node or hw.gpus_per_node))


# --- without offload: the ZeRO paper's count ----------------------------------------------
def model_states(params: float, trainable: float, plan: Plan, dp: int) -> dict[str, float]:
    """Per-GPU bytes of each model-state fragment, as the ZeRO paper counts them (Sec. 5):
    stage 1 shards the optimizer state (and fp32 masters) over dp ranks, 2 also the
    gradients, 3 also the parameters."""
    z = plan.zero if dp > 1 else 0
    sb = StateBytes.of(plan)
    frozen = params - trainable
    out = {"params": (trainable * sb.params + frozen * Dtypes.of(plan).param) / (dp if z >= 3 else 1)}
    if plan.lora_rank:
        out["params"] += trainable * 4 / (dp if z >= 3 else 1)
    out["grads"] = trainable * sb.grads / (dp if z >= 2 else 1)
    if "optimizer" not in plan.offload:
        if sb.master:
            out["master_params"] = trainable * sb.master / (dp if z >= 1 else 1)
        out["optimizer_states"] = trainable * sb.optimizer / (dp if z >= 1 else 1)
    return out


def shards_grads(plan: Plan, zero: int) -> bool:
    """Whether each rank keeps only its shard of the gradients once they are reduced: ZeRO-2/3,
    and DeepSpeed's stage 1 too, which shares stage 2's code (stage_1_and_2.py
    reduce_ready_partitions_and_remove_grads drops the full gradients after reducing them)."""
    return zero >= 2 or (zero == 1 and plan.framework == Framework.DEEPSPEED)


def persistent_grad_shards(plan: Plan, dp: int) -> bool:
    """DeepSpeed preallocates its gradient partitions; PyTorch (FSDP, ZeroRedundancyOptimizer)
    creates gradients as backward produces them and frees them in zero_grad(set_to_none=True)."""
    return plan.framework == Framework.DEEPSPEED and dp > 1 and plan.zero >= 1


def model_state_bytes(params: float, trainable: float, plan: Plan, dp: int) -> dict[str, float]:
    """The part of model_states() held from the start of the step. Full gradients
    appear during backward and, under ZeRO-2/3, live until their bucket's
    reduce-scatter; PyTorch's gradient shards appear at that reduce-scatter: all
    of these come from the op graph."""
    out = model_states(params, trainable, plan, dp)
    if not (shards_grads(plan, plan.zero) and persistent_grad_shards(plan, dp)):
        del out["grads"]
    elif plan.zero == 1:  # DeepSpeed's stage 1 keeps the reduced shard, as stage 2 does
        out["grads"] = trainable * StateBytes.of(plan).grads / dp
    return out


# --- offload: what stays on the GPU, what the host holds ------------------------------------
def resident_states(states: dict[str, float], plan: Plan, layer_share: float,
                    setup: OffloadSetup, grads_are_shards: bool = True) -> dict[str, float]:
    """The model state a GPU keeps under the plan's offload, from what it keeps without it.

    The GPU keeps (1 - cpu_share) of the fp32 masters and AdamW moments; when the
    gradients stream to the host, the same share of any gradient partition
    (DeepSpeed allocates the partition next to the CPU optimizer, on the host); of
    offloaded parameters, only those outside the decoder layers (`layer_share` is
    the share inside them), the layers being fetched per use. `grads_are_shards`:
    "grads" is a persistent partition, not the full gradients backward creates.
    `setup`: the plan's offload, resolved once by the caller (graph/offload.resolve).
    """
    out = dict(states)
    keep = 1.0 - setup.cpu_share
    moved = ["master_params", "optimizer_states"] if setup.optimizer else []
    if setup.streams_gradients:
        moved += ["grad_partition"] + (["grads"] if grads_are_shards else [])
    for key in moved:
        if key in out:
            out[key] *= keep
            if not out[key]:
                out.pop(key)
    if setup.params and "params" in out:
        out["params"] *= 1.0 - layer_share
    return out


def pinned_block(nbytes: float) -> float:
    """Host bytes a pinned buffer holds: torch's caching host allocator (what Tensor.pin_memory()
    and DeepSpeed's pin_memory go through) hands out the next power of two (the measured ZeRO-2
    offload of 3.2e9 parameters pins 44.0 GB for 32.1 GB of buffers: 17.2 + 17.2 + 8.6)."""
    return float(2 ** math.ceil(math.log2(nbytes))) if nbytes > 0 else 0.0


def pinned_tensor_blocks(tensors: tuple[int, ...]) -> float:
    """StageParams.pinned_tensor_blocks of a model whose tensors are `tensors` ((elements, count) pairs
    flattened): pinned bytes over fp32 bytes when each tensor's fp32 copy is pinned on its own."""
    pairs = list(zip(tensors[::2], tensors[1::2]))
    exact = sum(4 * n * c for n, c in pairs)
    return sum(pinned_block(4 * n) * c for n, c in pairs) / exact if exact else 1.0


def host_static_bytes(setup: OffloadSetup, trainable: float, total: float, tensor_blocks: float = 1.0
                      ) -> dict[str, float]:
    """Host memory one GPU's offload (`setup`) holds all step (pinned unless the plan says pageable).
    DeepSpeed's buffers as its code allocates them: stage 1/2 (stage_1_and_2.py) a flat fp32 master,
    its flat fp32 gradient and a flat 16-bit copy of the partition, each one pinned block; stage 3
    (stage3.py) pageable fp32 masters, fp32 gradients pinned per sub-group and the 16-bit gradient
    partition as one pinned block (SuperOffload: plus the gradients' shared-memory copies and its
    worker's pinned buffer; with offload_param also the 16-bit parameter partition, flat and per
    parameter). Plain PyTorch and FSDP pin each tensor's fp32 master and
    gradient on its own (`tensor_blocks`: StageParams.pinned_tensor_blocks). The AdamW moments are
    pageable. Pinned pages count once, in the process that pins them (host_memory.json: CUDA's
    pinned memory shows as RssShmem)."""
    out: dict[str, float] = {}
    block = pinned_block if setup.host_pinned_blocks else float
    if setup.optimizer and setup.cpu_share > 0:
        p = setup.cpu_share * trainable / setup.shard
        out["master_params"] = 4 * p
        out["optimizer_states"] = ADAMW_MOMENTS * p
        out["grads"] = 4 * p  # fp32 gradients the CPU optimizer reads
        if setup.serial_grad_copies:
            out.update(master_params=block(4 * p), grads=block(4 * p), param_copy16=block(2 * p))
        elif setup.schedule == OffloadSchedule.SYNC and setup.host_pinned_blocks:
            out.update(master_params=4 * p * tensor_blocks, grads=4 * p * tensor_blocks)
        elif setup.grad_round_trip:  # with offload_param too (stage3.py allocates both either way)
            full, rest = divmod(p, setup.sub_group)
            out.update(grads=int(full) * block(4 * setup.sub_group) + block(4 * rest), grad_partition16=block(2 * p))
            if setup.schedule == OffloadSchedule.SUPEROFFLOAD:  # 0.19 (0.18 makes no round trip: its fp32
                # gradients are the plain `grads` above). Handing a sub-group to the CPU-Adam worker moves its
                # fp32 gradient into shared memory (torch.multiprocessing), while the pinned block stays in
                # torch's cache; the worker copies each gradient into its own pinned buffer of the largest
                # sub-group (superoffload_utils.py; offload_calibration.py: the handed-over tensors come back unpinned)
                out.update(grads_shared=4 * p, worker_grad_buffer=block(4 * min(p, setup.sub_group)))
    if setup.params:
        frozen = total - trainable
        if setup.fsdp_like:  # FSDP keeps the fp32 flat parameter on the host: the master itself
            out["frozen_params"] = 4 * frozen / setup.shard
        else:
            # ZeRO-Infinity keeps the 16-bit partition on the host, next to the fp32 masters, in one
            # flat buffer (stage3.py _create_param_groups_fp16_flat_cpu_memory); zero.Init first gave
            # each parameter its own partition there (partition_parameters.py _partition_param,
            # pinned with offload_param.pin_memory), and those stay allocated after the copy into the
            # flat buffer (host_memory.json ds_pinned_z3_offparam: every one in torch's pinned total)
            p16 = 2 * total / setup.shard
            out["offloaded_params"] = block(p16)
            out["init_param_partitions"] = p16 * (tensor_blocks if setup.host_pinned_blocks else 1.0)
    return {k: v for k, v in out.items() if v > 0}


def check_host_capacity(host_static: dict[str, float], node_gpus: int, capacity: float, hw_name: str,
                        plan: Plan) -> None:
    need = sum(host_static.values()) * node_gpus
    if need > capacity:
        what = ",".join(sorted(plan.offload))
        raise GhsimError(
            f"offloading {what} needs {need / 1e9:.0f} GB of host memory per node "
            f"({', '.join(f'{k} {v * node_gpus / 1e9:.0f} GB' for k, v in host_static.items())}); "
            f"{hw_name} has {capacity / 1e9:.0f} GB"
        )


# --- the account ----------------------------------------------------------------------------
def comm_buckets(plan: Plan, dp: int, trainable: float) -> float:
    """Flat gradient buffers the data-parallel framework allocates up front."""
    zero = plan.zero if dp > 1 else 0
    grads = trainable * StateBytes.of(plan).grads
    if dp > 1 and zero == 0 and plan.framework == Framework.TORCH_AMP:
        # DDP copies gradients into its own flat buckets (gradient_as_bucket_view=False, the default)
        return grads
    if plan.zero >= 1 and plan.framework == Framework.DEEPSPEED:
        # DeepSpeed's flat reduce bucket (reduce_bucket_size elements; ZeRO-3: stage3.py's ipg buffer),
        # allocated with contiguous_gradients (the default) on one GPU too: the measured offload
        # cases' HBM peaks are that 1.0 GB above the states (validation/measured_libraries). Its full
        # size however small the model (_raw/host_memory.json: 1.000 GB allocated right after ZeRO-3's
        # initialize for 2.5e8 parameters; ZeRO-2's peak 1.10 GB for a 1.4e6-parameter model)
        return plan.reduce_bucket_size * Dtypes.of(plan).grad
    return 0.0


def handed_over_gradient(setup: OffloadSetup, trainable: float) -> float:
    """DeepSpeed 0.18's SuperOffload: the fp32 gradient of the sub-group last handed to the CPU-Adam
    worker, which CUDA IPC keeps allocated on the GPU until the worker drops it (OffloadSetup.gpu_grad_handoff);
    the step starts with one held from the last step's last hand-over."""
    if not (setup.gpu_grad_handoff and setup.cpu_share > 0):
        return 0.0
    return 4 * min(setup.cpu_share * trainable / setup.shard, setup.sub_group)


def fp8_weight_cache(plan: Plan, dp: int, stage: StageParams) -> float:
    """Transformer Engine's cached fp8 weights under `--framework megatron --precision fp8`: each
    projection keeps its fp8 weight and fp8 transpose (1 + 1 bytes per weight; with --fp8-params the
    weight is the parameter itself) from the step's first micro-batch on (graph/te_fp8.py). Under ZeRO-3 (Megatron FSDP) weights are gathered per use and
    nothing stays cached."""
    if plan.precision != Precision.FP8 or not plan.framework.fused_kernels or (plan.zero >= 3 and dp > 1):
        return 0.0
    per_weight = 1.0 if plan.fp8_params else 2.0  # fp8 parameters: only the transposes are extra
    return per_weight * stage.params * stage.layer_share


def fsdp_root_params(plan: Plan, dp: int, stage: StageParams, setup: OffloadSetup) -> float:
    """FSDP's root unit (what no decoder-layer unit wraps: embedding, final norm, LM head) keeps
    its working-precision parameters on the GPU from its forward to the end of backward: FSDP2's
    fully_shard leaves the root unresharded after forward ("its parameters would typically be
    immediately all-gathered for backward", torch/distributed/fsdp/_fully_shard/_fully_shard.py),
    FSDP1 skips the root in _post_forward_reshard (_runtime_utils.py). With dp > 1 the graph's root
    all-gather holds them (graph/parallel.py); on one GPU under CPUOffloadPolicy nothing is gathered,
    but the root's parameters are copied up from the host all the same and held, which this counts."""
    if plan.framework != Framework.FSDP_MIXED or plan.zero < 3 or dp > 1 or not setup.params:
        return 0.0
    return Dtypes.of(plan).param * stage.params * (1.0 - stage.layer_share)


def rank_states(plan: Plan, dp: int, stage: StageParams, setup: OffloadSetup) -> RankStates:
    """What one GPU of a stage holds where, with `dp` data-parallel ranks sharding its state and
    `setup` (the plan's offload, resolved once by the caller) moving part of it to the host."""
    unoffloaded = plan.with_(offload=frozenset())
    hbm = resident_states(model_state_bytes(stage.params, stage.trainable, unoffloaded, dp), plan, stage.layer_share,
                          setup)
    buckets = comm_buckets(plan, dp, stage.trainable)
    if buckets:
        hbm["comm_buckets"] = buckets
    handed = handed_over_gradient(setup, stage.trainable)
    if handed:
        hbm["worker_grad_handoff"] = handed
    cache = fp8_weight_cache(plan, dp, stage)
    if cache:
        hbm["fp8_weight_cache"] = cache
    root = fsdp_root_params(plan, dp, stage, setup)
    if root:
        hbm["fsdp_root_params"] = root
    return RankStates(hbm, host_static_bytes(setup, stage.trainable, stage.params, stage.pinned_tensor_blocks))


def kept_states(plan: Plan, dp: int, stage: StageParams, setup: OffloadSetup) -> dict[str, float]:
    """The model state one GPU of a stage keeps on the GPU, as the ZeRO paper counts it (the
    report's "model_state_bytes"): rank_states' fragments with the full gradients backward
    creates, without the buckets."""
    zero = plan.zero if dp > 1 else 0
    return resident_states(model_states(stage.params, stage.trainable, plan.with_(offload=frozenset()), dp), plan,
                           stage.layer_share, setup, grads_are_shards=zero >= 2)
