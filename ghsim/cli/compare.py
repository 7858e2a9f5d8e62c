"""`ghsim compare`: the same plan on several hardware profiles, side by side."""

from __future__ import annotations

import json
from typing import Any

import click

from ghsim.cli.calibration_overlay import overlay_option, per_part, with_section
from ghsim.cli.checks import check_simulated_plan
from ghsim.cli.options import FLOAT, load_hardware_for, model_and_hardware, plan_from_flags, plan_options
from ghsim.errors import GhsimError


def _best_plan_finder(time_limit: float, progress: bool | None, calibrations: dict | None = None):
    """Each hardware's best plan from the plan search (ghsim/search/), around the given plan
    (which fixes GPUs, sequence, global batch and LoRA rank), ranked by step time; a progress
    bar per part, and the search's own time limit."""
    try:
        from ghsim.search.core import default_jobs, search
        from ghsim.search.space import default_space
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("ghsim.search"):
            raise
        raise GhsimError("--best needs the plan search (ghsim/search/), which this build does not have") from None
    from ghsim.cli.checks import supported_precisions
    from ghsim.cli.plan import ProgressBar
    from ghsim.search.space import DEFAULT_PRECISIONS

    def best(model, hw, plan) -> dict[str, Any] | None:
        # the compared plan's global batch, resolved: a search base without one would let every
        # candidate run one micro-batch per GPU, a different (smaller) step than the one compared
        base = plan.with_(global_batch=plan.resolved_global_batch)
        space = default_space(model, hw, base, supported_precisions(hw, DEFAULT_PRECISIONS))
        result = search(model, hw, base, space, calibration=(calibrations or {}).get(hw.name), jobs=default_jobs(),
                        time_limit=time_limit, progress=ProgressBar(progress, f"searching {hw.name}"))
        e = result.best
        if e is None:
            return None
        return {"hardware": hw.name, "flags": e.plan.flags(), "plan": e.plan.to_dict(),
                "step_time_s": e.step_time_s, "tokens_per_s": e.tokens_per_s, "mfu": e.mfu,
                "gpu_utilization": e.gpu_utilization, "hbm_peak_bytes": e.hbm_peak_bytes,
                "host_peak_bytes": e.host_peak_bytes, "n_evaluated": result.n_evaluated,
                "n_candidates": result.n_candidates}
    return best


@click.command("compare")
@plan_options
@click.option("--hardware", "hardware_names", multiple=True, required=True,
              help="Profile name or TOML path; give it twice or more (first is the baseline).")
@click.option("--best", is_flag=True, help="Also search each hardware's best plan (same GPUs, sequence and global "
                                                "batch) and compare the two best plans.")
@click.option("--time-limit", type=FLOAT, default=7.0, show_default=True,
              help="With --best: seconds of simulating per part before the rest is left unexplored (0: none).")
@click.option("--progress/--no-progress", default=None, help="With --best: a progress bar on stderr (default: when a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print {results: [...], comparisons: [...], best: [...]}.")
@overlay_option
def compare(hardware_names: tuple[str, ...], best: bool, time_limit: float, progress: bool | None, as_json: bool,
            calibration_file: str | None, **kw: Any) -> None:
    """The same plan on two or more hardware profiles: time, memory, speedup and why."""
    from ghsim.compare import compare as run_compare
    from ghsim.compare import render
    from ghsim.model import load_model

    model = load_model(model_and_hardware(kw, None)[0])
    hardware = [load_hardware_for(h, kw) for h in hardware_names]
    plan = plan_from_flags(kw)
    check_simulated_plan(kw, plan, hardware)
    if time_limit < 0:
        raise GhsimError("--time-limit must not be negative")
    overlay, calibrations = per_part(calibration_file, hardware, model)
    finder = _best_plan_finder(time_limit, progress, calibrations) if best else None
    result = run_compare(model, hardware, plan, best_plan=finder, calibrations=calibrations)
    if overlay is not None:  # each report it priced says so; the others keep their microbenchmarks
        result.reports[:] = [with_section(r, overlay, plan) if r.hardware["name"] in calibrations else r
                             for r in result.reports]
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(render(result))
        if overlay is not None:
            others = [h.name for h in hardware if h.name not in calibrations]
            click.echo(overlay.report_section(plan)["summary"] + f"; applied to {', '.join(calibrations)}"
                       + (f" only ({', '.join(others)}: its microbenchmarks alone, so the speedup sets a calibrated "
                          f"prediction beside an uncalibrated one)" if others else ""))
