"""Offload schedules: where offloaded state lives, how it crosses the host link, where its work runs.

A step graph without offload (graph/step.py) is rewritten: copies are inserted
after the ops that produce what they move and before the ops that need it, CPU
work is inserted where the schedule runs it, and the optimizer is replaced.
Three schedules (plan.OffloadSchedule):

- sync: what plain PyTorch code does (validation/harness/train_step.py):
  `save_on_cpu` activations and, after backward, every gradient copied to
  pinned host memory on the compute stream, `torch.optim.AdamW` on the CPU,
  parameters copied back; nothing overlaps. With parameters offloaded it is
  FSDP's CPUOffload: fp32 flat parameters fetched per layer and cast on the
  GPU, fp32 gradients sent down per layer, the CPU AdamW after backward.
- overlapped: DeepSpeed ZeRO-Offload / ZeRO-Infinity. At ZeRO stage 1/2
  (DeepSpeed 0.19, overlap_comm false by default) each layer's gradients are
  cast to fp32 on the GPU and copied into a pinned fp32 buffer on the stream
  that made them; after backward the training thread computes the global norm,
  clips, runs DeepSpeedCPUAdam over the partition, narrows it to 16 bits and
  copies it up, pass by pass (as its profiler trace shows,
  validation/measured_libraries). Otherwise (ZeRO-3) gradients stream to the
  host in buckets on the D2H copy engine while backward runs; the CPU-Adam
  waits for all of them, then updates layer by layer, each layer's bf16
  parameters copied back as soon as they are ready. Parameters (ZeRO-Infinity)
  are prefetched one layer ahead; activations leave on the D2H engine and are
  prefetched back one layer ahead of their backward.
- superoffload (Lian et al. 2025, DeepSpeed blog "SuperOffload"):
  speculation-then-validation lets the CPU-Adam update each bucket as soon as
  it arrives, overlapping backward; the last (1 - offload_ratio) of the
  gradients in backward order stay on the GPU with their optimizer states
  (the "tail buckets"), so the step does not end waiting for the CPU; buckets
  are sized to saturate the link; each cast (bf16 <-> fp32) runs where it is
  cheapest, GPU before the copy or CPU after it.

With offload_ratio < 1 the other schedules split the optimizer the same way
(DeepSpeed ZeRO-Offload++ "Twin-Flow" ratio).

The same rewrite serves a multi-GPU rank's micro-batch (graph/parallel.py), which
says through `RankHooks` what a whole-step graph need not: where its gradients
become ready to leave (after each bucket's reduce-scatter or all-reduce, as
ZeRO-Offload copies each rank's reduced partition down), which ZeRO-3
all-gather consumes each layer's fetched parameter shard (ZeRO-Infinity: the
rank's 1/dp shard comes over the host link, then the gather), and whether the
optimizer follows. Each rank offloads only its shard (1/dp of the states under
ZeRO >= 1); HostSide prices its share of the host (cost/hostlink.py).
"""

from __future__ import annotations

from collections import defaultdict

from ghsim.graph.offload.ops import copy_op, cpu_adam, cpu_bytes, gpu_cast
from ghsim.graph.offload.rewrite import BWD, FWD, New, Rewriter, Run, find_runs
from ghsim.graph.offload.schedules import _activation_copies, _optimizer, _parameter_fetches, _run_sources
from ghsim.graph.offload.setup import (
    BUCKET_LATENCY_SHARE,
    GradSource,
    OffloadSetup,
    RankHooks,
    StepFacts,
    Widths,
    check_offload,
    deepspeed_sub_group_ratio,
    resolve,
    resolve_schedule,
    saved_bytes_for,
    superoffload_whole_sub_groups,
)
from ghsim.graph.ops import Op, OpGraph
from ghsim.graph.offload.save_on_cpu import _sync_loss_offload, save_on_cpu_layer, save_on_cpu_loss, sync_activation_offload
from ghsim.model import ModelSpec
from ghsim.plan import OffloadSchedule, Plan, Recompute

__all__ = [  # the offload package's names, wherever they live
    "BUCKET_LATENCY_SHARE", "BWD", "FWD", "GradSource", "New", "OffloadSetup",
    "RankHooks", "Rewriter", "Run", "StepFacts", "Widths", "apply_offload_mapped", "check_offload", "copy_op",
    "cpu_adam", "cpu_bytes", "deepspeed_sub_group_ratio", "find_runs", "gpu_cast", "resolve", "resolve_schedule",
    "save_on_cpu_layer", "save_on_cpu_loss", "saved_bytes_for", "superoffload_whole_sub_groups",
    "sync_activation_offload",
]


def apply_offload_mapped(graph: OpGraph, model: ModelSpec, plan: Plan, facts: StepFacts, widths: Widths,
                         hooks: RankHooks | None = None) -> tuple[OpGraph, list[int]]:
    """The graph with the plan's offload schedule woven in, and where each op of `graph` moved to
    (for callers that hold op indices, such as a micro-batch's end of forward). `widths`: what
    crosses the link and where the casts run (cost/offload_policy.py). Works on any graph whose ops carry
    phases (fwd, bwd, recompute) and layer numbers; collectives on other streams stay put.
    Without `hooks` the graph is a whole step on one GPU: gradients leave after the
    backward run that makes them, and the optimizer follows the last micro-batch."""
    setup = resolve(plan)
    rw = Rewriter(graph)
    runs = find_runs(graph)
    sched = setup.schedule
    overlapped = sched != OffloadSchedule.SYNC

    def new(op: Op, deps=(), layer: int = -1, mb: int = 0) -> New:
        """An insertion of `op` (the same op object however many times it is inserted)."""
        return New(op, list(deps), layer, mb)

    by_mb: dict[int, dict[str, list[Run]]] = defaultdict(lambda: {FWD: [], BWD: []})
    for run in runs:
        by_mb[run.mb][run.direction].append(run)
    grad_width = facts.grad_width
    if not grad_width:
        grads_on_gpu = sum((graph.ops[i].hbm_by_tag or {}).get("grads", 0.0) for i in range(len(graph.ops))
                           if graph.microbatch[i] == 0 and (graph.ops[i].hbm_by_tag or {}).get("grads", 0.0) > 0)
        grad_width = grads_on_gpu / facts.trainable if facts.trainable else 4.0

    # which copies overlap the other direction (they then share PCIe's bidirectional cap)
    duplex_fwd = overlapped and setup.params and setup.activations
    duplex_bwd = overlapped and (setup.params or setup.activations
                                 or sched == OffloadSchedule.SUPEROFFLOAD) and setup.optimizer

    if setup.activations and overlapped:
        _activation_copies(rw, by_mb, facts, setup, new, duplex_fwd, duplex_bwd)
    elif setup.activations and plan.recompute != Recompute.FULL and (hooks is None or hooks.loss):
        _sync_loss_offload(rw, by_mb, model, plan, new)
    if setup.params:
        _parameter_fetches(rw, by_mb, facts, setup, new, duplex_fwd, duplex_bwd, hooks.gathers if hooks else {})
    if setup.optimizer:
        sources = list(hooks.grad_sources) if hooks else _run_sources(graph, by_mb, grad_width)
        _optimizer(rw, sources, plan, facts, setup, new, grad_width, duplex_bwd, widths,
                   hooks.steps if hooks else True)
    out = rw.build()
    return out, rw.mapping
