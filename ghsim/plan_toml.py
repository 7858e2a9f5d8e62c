"""Write a Plan as a plan.toml (docs/formats.md) that ghsim.plan.load_plan_toml reads back."""

from __future__ import annotations

import json
from dataclasses import fields
from enum import Enum
from pathlib import Path
from typing import Any

from ghsim.hardware import Hardware
from ghsim.plan import Plan

# plan-file key -> the profile figure it states (ghsim.cli.options reads them back)
HOST_FIGURES = {"host_cores": "cpu.cores", "host_memory_gb": "memory.host.capacity_gb"}


def _value(v: Any) -> str:
    if isinstance(v, Enum):
        v = v.value
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (frozenset, set, list, tuple)):
        return "[" + ", ".join(f'"{x}"' for x in sorted(v)) + "]"
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: quotes and backslashes escaped
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _where(name: str) -> str:
    """A catalog name as is; a file given by path as an absolute path (the plan file may be read
    from another directory)."""
    path = Path(name)
    return str(path.resolve()) if path.suffix and path.exists() else name


def plan_to_toml(plan: Plan, comment: str = "", model: str = "", hardware: Hardware | None = None,
                 hardware_name: str = "") -> str:
    """The model and hardware it was planned for (so `ghsim simulate --plan` runs it there) and
    every plan field, one per line; the global batch and GPUs per node resolved so the file
    stands alone."""
    lines = [f"# {line}" for line in comment.splitlines()] if comment else []
    if model:
        lines.append(f"model = {_value(_where(model))}")
    if hardware is not None:
        lines.append(f"hardware = {_value(_where(hardware_name or hardware.name))}")
        for key, figure in HOST_FIGURES.items():  # the host the user stated (--host-cores, --host-memory-gb)
            if figure in hardware.user_overrides:
                lines.append(f"{key} = {_value(hardware.user_overrides[figure]['value'])}")
    for f in fields(plan):
        v = getattr(plan, f.name)
        if f.name == "global_batch":
            v = plan.resolved_global_batch
        if f.name == "gpus_per_node" and not v and hardware is not None:
            v = hardware.gpus_per_node
        if f.name == "pp_layers":  # in stage order (not a set); absent for an even split, as before the field
            if v:
                lines.append(f"pp_layers = [{', '.join(map(str, v))}]")
            continue
        lines.append(f"{f.name} = {_value(v)}")
    return "\n".join(lines) + "\n"
