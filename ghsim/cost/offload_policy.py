"""Offload decisions that depend on rates: what crosses the host link, where the casts run,
and how large SuperOffload's link-sized buckets are. The graph builder takes the answer
(graph/offload.Widths) as data; it prices nothing itself."""

from __future__ import annotations

from ghsim.cost.compute import CostModel
from ghsim.graph import ops as K
from ghsim.graph.ops import Phase, Resource
from ghsim.graph.offload import (
    BUCKET_LATENCY_SHARE,
    OffloadSetup,
    Widths,
    copy_op,
    cpu_adam,
    cpu_bytes,
    gpu_cast,
)

_PROBE = 1e9  # parameters: per-parameter costs at a size where latency does not matter


def transfer_widths(cost: CostModel, setup: OffloadSetup, grad_width: float, gpu_param_width: int,
                    gpu_seconds_per_param: float) -> Widths:
    """What crosses the link and where the casts run.

    Gradients leave in the GPU's width; a 2-byte gradient is widened to fp32 for
    the optimizer, and updated fp32 parameters are narrowed to the GPU's 2-byte
    working width. ZeRO-Offload casts on the CPU (low-precision transfers).
    SuperOffload places each cast where it is cheapest: per parameter, the
    GPU (backward plus any GPU casts, `gpu_seconds_per_param`), the CPU (Adam plus
    any CPU casts) and each link direction form a pipeline, and the placement with
    the shortest slowest stage wins (on C2C: cast on the GPU and move fp32; on
    PCIe: move bf16 and cast on the CPU).
    """
    price, probe = cost.duration, _PROBE
    gw = 2 if grad_width < 3 else 4
    pw = gpu_param_width
    d2h = {w: price(copy_op("probe", K.D2H, probe * w, Phase.BWD, setup, Resource.D2H)) / probe for w in (2, 4)}
    h2d = {w: price(copy_op("probe", K.H2D, probe * w, Phase.OPT, setup, Resource.H2D)) / probe for w in (2, 4)}
    bucket_d2h = _link_bucket(price(copy_op("probe", K.D2H, 1.0, Phase.BWD, setup, Resource.D2H)), 4 / max(d2h[4], 1e-30))
    bucket_h2d = _link_bucket(price(copy_op("probe", K.H2D, 1.0, Phase.OPT, setup, Resource.H2D)), 4 / max(h2d[4], 1e-30))
    if setup.fsdp_like:  # FSDP casts the reduced gradient to the fp32 parameter dtype before offloading
        return Widths(4, 4, gw == 2, False, False, False, bucket_d2h, bucket_h2d)
    fetched = setup.params  # ZeRO-Infinity: no copy back; the CPU writes the bf16 host copy instead
    g_gpu = p_gpu = False  # ZeRO-Offload: casts on the CPU
    if setup.serial_grad_copies:  # DeepSpeed 0.19 stage 1/2: copy_() into the fp32 pinned buffer casts on the GPU
        g_gpu = gw == 2
    if setup.grad_round_trip:
        # DeepSpeed 0.19 stage 3, with or without offload_param: each gradient partition is widened
        # on the GPU and copied into the fp32 host gradient (stage3.py _offload_grad_partition_at_
        # boundary; its traces: 12.85 GB fp32 Device -> Pinned for 3.2e9 parameters)
        g_gpu = gw == 2
    if setup.pageable_param_return:
        # DeepSpeed 0.19 stage 3: gradients widened on the GPU and copied down in fp32; each updated
        # fp32 sub-group copied into the 16-bit GPU partition by a blocking copy_, which casts on the
        # CPU and copies 16 bits up from pageable memory (its traces: aten::to on the training
        # thread, then 6.4 GB Pageable -> Device for 3.2e9 parameters)
        g_gpu = gw == 2
    if setup.speculative:
        gpu_cast_s = price(gpu_cast("probe", probe, Phase.BWD)) / probe
        cpu_cast_s = price(cpu_bytes("probe", probe * 6, Phase.BWD, False)) / probe
        adam = price(cpu_adam("probe", probe, setup, False)) / probe
        options = []
        for g in ((False, True) if gw == 2 else (False,)):
            for p in ((False, True) if pw == 2 and not fetched else (False,)):
                gpu = gpu_seconds_per_param + gpu_cast_s * (g + p)
                cpu = adam + cpu_cast_s * ((gw == 2 and not g) + ((pw == 2 or fetched) and not p))
                down = d2h[4 if (g or gw == 4) else 2]
                up = 0.0 if fetched else h2d[4 if (p or pw == 4) else 2]
                options.append((max(gpu, cpu, down, up), g, p))
        _, g_gpu, p_gpu = min(options, key=lambda o: o[0])
    grad_cpu_cast = gw == 2 and not g_gpu
    param_cpu_cast = (pw == 2 or fetched) and not p_gpu
    g_link = 4 if (g_gpu or gw == 4) else 2
    p_link = 2 if fetched else (4 if (p_gpu or pw == 4) else 2)
    return Widths(g_link, p_link, g_gpu, grad_cpu_cast, param_cpu_cast, p_gpu, bucket_d2h, bucket_h2d)


def _link_bucket(latency: float, rate: float) -> float:
    """Bytes per copy such that the per-copy latency costs at most BUCKET_LATENCY_SHARE of it."""
    return max(latency * rate * (1 - BUCKET_LATENCY_SHARE) / BUCKET_LATENCY_SHARE, 1.0)
