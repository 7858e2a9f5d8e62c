"""Read a DeepSpeed ds_config.json into plan fields, so an existing config can be simulated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ghsim.errors import GhsimError
from ghsim.tomlio import read_json


def _int(d: dict[str, Any], key: str, where: str) -> int | None:
    v = d.get(key)
    if v is None or v == "auto":
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise GhsimError(f"{where}: '{key}' must be a positive integer or \"auto\", got {v!r}")
    return v


def plan_dict_from_ds_config(path: Path) -> dict[str, Any]:
    """Plan fields a ds_config implies: ZeRO stage and offload, precision, batch sizes."""
    where = str(path)
    ds = read_json(path)
    if not isinstance(ds, dict):
        raise GhsimError(f"{where}: a DeepSpeed config must be a JSON object")
    out: dict[str, Any] = {"framework": "deepspeed"}
    zero = ds.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise GhsimError(f"{where}: 'zero_optimization' must be an object")
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise GhsimError(f"{where}: zero_optimization.stage must be 0-3, got {stage!r}")
    out["zero"] = stage
    offload = []
    for key, target in (("offload_optimizer", "optimizer"), ("offload_param", "params")):
        section = zero.get(key)
        if section is not None and not isinstance(section, dict):
            raise GhsimError(f"{where}: zero_optimization.{key} must be an object, got {section!r}")
        device = section.get("device", "none") if isinstance(section, dict) else "none"
        if device not in ("cpu", "nvme", "none", None):
            raise GhsimError(f"{where}: zero_optimization.{key}.device must be cpu, nvme or none, got {device!r}")
        if isinstance(section, dict) and section.get("device", "none") in ("cpu", "nvme"):
            offload.append(target)
            if section.get("device") == "nvme":
                raise GhsimError(f"{where}: NVMe offload ({key}.device = nvme) is not modeled")
    if "optimizer" in offload:
        offload.append("grads")  # ZeRO-Offload moves gradients to the CPU with the optimizer
        opt_section = zero.get("offload_optimizer", {})
        ratio = opt_section.get("ratio")
        if ratio is not None:
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
                raise GhsimError(f"{where}: offload_optimizer.ratio must be a number, got {ratio!r}")
            out["offload_ratio"] = float(ratio)
        if opt_section.get("super_offload"):  # DeepSpeed >= 0.18: SuperOffload's schedule
            out["offload_schedule"] = "superoffload"
    sections = [zero.get(k) for k in ("offload_optimizer", "offload_param")]
    if any(isinstance(sec, dict) and sec.get("device") == "cpu" for sec in sections):
        # DeepSpeed's pin_memory defaults to false: pageable host buffers
        out["offload_pinned"] = all(bool(sec.get("pin_memory", False)) for sec in sections
                                    if isinstance(sec, dict) and sec.get("device") == "cpu")
    out["offload"] = offload
    enabled = []
    for key, prec in (("bf16", "bf16"), ("fp16", "fp16")):
        section = ds.get(key)
        if section is not None and not isinstance(section, dict):
            raise GhsimError(f"{where}: '{key}' must be an object like {{\"enabled\": true}}, got {section!r}")
        if isinstance(section, dict) and section.get("enabled", False) not in (False, None):
            # "auto" (the Hugging Face integration) follows the trainer's flag: read as enabled
            out["precision"] = prec
            enabled.append(key)
    if len(enabled) > 1:
        raise GhsimError(f"{where}: bf16 and fp16 cannot both be enabled")
    if "precision" not in out:
        out["precision"] = "fp32"
    mb = _int(ds, "train_micro_batch_size_per_gpu", where)
    if mb:
        out["micro_batch"] = mb
    gb = _int(ds, "train_batch_size", where)
    ga = _int(ds, "gradient_accumulation_steps", where)
    if gb:
        # DeepSpeed requires train_batch_size = micro-batch x accumulation x data-parallel ranks
        if mb and ga and gb % (mb * ga):
            raise GhsimError(f"{where}: train_batch_size {gb} is not train_micro_batch_size_per_gpu {mb} x "
                             f"gradient_accumulation_steps {ga} x ranks")
        out["global_batch"] = gb
    elif ga:
        out["grad_accum"] = ga  # resolved against the plan's data-parallel ranks (gpus / (tp x pp))
    ac = ds.get("activation_checkpointing", {})
    if isinstance(ac, dict) and ac.get("partition_activations") is not None:
        out["recompute"] = "full"
    if isinstance(ac, dict) and ac.get("cpu_checkpointing"):
        out.setdefault("offload", []).append("activations")
    return out
