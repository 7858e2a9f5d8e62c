"""`ghsim simulate`: one training step, as a table, JSON, a Chrome trace or a plot."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from ghsim.cli.calibration_overlay import overlaid, overlay_option, read_checked, with_section
from ghsim.cli.checks import check_simulated_plan
from ghsim.cli.options import load_hardware_for, model_and_hardware, plan_from_flags, plan_options
from ghsim.tomlio import write_text


def _echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2))


@click.command()
@plan_options
@click.option("--hardware", "hardware_name", default=None, help="Profile name or TOML path (default: the --plan file's, else gh200-96gb).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--trace", "trace_file", type=click.Path(), default=None, help="Write the timeline as a Chrome trace.")
@click.option("--plot", "plot_file", type=click.Path(), default=None, help="Draw timeline and memory to a PNG.")
@overlay_option
def simulate(hardware_name: str | None, as_json: bool, trace_file: str | None, plot_file: str | None,
             calibration_file: str | None, **kw: Any) -> None:
    """Simulate one training step and report time, memory and utilization."""
    from ghsim.hardware import node_profile_for
    from ghsim.model import load_model
    from ghsim.report.step_report import chrome_trace, render_table
    from ghsim.simulate import simulate as run_simulation

    model_name, hardware_name = model_and_hardware(kw, hardware_name)
    model = load_model(model_name)
    plan = plan_from_flags(kw)
    node = node_profile_for(load_hardware_for(hardware_name, kw), plan.gpus, plan.gpus_per_node)
    hw = node.hardware
    check_simulated_plan(kw, plan, [hw])
    overlay = read_checked(calibration_file, hw, model) if calibration_file else None
    report = run_simulation(model, hw, plan, overlaid(overlay, hw) if overlay else None)
    if overlay:
        report = with_section(report, overlay, plan)
    if node.note:  # which node kind the flags were read as: the report's first note
        report = dataclasses.replace(report, notes=(node.note, *report.notes))
    if trace_file:
        write_text(trace_file, json.dumps(chrome_trace(report)))
    if plot_file:
        from ghsim.report.plots import plot_step

        plot_step(report, plot_file)
    if as_json:
        _echo_json(report.to_dict())
    else:
        click.echo(render_table(report))
    if not report.fits:
        click.echo(no_fit_advice(model_name, hardware_name, plan), err=True)


def no_fit_advice(model_name: str, hardware_name: str, plan) -> str:
    """What to do about a plan that does not fit: the search finds the ones that do."""
    return (f"ghsim: note: this plan does not fit; `ghsim plan --model {model_name} --gpus {plan.gpus} "
            f"--hardware {hardware_name} --seq {plan.seq}` finds the plans that do (offload, ZeRO, recompute, "
            f"micro-batch, parallelism) or says what would make one fit")
