"""StepReport: what one simulated step costs, and its renderings (table, JSON, Chrome trace)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from ghsim.graph.ops import KERNEL_CATEGORIES, Category, Op
from ghsim.sim.engine import Schedule
from ghsim.sim.memory import TierPeak

GiB = 1024**3


@dataclass(frozen=True)
class Timeline:
    ops: list[Op]
    resources: list[str]
    schedule: Schedule
    deps: list[tuple[int, ...]]  # absolute, per op
    layer: list[int]  # decoder layer of each op (-1: none)
    microbatch: list[int]
    lead_gap: np.ndarray | None = None  # per op: idle stream time before its kernels start


@dataclass(frozen=True)
class StepReport:
    step_time_s: float
    tokens_per_step: int
    model_flops_per_step: float
    peak_flops_per_gpu: float
    gpus: int
    gpu_utilization: float
    time_breakdown_s: dict[str, float]
    hbm: TierPeak
    host: TierPeak
    hbm_capacity: float
    host_capacity: float
    fit_problems: tuple[str, ...]
    notes: tuple[str, ...]
    plan: dict[str, Any]
    model: dict[str, Any]
    hardware: dict[str, Any]
    timeline: Timeline | None = field(default=None, repr=False, compare=False)
    extra: dict[str, Any] = field(default_factory=dict)  # sections some plans add (offload, unified_memory)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def mfu(self) -> float:
        return self.model_flops_per_step / (self.step_time_s * self.gpus * self.peak_flops_per_gpu)

    @property
    def fits(self) -> bool:
        return not self.fit_problems

    @property
    def step_time_interval_s(self) -> tuple[float, float] | None:
        """Where the measured step should lie (report/intervals.py); None without the table."""
        from ghsim.report.intervals import step_interval
        return step_interval(self.step_time_s, self.gpu_utilization)

    @property
    def hbm_peak_interval_bytes(self) -> tuple[float, float] | None:
        from ghsim.report.intervals import peak_interval
        return peak_interval(self.hbm.peak_bytes)

    def to_dict(self) -> dict[str, Any]:
        step_iv, hbm_iv = self.step_time_interval_s, self.hbm_peak_interval_bytes
        return {
            "step_time_s": self.step_time_s,
            "step_time_interval_s": list(step_iv) if step_iv else None,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_step": self.tokens_per_step,
            "mfu": self.mfu,
            "gpu_utilization": self.gpu_utilization,
            "fits": self.fits,
            "fit_problems": list(self.fit_problems),
            "memory": {
                "hbm_peak_bytes": self.hbm.peak_bytes,
                "hbm_peak_interval_bytes": list(hbm_iv) if hbm_iv else None,
                "hbm_capacity_bytes": self.hbm_capacity,
                "host_peak_bytes": self.host.peak_bytes,
                "host_capacity_bytes": self.host_capacity,
                "breakdown": {k: float(v) for k, v in self.hbm.breakdown.items()},
                "host_breakdown": {k: float(v) for k, v in self.host.breakdown.items()},
            },
            "time_breakdown_s": dict(self.time_breakdown_s),
            "notes": list(self.notes),
            "plan": self.plan,
            "model": self.model,
            "hardware": self.hardware,
            **self.extra,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def mfu_dtype(precision: str) -> str:
    """The dense peak MFU is quoted against: tf32 and fp32 plans their own, every 16/8-bit plan bf16's."""
    return precision if precision in ("tf32", "fp32") else "bf16"


class Stall(StrEnum):
    """Time-breakdown keys for compute-stream time that is not a kernel category: page migrations
    on the stream, and what the stream waited for in its gaps."""

    UM_MIGRATION = "um_migration"  # unified-memory pages migrating in (the stream stalls)
    WAIT_CPU = "wait_cpu"  # host cores: an offloaded optimizer, the data loader
    WAIT_TRANSFER = "wait_transfer"  # a host<->device copy
    WAIT_HOST_LAUNCH = "wait_host_launch"  # the host had not issued the kernel yet
    WAIT_OTHER = "wait_other"
    WAIT_KERNEL_GAPS = "wait_kernel_gaps"  # launch gaps before short kernels
    PIPELINE_BUBBLE = "pipeline_bubble"  # a pipeline stage waiting for its neighbours


# Where a compute stream's time goes: its kernels by category, copies and page migrations on it,
# and what it waited for (a multi-GPU stage adds its pipeline bubbles).
BREAKDOWN_KEYS = KERNEL_CATEGORIES + (Category.MEMCPY, Stall.UM_MIGRATION, Stall.WAIT_CPU, Stall.WAIT_TRANSFER,
                                      Stall.WAIT_HOST_LAUNCH, Stall.WAIT_OTHER, Stall.WAIT_KERNEL_GAPS)


def model_flops(model, plan) -> float:
    """Model FLOPs of one step (no recompute): 6 per active parameter per token plus attention.

    With LoRA the frozen weights need no weight gradients: 4 per parameter per
    token (forward and input gradients), and the adapters are negligible.
    """
    tokens = plan.tokens_per_step
    matmul_params = model.active_params_per_token - model.embedding_params  # the embedding is a lookup
    attn = 12 * model.num_layers * plan.seq * model.q_dim / 2  # causal: half of QK^T and PV, x3 for bwd
    per_param = 4 if plan.lora_rank else 6
    return tokens * (per_param * matmul_params + attn)


def step_fields(model, hw, plan, model_flops_per_step: float) -> dict[str, Any]:
    """The StepReport fields that follow from the inputs alone (both simulators share them)."""
    return {
        "tokens_per_step": plan.tokens_per_step,
        "model_flops_per_step": model_flops_per_step,
        "peak_flops_per_gpu": hw.peak_flops[mfu_dtype(plan.precision.value)],
        "gpus": plan.gpus,
        "hbm_capacity": hw.hbm.capacity_bytes,
        "host_capacity": hw.host.capacity_bytes,
        "model": model.to_dict(),
        "hardware": hw.to_dict(),
        "plan": {**plan.to_dict(), "flags": plan.flags()},
    }


def fit_problems(hbm: TierPeak, host: TierPeak, hw, where: str = "", check_hbm: bool = True) -> tuple[str, ...]:
    """What does not fit: an HBM peak over capacity (with its three largest parts; `where`, e.g.
    " on pipeline stage 1"), a host peak over the node's memory. Under unified memory the HBM
    cannot overflow (`check_hbm` off): pages spill to the host instead."""
    problems = []
    if check_hbm and hbm.peak_bytes > hw.hbm.capacity_bytes:
        top = sorted(hbm.breakdown.items(), key=lambda kv: -kv[1])[:3]
        parts = " + ".join(f"{b / 1e9:.1f} GB {k}" for k, b in top)
        problems.append(f"HBM peak{where} {hbm.peak_bytes / 1e9:.1f} GB > {hw.hbm.capacity_bytes / 1e9:.0f} GB "
                        f"({parts} ...)")
    if host.peak_bytes > hw.host.capacity_bytes:
        problems.append(f"host peak {host.peak_bytes / 1e9:.1f} GB > {hw.host.capacity_bytes / 1e9:.0f} GB")
    return tuple(problems)


def _interval_note() -> str:
    from ghsim.report.intervals import load_model, note
    return f"intervals        {note(load_model())}"


def _interval_text(iv: tuple[float, float] | None, scale: float, unit: str, digits: int = 1) -> str:
    """'   (interval 190.6-229.7 ms)': where a measurement should fall; nothing without the interval table."""
    if iv is None:
        return ""
    return f"   (interval {iv[0] * scale:.{digits}f}-{iv[1] * scale:.{digits}f} {unit})"


def render_table(r: StepReport) -> str:
    lines = [
        f"model      {r.model['name']} ({r.model['total_params'] / 1e9:.2f}B params)",
        f"hardware   {r.hardware['name']}: {r.hardware['description']}",
        f"plan       {r.plan['flags']}",
        "",
        f"step time        {r.step_time_s * 1e3:10.1f} ms" + _interval_text(r.step_time_interval_s, 1e3, "ms"),
        f"tokens/s         {r.tokens_per_s:10.0f}",
        f"MFU              {r.mfu * 100:10.1f} %",
        f"GPU utilization  {r.gpu_utilization * 100:10.1f} %   (kernel-busy share of the step)",
        f"HBM peak         {r.hbm.peak_bytes / 1e9:10.2f} GB of {r.hbm_capacity / 1e9:.1f} GB per GPU"
        + _interval_text(r.hbm_peak_interval_bytes, 1e-9, "GB", 2),
        f"host peak        {r.host.peak_bytes / 1e9:10.2f} GB of {r.host_capacity / 1e9:.0f} GB per node",
        f"fits             {'yes' if r.fits else 'NO: ' + '; '.join(r.fit_problems)}",
        *([_interval_note()] if r.step_time_interval_s else []),
        "",
        "where the step goes                 ms      share",
    ]
    for k, v in sorted(r.time_breakdown_s.items(), key=lambda kv: -kv[1]):
        if v > 0:
            lines.append(f"  {k:<28}{v * 1e3:10.2f} {v / r.step_time_s * 100:9.1f} %")
    lines += ["", "HBM at the peak                      GB"]
    for k, v in sorted(r.hbm.breakdown.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {k:<28}{v / 1e9:10.2f}")
    if r.host.breakdown:
        lines += ["", "host memory at its peak (node)       GB"]
        for k, v in sorted(r.host.breakdown.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {k:<28}{v / 1e9:10.2f}")
    for name, section in r.extra.items():  # one line per added section that summarizes itself
        if isinstance(section, dict) and section.get("summary"):
            lines.append(f"{name}: {section['summary']}")
    for n in r.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def chrome_trace(r: StepReport) -> dict[str, Any]:
    """The simulated timeline as a Chrome trace (Perfetto): one track per resource,
    per-layer forward/backward ranges on their own track, memory as a counter."""
    assert r.timeline is not None
    tl = r.timeline
    events: list[dict[str, Any]] = []
    tids = {name: i + 1 for i, name in enumerate(tl.resources)}
    tids["host issue"] = len(tids) + 1
    tids["layers"] = len(tids) + 1
    for name, tid in tids.items():
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}})
    ranges: dict[tuple[int, str, int], list[float]] = {}
    for i, op in enumerate(tl.ops):
        s, e = tl.schedule.start[i] * 1e6, tl.schedule.end[i] * 1e6
        if e > s:
            args = {"layer": tl.layer[i], "phase": op.phase, "flops": op.flops, "bytes": op.bytes}
            if tl.lead_gap is not None and tl.lead_gap[i] > 0:  # the idle launch gap before its kernels
                args["launch_gap_us"] = float(tl.lead_gap[i]) * 1e6
            if op.split:  # a composite op's kernels by category (e.g. an eager RMSNorm's elementwise passes)
                args["split"] = {str(c): part for c, part in op.split}
            events.append({"ph": "X", "name": op.name, "cat": op.category, "pid": 1, "tid": tids[op.resource],
                           "ts": s, "dur": e - s, "args": args})
        if tl.layer[i] >= 0:
            key = (tl.microbatch[i], op.phase, tl.layer[i])
            span = ranges.setdefault(key, [s, e])
            span[0], span[1] = min(span[0], s), max(span[1], e)
    for (mb, phase, layer), (s, e) in sorted(ranges.items(), key=lambda kv: kv[1][0]):
        events.append({"ph": "X", "name": f"layer {layer} {phase}", "cat": "layer", "pid": 1, "tid": tids["layers"],
                       "ts": s, "dur": e - s, "args": {"microbatch": mb}})
    if r.hbm.curve is not None:
        for i in range(0, len(tl.ops), max(1, len(tl.ops) // 2000)):
            events.append({"ph": "C", "name": "HBM allocated (GB)", "pid": 1, "ts": tl.schedule.issue[i] * 1e6,
                           "args": {"GB": float(r.hbm.curve[i]) / 1e9}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "ghsim", "step_time_s": r.step_time_s, "model": r.model.get("name"),
                          "hardware": r.hardware.get("name"), "plan": r.plan.get("flags")}}
