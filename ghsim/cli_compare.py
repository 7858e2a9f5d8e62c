"""`ghsim compare`: the same plan on several hardware profiles, side by side."""

from __future__ import annotations

import json
from typing import Any

import click

from ghsim.cli import plan_from_flags, plan_options
from ghsim.errors import GhsimError


def _best_plan_finder():
    """The plan search's entry point (ghsim/search.py), as (model, hw, plan) -> plan summary."""
    try:
        from ghsim import search
    except ModuleNotFoundError as e:
        if e.name != "ghsim.search":
            raise
        raise GhsimError("--best needs the plan search (ghsim/search.py), which this build does not have") from None
    for name in ("best_plan", "find_best_plan", "best"):
        fn = getattr(search, name, None)
        if callable(fn):
            return _adapt(fn)
    raise GhsimError("ghsim/search.py has no best_plan function to call for --best")


def _adapt(fn):
    def best(model, hw, plan) -> dict[str, Any] | None:
        found = fn(model, hw, plan)
        if found is None:
            return None
        if hasattr(found, "to_dict"):
            found = found.to_dict()
        if isinstance(found, dict):
            plan_d = found.get("plan", {})
            found.setdefault("flags", plan_d.get("flags", "") if isinstance(plan_d, dict) else "")
            found.setdefault("hardware", hw.name)
        return found
    return best


@click.command("compare")
@plan_options
@click.option("--hardware", "hardware_names", multiple=True, required=True,
              help="Profile name or TOML path; give it twice or more (first is the baseline).")
@click.option("--best", is_flag=True, help="Also search each hardware's best plan.")
@click.option("--json", "as_json", is_flag=True, help="Print {results: [...], comparisons: [...], best: [...]}.")
def compare(hardware_names: tuple[str, ...], best: bool, as_json: bool, **kw: Any) -> None:
    """The same plan on two or more hardware profiles: time, memory, speedup and why."""
    from ghsim.compare import compare as run_compare
    from ghsim.compare import render
    from ghsim.hardware import load_hardware
    from ghsim.model import load_model

    model = load_model(kw["model_name"])
    hardware = [load_hardware(h) for h in hardware_names]
    plan = plan_from_flags(kw)
    finder = _best_plan_finder() if best else None
    result = run_compare(model, hardware, plan, best_plan=finder)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(render(result))
