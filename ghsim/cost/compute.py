"""Op durations: from each op's work and the hardware's calibrated efficiencies.

GEMMs use the measured efficiency at the nearest measured shapes (not one flat
MFU); attention uses measured flash-attention efficiency by sequence and head
count; memory-bound ops use the measured fixed time and achieved bandwidth of
the same eager PyTorch op; copies use the host link's rate for their direction
and buffer kind; the CPU optimizer uses the host's measured AdamW rate.

Measured efficiencies carry over to another part of the same die by scaling:
compute-bound work with the ratio of peak FLOP/s, memory-bound work with the
ratio of HBM bandwidth (an H100 measurement priced for GH200's 4 TB/s HBM3).
"""

from __future__ import annotations

from dataclasses import dataclass

from ghsim.cost.calibration import Calibration
from ghsim.cost.flops import gemm_flops
from ghsim.cost.hostlink import TORCH_CPU_ADAM, HostSide
from ghsim.graph import ops as K
from ghsim.graph.ops import Op
from ghsim.hardware import Hardware

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class CostModel:
    hw: Hardware
    cal: Calibration
    host_side: HostSide | None = None  # per-GPU shares of link, CPU and host memory (default: one GPU)

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

    def attention_time(self, flops: float, shape: tuple[int, ...], backward: bool) -> float:
        batch, heads, _kv_heads, seq, head_dim = shape
        table = self.cal.attention_bwd if backward else self.cal.attention_fwd
        eff = table.query((_log2(seq), _log2(batch * heads), head_dim / 64))
        return max(flops / (eff * self.hw.peak_flops["bf16"]), self.cal.min_kernel_s)

    def membound_time(self, nbytes: float, variant: str) -> float:
        """`variant` is a measured op name, optionally with the dtype it ran in ("rmsnorm_fwd:fp32")."""
        fits = self.cal.membound
        fit = fits.get(variant) or fits.get(variant.split(":")[0]) or fits["copy"]
        return fit.fixed_s + nbytes / (fit.rate * self.hbm_ratio)

    def optimizer_gpu_time(self, params: float, impl: str) -> float:
        fit = self.cal.optimizer_gpu.get(impl) or next(iter(self.cal.optimizer_gpu.values()))
        return fit.fixed_s + params / (fit.rate * self.hbm_ratio)

    # --- host side ------------------------------------------------------------
    def copy_time(self, nbytes: float, direction: str, pinned: bool) -> float:
        return self.host.copy_time(nbytes, direction, pinned)

    def cpu_optimizer_time(self, params: float, impl: str = "") -> float:
        return self.host.cpu_optimizer_time(params, impl or TORCH_CPU_ADAM)

    def issue_cost(self, op: Op, cuda_graphs: bool) -> float:
        """Host seconds to issue the op: one launch per GPU kernel (replayed graphs launch cheaply)."""
        if op.resource not in ("gpu",):
            return self.hw.kernel_launch_s if op.kind in (K.H2D, K.D2H) else 0.0
        per_kernel = self.hw.cuda_graph_kernel_s if cuda_graphs else self.hw.kernel_launch_s
        return op.kernels * per_kernel

    def duration(self, op: Op) -> float:
        kind = op.kind
        if kind == K.GEMM:
            m, n, k = op.shape
            return self.gemm_time(m, n, k, op.dtype)
        if kind == K.ATTN_FWD:
            return self.attention_time(op.flops, op.shape, backward=False)
        if kind == K.ATTN_BWD:
            return self.attention_time(op.flops, op.shape, backward=True)
        if kind == K.MEMBOUND:
            return self.membound_time(op.bytes, op.variant)
        if kind == K.OPT_GPU:
            return self.optimizer_gpu_time(op.params, op.variant)
        if kind == K.OPT_CPU:
            return self.cpu_optimizer_time(op.params, op.variant)
        if kind in (K.H2D, K.D2H):  # kernels: one cudaMemcpyAsync per bucket or tensor
            return self.host.copy_time(op.bytes, kind, op.pinned, op.variant == "duplex", max(1, op.kernels))
        if kind == K.CPU_MEM:
            return self.host.cpu_bytes_time(op.bytes)
        if kind == K.UM_MIGRATE:
            if op.variant == "in_place":
                return self.host.um_in_place_time(op.bytes)
            return self.host.um_fault_time(op.bytes)
        if kind == K.HOST_WORK:
            return op.seconds
        raise ValueError(f"no cost for op kind {kind!r} ({op.name})")


def _log2(x: float) -> float:
    import math

    return math.log2(max(x, 1))
