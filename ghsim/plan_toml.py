"""Write a Plan as a plan.toml (docs/formats.md) that ghsim.plan.load_plan_toml reads back."""

from __future__ import annotations

from dataclasses import fields
from enum import Enum
from typing import Any

from ghsim.plan import Plan


def _value(v: Any) -> str:
    if isinstance(v, Enum):
        v = v.value
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (frozenset, set, list, tuple)):
        return "[" + ", ".join(f'"{x}"' for x in sorted(v)) + "]"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, float):
        return repr(v)
    return str(v)


def plan_to_toml(plan: Plan, comment: str = "") -> str:
    """Every plan field, one per line; the global batch resolved so the file stands alone."""
    lines = [f"# {line}" for line in comment.splitlines()] if comment else []
    for f in fields(plan):
        v = getattr(plan, f.name)
        if f.name == "global_batch":
            v = plan.resolved_global_batch
        lines.append(f"{f.name} = {_value(v)}")
    return "\n".join(lines) + "\n"
