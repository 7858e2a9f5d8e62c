"""Read a DeepSpeed ds_config.json into plan fields, so an existing config can be simulated.

Defaults are DeepSpeed 0.19.8's (deepspeed/runtime/zero/config.py, offload_config.py).
`ds_config_notes` says, one line each, which keys ghsim read as something else ("auto"
values), left at DeepSpeed's default, or does not model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ghsim.errors import GhsimError
from ghsim.tomlio import read_json

# offload_config.py: DeepSpeedZeroOffloadOptimizerConfig.pin_memory / ...ParamConfig.pin_memory
DEFAULT_PIN_MEMORY = True
# optimizers DeepSpeed runs as Adam-family (deepspeed/runtime/config.py: ADAM_OPTIMIZER,
# ADAMW_OPTIMIZER, FUSED_ADAM, CPU_ADAM ...); ghsim models AdamW's states and traffic
ADAM_FAMILY = {"adam", "adamw", "fusedadam", "cpuadam", "deepspeedcpuadam", "onebitadam", "zerooneadam"}
# keys that change DeepSpeed's schedule or buffers but that ghsim prices at DeepSpeed's default
NOT_MODELED = ("overlap_comm", "allgather_bucket_size", "contiguous_gradients", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
               "stage3_max_reuse_distance", "round_robin_gradients")


def _int(d: dict[str, Any], key: str, where: str, notes: list[str]) -> int | None:
    v = d.get(key)
    if v == "auto":
        notes.append(f"{key} = \"auto\": taken from the plan flags (the Hugging Face Trainer fills it in)")
        return None
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise GhsimError(f"{where}: '{key}' must be a positive integer or \"auto\", got {v!r}")
    return v


def _section(d: dict[str, Any], key: str, where: str) -> dict[str, Any] | None:
    section = d.get(key)
    if section is not None and not isinstance(section, dict):
        raise GhsimError(f"{where}: {key} must be an object, got {section!r}")
    return section


def _number(d: dict[str, Any], key: str, where: str, low: float, high: float) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
        raise GhsimError(f"{where}: {key} must be a number in [{low:g}, {high:g}], got {v!r}")
    return float(v)


def _offload(zero: dict[str, Any], out: dict[str, Any], where: str, notes: list[str]) -> None:
    """offload_optimizer / offload_param: what moves, pinned or not, SuperOffload's split."""
    offload, pinned = [], []
    for key, target in (("offload_optimizer", "optimizer"), ("offload_param", "params")):
        section = _section(zero, key, f"{where}: zero_optimization")
        device = section.get("device", "none") if section else "none"
        if device not in ("cpu", "nvme", "none", None):
            raise GhsimError(f"{where}: zero_optimization.{key}.device must be cpu, nvme or none, got {device!r}")
        if device == "nvme":
            raise GhsimError(f"{where}: NVMe offload ({key}.device = nvme) is not modeled")
        if device != "cpu":
            continue
        offload.append(target)
        pin = section.get("pin_memory", DEFAULT_PIN_MEMORY)
        if not isinstance(pin, bool):
            raise GhsimError(f"{where}: zero_optimization.{key}.pin_memory must be true or false, got {pin!r}")
        pinned.append(pin)
    if "optimizer" in offload:
        offload.append("grads")  # ZeRO-Offload moves gradients to the CPU with the optimizer
        opt = zero["offload_optimizer"]
        ratio = _number(opt, "ratio", f"{where}: offload_optimizer", 0.0, 1.0)
        if ratio is not None:
            out["offload_ratio"] = ratio
        if opt.get("super_offload"):  # DeepSpeed >= 0.18: SuperOffload's schedule
            if zero.get("stage") != 3:
                raise GhsimError(f"{where}: offload_optimizer.super_offload needs zero_optimization.stage 3")
            out["offload_schedule"] = "superoffload"
            share = _number(opt, "cpuadam_cores_perc", f"{where}: offload_optimizer", 0.01, 1.0)
            if share is not None:
                out["cpu_cores_share"] = share
        elif "cpuadam_cores_perc" in opt:
            notes.append("offload_optimizer.cpuadam_cores_perc applies only with super_offload: ignored")
    if pinned:
        out["offload_pinned"] = all(pinned)
    out["offload"] = offload


def _precision(ds: dict[str, Any], out: dict[str, Any], where: str, notes: list[str]) -> None:
    enabled = []
    for key in ("bf16", "fp16"):
        section = _section(ds, key, where)
        value = section.get("enabled", False) if section else False
        if value == "auto":
            notes.append(f"{key}.enabled = \"auto\": read as enabled (the Hugging Face Trainer's flag decides)")
        if value not in (False, None):
            out["precision"] = key
            enabled.append(key)
    if len(enabled) > 1:
        raise GhsimError(f"{where}: bf16 and fp16 cannot both be enabled")
    out.setdefault("precision", "fp32")


def _optimizer(ds: dict[str, Any], where: str) -> None:
    section = _section(ds, "optimizer", where)
    kind = section.get("type") if section else None
    if kind is not None and str(kind).lower().replace("_", "") not in ADAM_FAMILY:
        raise GhsimError(f"{where}: optimizer type {kind!r} is not modeled (ghsim models Adam/AdamW only)")


def _batches(ds: dict[str, Any], out: dict[str, Any], where: str, notes: list[str]) -> None:
    mb = _int(ds, "train_micro_batch_size_per_gpu", where, notes)
    if mb:
        out["micro_batch"] = mb
    gb = _int(ds, "train_batch_size", where, notes)
    ga = _int(ds, "gradient_accumulation_steps", where, notes)
    if gb:
        # DeepSpeed requires train_batch_size = micro-batch x accumulation x data-parallel ranks
        if mb and ga and gb % (mb * ga):
            raise GhsimError(f"{where}: train_batch_size {gb} is not train_micro_batch_size_per_gpu {mb} x "
                             f"gradient_accumulation_steps {ga} x ranks")
        out["global_batch"] = gb
    elif ga:
        out["grad_accum"] = ga  # resolved against the plan's data-parallel ranks (gpus / (tp x pp))


def _activation_checkpointing(ds: dict[str, Any], out: dict[str, Any], where: str, notes: list[str]) -> None:
    ac = _section(ds, "activation_checkpointing", where)
    if not ac:
        return
    # DeepSpeed's activation checkpointing applies only to models that call
    # deepspeed.checkpointing.checkpoint (Megatron-DeepSpeed); HF models use their own flag
    notes.append("activation_checkpointing: acts only where the model calls deepspeed.checkpointing; "
                 "read as full recompute per layer (pass --recompute to say otherwise)")
    out["recompute"] = "full"
    if ac.get("cpu_checkpointing"):
        out.setdefault("offload", []).append("activations")


def plan_dict_from_ds_config(path: Path) -> dict[str, Any]:
    """Plan fields a ds_config implies: ZeRO stage and offload, precision, batch sizes."""
    return read_ds_config(path)[0]


def read_ds_config(path: Path) -> tuple[dict[str, Any], list[str]]:
    """Plan fields a ds_config implies, and one-line notes on what was read as something else."""
    where = str(path)
    ds = read_json(path)
    if not isinstance(ds, dict):
        raise GhsimError(f"{where}: a DeepSpeed config must be a JSON object")
    notes: list[str] = []
    out: dict[str, Any] = {"framework": "deepspeed"}
    zero = _section(ds, "zero_optimization", where) or {}
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise GhsimError(f"{where}: zero_optimization.stage must be 0-3, got {stage!r}")
    out["zero"] = stage
    _offload(zero, out, where, notes)
    for key in ("reduce_bucket_size", "sub_group_size"):
        size = _number(zero, key, f"{where}: zero_optimization", 1.0, float("inf"))
        if size is not None:
            out[key] = size
    if zero.get("stage3_max_live_parameters") == "auto":  # no Trainer rule fills it: DeepSpeed's default
        notes.append("stage3_max_live_parameters = \"auto\": read as DeepSpeed's default, 1e9")
    else:
        live = _number(zero, "stage3_max_live_parameters", f"{where}: zero_optimization", 0.0, float("inf"))
        if live is not None:
            out["max_live_parameters"] = live
    _precision(ds, out, where, notes)
    _optimizer(ds, where)
    _batches(ds, out, where, notes)
    _activation_checkpointing(ds, out, where, notes)
    clip = _number(ds, "gradient_clipping", where, 0.0, float("inf"))
    if clip:
        out["grad_clip"] = True
    ignored = [k for k in NOT_MODELED if k in zero]
    if ignored:
        notes.append(f"zero_optimization keys priced at DeepSpeed's defaults, not as set: {', '.join(ignored)}")
    return out, [f"{where}: {n}" for n in notes]
