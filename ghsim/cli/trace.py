"""`ghsim trace ...`: read real profiles (summarize) and time their capture (command).
The main CLI adds this group with `main.add_command(trace)`; `main()` here runs it
standalone with the same error contract (GhsimError -> one line on stderr, exit code 2)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ghsim.cli.checks import check_simulated_plan
from ghsim.cli.options import FLOAT, INT, load_hardware_for, model_and_hardware, plan_from_flags, plan_options
from ghsim.errors import GhsimError


@click.group()
def trace() -> None:
    """Read Nsight Systems and PyTorch profiler traces."""


@trace.command("summarize")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--steps", metavar="A-B", help="Only ProfilerStep#A..#B: a range like 3-5, one step, or 'all' (first to last step).")
@click.option("--nvtx", metavar="NAME", help="Only the NVTX / annotation ranges with this name (glob allowed).")
@click.option("--device", type=INT, metavar="N", help="GPU to report (default: the busiest).")
@click.option("--top", type=click.IntRange(0, 1000), default=10, show_default=True, help="How many top kernels.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def summarize_cmd(file: str, steps: str | None, nvtx: str | None, device: int | None, top: int,
                  as_json: bool) -> None:
    """Where the GPU time goes in FILE: an nsys SQLite export, an `nsys stats`
    CSV, or a PyTorch profiler trace (.json / .json.gz)."""
    from ghsim.traces import load_trace, summarize  # pandas: loaded only when a trace is read

    if steps and nvtx:
        raise GhsimError("use --steps or --nvtx, not both")
    summary = summarize(load_trace(file), steps=steps, nvtx=nvtx, device=device, top=top)
    if as_json:
        click.echo(json.dumps(summary.to_dict(), indent=2))
    else:
        click.echo(summary.to_table(), nl=False)


@trace.command("compare")
@click.argument("predicted", type=click.Path(dir_okay=False))
@click.argument("measured", type=click.Path(dir_okay=False))
@click.option("--steps", metavar="A-B", help="Measured ProfilerStep#A..#B (default: every profiled step).")
@click.option("--nvtx", metavar="NAME", help="Measured steps are the NVTX ranges with this name (glob allowed).")
@click.option("--device", type=INT, metavar="N", help="Measured GPU (default: the busiest).")
@click.option("--step-time", "step_time_s", type=FLOAT, default=None, metavar="S",
              help="The measured step's time when timed apart from the trace (a profiler slows the host): "
                   "the difference goes to host gaps.")
@click.option("--top", type=click.IntRange(1, 100), default=8, show_default=True, help="How many mismatches.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def compare_cmd(predicted: str, measured: str, steps: str | None, nvtx: str | None, device: int | None,
                step_time_s: float | None, top: int, as_json: bool) -> None:
    """Where a prediction (PREDICTED: `ghsim simulate --trace` output) differs from a measured
    trace (MEASURED: nsys SQLite export or PyTorch profiler trace): time per category and per
    phase side by side, the largest mismatches, and the share of the step error each explains."""
    from pathlib import Path

    from ghsim.tomlio import read_json
    from ghsim.traces import load_trace
    from ghsim.traces.attribution import measured_breakdown, simulated_breakdown, with_step_time
    from ghsim.traces.comparison import compare

    if steps and nvtx:
        raise GhsimError("use --steps or --nvtx, not both")
    if step_time_s is not None and not 0 < step_time_s < 1e6:
        raise GhsimError("--step-time must be a positive number of seconds")
    pred = simulated_breakdown(read_json(Path(predicted)), predicted)
    meas = measured_breakdown(load_trace(measured), steps=steps, nvtx=nvtx, device=device)
    if step_time_s is not None:
        meas = with_step_time(meas, step_time_s, "--step-time")
    result = compare(pred, meas)
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else result.to_table(top), nl=as_json)


@trace.command("command")
@plan_options
@click.option("--hardware", "hardware_name", default=None, help="Profile name or TOML path (default: the --plan file's, else gh200-96gb).")
@click.option("--steps", required=True, metavar="A-B", help="Steps to capture, 0-based (e.g. 10-12).")
@click.option("--startup-s", type=FLOAT, default=60.0, show_default=True,
              help="Seconds from launch to the first step (model build, data, compile).")
@click.option("--output", default="ghsim_capture", show_default=True, help="Report name.")
@click.option("--program", default="python train.py", show_default=True, help="The training command.")
def trace_command(hardware_name: str | None, steps: str, startup_s: float, output: str, program: str, **kw: Any) -> None:
    """Print the nsys command and PyTorch profiler schedule that capture steps A-B."""
    from ghsim.model import load_model
    from ghsim.simulate import simulate as run_simulation
    from ghsim.traces.capture import capture_window, nsys_command, nsys_range_command, torch_profiler_snippet

    model_name, hardware_name = model_and_hardware(kw, hardware_name)
    hw, plan = load_hardware_for(hardware_name, kw), plan_from_flags(kw)
    check_simulated_plan(kw, plan, [hw])
    report = run_simulation(load_model(model_name), hw, plan, keep_timeline=False)
    w = capture_window(steps, report.step_time_s, startup_s)
    iv = report.step_time_interval_s
    span = f" (interval {iv[0] * 1e3:.1f}-{iv[1] * 1e3:.1f} ms)" if iv else ""
    click.echo(f"# predicted step {report.step_time_s * 1e3:.1f} ms{span}; steps {w.first_step}-{w.last_step} start "
               f"about {startup_s + w.first_step * report.step_time_s:.1f} s after launch")
    click.echo("# timed from the prediction (one step of margin each side):")
    click.echo(nsys_command(w, output, program))
    click.echo("# exact, if the script calls torch.cuda.profiler.start()/stop() around those steps:")
    click.echo(nsys_range_command(output, program))
    click.echo("# PyTorch profiler for the same steps:")
    click.echo(torch_profiler_snippet(w, output + "_torch"))


def main(args: list[str] | None = None) -> int:
    """Run the `trace` group standalone; returns the exit code."""
    try:
        trace.main(args=args, prog_name="ghsim trace", standalone_mode=False)
    except GhsimError as e:
        click.echo(f"ghsim: error: {e}", err=True)
        return 2
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return 2
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
