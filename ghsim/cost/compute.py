"""Op durations: from each op's work and the hardware's calibrated efficiencies.

GEMMs use the measured efficiency at the nearest measured shapes (not one flat
MFU); attention uses the measured efficiency of PyTorch's default SDPA backend
by dtype, sequence, heads and head size; memory-bound ops use the measured fixed time and achieved bandwidth of
the same eager PyTorch op; copies use the host link's rate for their direction
and buffer kind; the CPU optimizer uses the host's measured AdamW rate.

Measured efficiencies carry over to another part of the same die by scaling:
compute-bound work with the ratio of peak FLOP/s, memory-bound work with the
ratio of HBM bandwidth (an H100 measurement priced for GH200's 4 TB/s HBM3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ghsim.cost.calibration import Calibration, attention_features
from ghsim.cost.overlay import Corrections
from ghsim.cost.library_overheads import (blocking_cast_seconds_per_param, sdpa_bool_mask_slowdown, sdpa_fallback_rate,
                                          sdpa_mask_over_causal_time, torchao_eager_launch_ratio, zero3_hook_seconds)
from ghsim.graph.deepspeed_optimizer import ZERO3_HOOKS
from ghsim.graph.dtypes import INDUCTOR
from ghsim.graph.torchao_fp8 import CAST, ROWWISE
from ghsim.graph.flops import gemm_flops, window_pair_fraction
from ghsim.graph.layer_ops import MASKED_SDPA
from ghsim.graph.offload.ops import BLOCKING_CAST, FOREACH_NORM
from ghsim.cost.hostlink import HostSide
from ghsim.cost.fp8 import cast_rate, rowwise_gemm_factor
from ghsim.cost.inductor import measured_hbm_Bps, region_curve
from ghsim.graph.ops import KERNEL_CATEGORIES, Category, Kind, Op, Phase, Resource
from ghsim.graph.optimizer import FOREACH_ADAMW_CALLS, FUSED_ADAMW_CALLS, GpuAdam
from ghsim.hardware import Hardware
from ghsim.plan import Plan, Precision, Recompute

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

# Enum members the per-op paths below compare with, read off their classes once (graph/ops.py:
# a member read off its class is slow in Python 3.11), since these paths run for every distinct op.
_GPU_STREAM = Resource.GPU
_TP_STREAM = Resource.TP
_COPY_KINDS = (Kind.H2D, Kind.D2H)
_OPT_GPU, _MEMBOUND = Kind.OPT_GPU, Kind.MEMBOUND
_OPTIMIZER = Category.OPTIMIZER
_FOREACH = GpuAdam.FOREACH
_BACKWARD_PHASES = (Phase.BWD, Phase.RECOMPUTE)
_OPT_PHASE = Phase.OPT


@dataclass(frozen=True)
class LaunchCosts:
    """Host seconds per launched kernel in an eager training step, by phase.

    Measured (validation/harness/microbench2.py, framework_overhead) on a tiny
    model whose GPU work is negligible: nn.Module calls, autocast and autograd
    recording in forward, the autograd engine in backward. They are several times
    a bare launch, which is why small models leave the GPU idle. Checkpointed
    (recompute) steps and LoRA steps cost more per kernel and are measured apart.
    torchao's eager float8 layers launch 4.7x (tensorwise) to 5.7x (rowwise) the kernels of a bf16 layer
    at about the same host cost per launch (library_overheads.toml [torchao_float8_eager]: 675 and 831
    launches a layer against 145; per launch the plain figure times 1.08-1.09).
    """

    fwd_s: float
    bwd_s: float
    opt_s: float

    # the step variants the microbenchmarks measure (framework_overhead rows), named as there
    VARIANTS = FULL, SELECTIVE, LORA, FP8, FP32, PLAIN = (
        "bf16-amp-full-recompute", "bf16-amp-selective", "lora16-bf16", "fp8", "fp32", "bf16-amp")

    @classmethod
    def variant(cls, plan: Plan) -> str:
        if plan.recompute == Recompute.FULL:
            return cls.FULL
        if plan.recompute == Recompute.SELECTIVE:
            return cls.SELECTIVE
        if plan.lora_rank:
            return cls.LORA
        if plan.precision == Precision.FP8 and not plan.torchao_recipe:  # our harness's per-op quantisation
            return cls.FP8
        if plan.precision in (Precision.FP32, Precision.TF32):
            return cls.FP32
        return cls.PLAIN

    @classmethod
    def of(cls, hw: Hardware, cal: Calibration, plan: Plan) -> "LaunchCosts":
        if plan.compile:
            # a compiled graph launches its kernels from Inductor's wrapper, without nn.Module
            # calls, autocast or autograd recording: the measured cost of one small eager op each;
            # the optimizer is not compiled
            return cls(cal.eager_op_s, cal.eager_op_s, cls.of(hw, cal, plan.with_(compile=False)).opt_s)
        measured = cal.framework_overhead.get(cls.variant(plan))
        if measured is None:  # no framework measurement: the profile's bare launch cost
            return cls(hw.kernel_launch_s, hw.kernel_launch_s, hw.kernel_launch_s)
        # measured on the calibration's host; another host (Grace) runs the same path at its own speed
        fwd, bwd, opt = (s * hw.host_path_factor for s in measured)
        if plan.torchao_recipe:  # torchao's eager float8 layers, per launch, against the plain layer's
            fwd_ratio, bwd_ratio = torchao_eager_launch_ratio(plan.torchao_recipe)
            fwd, bwd = fwd * fwd_ratio, bwd * bwd_ratio
        return cls(fwd, bwd, opt)

    def per_kernel(self, phase: str) -> float:
        if phase in _BACKWARD_PHASES:
            return self.bwd_s
        if phase == _OPT_PHASE:
            return self.opt_s
        return self.fwd_s


@dataclass(frozen=True)
class CostModel:
    hw: Hardware
    cal: Calibration
    host_side: HostSide | None = None  # per-GPU shares of link, CPU and host memory (default: one GPU)
    launch: LaunchCosts | None = None  # host cost per kernel (default: the profile's bare launch)
    corrections: Corrections | None = None  # a calibration overlay's factors for this plan (cost/overlay.py)

    @property
    def host(self) -> HostSide:
        return self.host_side or HostSide.of(self.hw, None, self.cal)

    @property
    def hbm_ratio(self) -> float:
        """Target HBM bandwidth over the calibration GPU's."""
        return self.hw.hbm.bandwidth / self.cal.ref_hbm_Bps

    # --- GPU kernels ----------------------------------------------------------
    def gemm_time(self, m: int, n: int, k: int, dtype: str) -> float:
        table = self.cal.gemm.get(dtype) or self.cal.gemm["bf16"]
        eff = table.query((_log2(m), _log2(n), _log2(k)))
        flops = gemm_flops(m, n, k)
        t_ref = flops / (eff * self.cal.ref_peak_flops[dtype])
        # Which ceiling did the reference run hit? Scale by that ceiling's ratio.
        in_bytes = 1 if dtype == "fp8" else DTYPE_BYTES[dtype]
        out_bytes = 2 if dtype == "fp8" else DTYPE_BYTES[dtype]
        min_bytes = (m * k + k * n) * in_bytes + m * n * out_bytes
        memory_bound = min_bytes / self.cal.ref_hbm_Bps > flops / self.cal.ref_peak_flops[dtype]
        if memory_bound:
            t = t_ref / self.hbm_ratio
        else:
            t = t_ref * self.cal.ref_peak_flops[dtype] / self.hw.peak_flops[dtype]
        return max(t, self.cal.min_kernel_s)

    def batched_gemm_time(self, op: Op) -> float:
        """A batched GEMM (softmax attention's QK^T and PV: one small GEMM per head), priced as
        the GEMM of its stacked shape. The measured GEMM table has no shape this skinny (k or n
        is the head size), and its nearest points can extrapolate past what memory allows, so
        the time is held to at least the measured device-copy time of the GEMM's minimal bytes
        (op.bytes: every operand read once, the output written once) and the target's peak."""
        m, n, k = op.shape
        floor = max(self.membound_time(op.bytes, "copy"), op.flops / self.hw.peak_flops[op.dtype])
        return max(self.gemm_time(m, n, k, op.dtype), floor)

    def attention_time(self, flops: float, shape: tuple[int, ...], backward: bool, dtype: str = "bf16",
                       variant: str = "") -> float:
        """SDPA as PyTorch runs it by default: cuDNN/flash in bf16; in fp32 the memory-efficient
        kernel, or the math path for GQA (the calibration's rows carry that). `flops` is the work
        of the allowed query-key pairs (a sliding window's, graph/layer_ops.attention_call).
        variant MASKED_SDPA: the window reaches SDPA as a boolean mask (every pair computed);
        "bool_mask": an explicit boolean causal mask with k/v expanded (Hugging Face under
        torch.compile), at the measured slowdown of cuDNN's masked kernel."""
        batch, heads, kv_heads, seq, head_dim = shape[:5]
        if variant == MASKED_SDPA:
            flops *= masked_window_factor(shape)
        tables = self.cal.attention_bwd if backward else self.cal.attention_fwd
        dtype = "fp32" if dtype in ("fp32", "tf32") and "fp32" in tables else "bf16"
        eff = tables[dtype].query(attention_features(seq, batch * heads, head_dim, kv_heads != heads))
        if head_dim % SDPA_HEAD_DIM_MULTIPLE:  # no cuDNN kernel: PyTorch falls back to FlashAttention-2
            eff *= sdpa_fallback_rate()
        if variant == "bool_mask":
            eff /= sdpa_bool_mask_slowdown(head_dim, backward)
        peak = self.hw.peak_flops["fp32" if dtype == "fp32" else "bf16"]
        return max(flops / (eff * peak), self.cal.min_kernel_s)

    def membound_time(self, nbytes: float, variant: str) -> float:
        """`variant` is a measured op name, optionally with the dtype it ran in ("rmsnorm_fwd:fp32"),
        or a region torch.compile fuses ("inductor:rope")."""
        if variant.startswith(CAST):
            return self.cal.min_kernel_s + nbytes / cast_rate(variant, self.hw.hbm.bandwidth)
        if variant.startswith(INDUCTOR):
            curve = region_curve(variant[len(INDUCTOR):])
            if curve is not None:
                fixed_s, rate = curve
                return fixed_s + nbytes / (rate * self.hw.hbm.bandwidth / measured_hbm_Bps())
            variant = "copy"  # an unmeasured region streams as a device copy
        fits = self.cal.membound
        fit = fits.get(variant) or fits.get(variant.split(":")[0]) or fits["copy"]
        return fit.fixed_s + nbytes / (fit.rate * self.hbm_ratio)

    def optimizer_gpu_time(self, params: float, impl: str) -> float:
        fit = self.cal.optimizer_gpu.get(impl) or next(iter(self.cal.optimizer_gpu.values()))
        return fit.fixed_s + params / (fit.rate * self.hbm_ratio)

    # --- host side ------------------------------------------------------------
    def host_work_time(self, op: Op) -> float:
        """Fixed host work; DeepSpeed ZeRO-3's module hooks at the measured cost per module; torch's
        host cast ahead of a blocking copy up at the measured cost per parameter."""
        if op.variant == ZERO3_HOOKS:
            # measured on an x86 host; host_path_factor measured one op's dispatch and launch, not
            # DeepSpeed's Python parameter coordinator, so the hooks keep the x86 figure (assumed)
            fwd_s, bwd_s = zero3_hook_seconds()
            return op.params * (bwd_s if op.phase == Phase.BWD else fwd_s)
        if op.variant == BLOCKING_CAST:
            return op.params * blocking_cast_seconds_per_param(self.hw.cpu.page_size_kb)
        return op.seconds

    def cpu_optimizer_time(self, params: float, impl: str, tensors: tuple[float, ...] = ()) -> float:
        return self.host.cpu_optimizer_time(params, impl, tensors)

    def issue_cost(self, op: Op, cuda_graphs: bool) -> float:
        """Host seconds to issue the op: one launch per GPU kernel (replayed graphs launch cheaply),
        times a calibration overlay's host factor (fitted on a measured step) where there is one."""
        seconds = self._issue_cost(op, cuda_graphs)
        corrections = self.corrections
        return seconds * corrections.launch if corrections is not None and not cuda_graphs else seconds

    def _issue_cost(self, op: Op, cuda_graphs: bool) -> float:
        if op.resource != _GPU_STREAM:
            if op.kind in _COPY_KINDS:
                return self.hw.kernel_launch_s
            if op.resource == _TP_STREAM and not cuda_graphs:
                # each call goes through torch.distributed on the training thread (ProcessGroupNCCL:
                # stream waits, the NCCL enqueue, a work object); a captured graph replays it on the GPU
                return op.kernels * self.hw.tp_collective_call_s
            return 0.0
        if cuda_graphs:
            return op.kernels * self.hw.cuda_graph_kernel_s
        if self.launch is None:
            return op.kernels * self.hw.kernel_launch_s
        if op.kind == _OPT_GPU:
            # the measured cost is per optimizer call (Python, foreach bookkeeping);
            # the extra chunk launches of each call cost a bare launch
            calls = min(op.kernels, FOREACH_ADAMW_CALLS if op.variant == _FOREACH else FUSED_ADAMW_CALLS)
            return calls * self.launch.opt_s + (op.kernels - calls) * self.hw.kernel_launch_s
        if op.kind == _MEMBOUND and op.category == _OPTIMIZER:
            # a fused optimizer's other multi-tensor passes (Megatron's gradient norm, master copy):
            # one call each, its further chunk launches at a bare launch
            return self.launch.opt_s + max(op.kernels - 1, 0) * self.hw.kernel_launch_s
        if op.phase == _OPT_PHASE:
            # plain eager ops around the optimizer (DeepSpeed's per-tensor norm checks, casts):
            # the measured cost of a small eager op, no autograd or optimizer bookkeeping
            return op.kernels * self.cal.eager_op_s * self.hw.host_path_factor
        return op.kernels * self.launch.per_kernel(op.phase)

    def kernel_gap(self, op: Op, cuda_graphs: bool) -> float:
        """GPU idle before the op's kernels: the per-kernel front-end cost of stream launches
        (zero when replayed from a CUDA graph, whose measured per-kernel cost is the kernel's own)."""
        if cuda_graphs or op.resource != _GPU_STREAM or op.category not in KERNEL_CATEGORIES:
            return 0.0
        corrections = self.corrections
        return op.kernels * self.cal.kernel_gap_s * (corrections.kernel_gap if corrections is not None else 1.0)

    def duration(self, op: Op) -> float:
        price = _PRICE_BY_KIND.get(op.kind)
        if price is None:
            raise ValueError(f"no cost for op kind {op.kind!r} ({op.name})")
        corrections = self.corrections  # a calibration overlay's factor for the op's category
        return price(self, op) * corrections.op_factor(op) if corrections is not None else price(self, op)


def masked_window_factor(shape: tuple[int, ...]) -> float:
    """Time of a windowed attention call given as a boolean mask (PyTorch SDPA under Hugging Face)
    over that of its allowed pairs' work at the causal rate: the window's layers cost the measured
    masked-call time (every pair computed) instead of their windowed share of the causal time."""
    seq, window, share = shape[3], shape[5], shape[6]
    windowed = window_pair_fraction(seq, window)
    return (1.0 - share + share * sdpa_mask_over_causal_time()) / (1.0 - share + share * windowed)


# cuDNN's and the memory-efficient SDPA kernels take head dimensions that are multiples of 8
# (measured: validation/microbench/issue15/h100-microbench15.json "sdpa", head dim 100: both
# backends "No available kernel"; 64, 80, 96, 128 and 256 run)
SDPA_HEAD_DIM_MULTIPLE = 8


def _gemm(cm: CostModel, op: Op) -> float:
    if op.variant == "batched":
        return cm.batched_gemm_time(op)
    m, n, k = op.shape
    t = cm.gemm_time(m, n, k, op.dtype)
    return t * rowwise_gemm_factor() if op.variant == ROWWISE else t


def _copy(cm: CostModel, op: Op) -> float:
    """kernels: one cudaMemcpyAsync per bucket or tensor."""
    return cm.host.copy_time(op.bytes, op.kind, op.pinned, op.variant == "duplex", max(1, op.kernels))


def _um_migrate(cm: CostModel, op: Op) -> float:
    if op.variant == "in_place":
        return cm.host.um_in_place_time(op.bytes)
    return cm.host.um_fault_time(op.bytes)


# How each kind of op is priced (a table rather than a chain of comparisons: see _GPU_STREAM).
_PRICE_BY_KIND: dict[Kind, Callable[[CostModel, Op], float]] = {
    Kind.GEMM: _gemm,
    Kind.ATTN_FWD: lambda cm, op: cm.attention_time(op.flops, op.shape, backward=False, dtype=op.dtype,
                                                    variant=op.variant),
    Kind.ATTN_BWD: lambda cm, op: cm.attention_time(op.flops, op.shape, backward=True, dtype=op.dtype,
                                                    variant=op.variant),
    Kind.MEMBOUND: lambda cm, op: cm.membound_time(op.bytes, op.variant),
    Kind.OPT_GPU: lambda cm, op: cm.optimizer_gpu_time(op.params, op.variant),
    Kind.OPT_CPU: lambda cm, op: cm.cpu_optimizer_time(op.params, op.variant, op.shape),
    Kind.H2D: _copy,
    Kind.D2H: _copy,
    Kind.CPU_MEM: lambda cm, op: cm.host.cpu_bytes_time(op.bytes, op.variant == FOREACH_NORM),
    Kind.UM_MIGRATE: _um_migrate,
    Kind.HOST_WORK: lambda cm, op: cm.host_work_time(op),
}


def _log2(x: float) -> float:
    import math

    return math.log2(max(x, 1))
