"""`ghsim trace ...`: read real profiles. The main CLI adds this group with
`main.add_command(trace)`; `main()` here runs it standalone with the same
error contract (GhsimError -> one line on stderr, exit code 2)."""

from __future__ import annotations

import json
import sys

import click

from ghsim.errors import GhsimError


@click.group()
def trace() -> None:
    """Read Nsight Systems and PyTorch profiler traces."""


@trace.command("summarize")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--steps", metavar="A-B", help="Only ProfilerStep#A..#B: a range like 3-5, one step, or 'all' (first to last step).")
@click.option("--nvtx", metavar="NAME", help="Only the NVTX / annotation ranges with this name (glob allowed).")
@click.option("--device", type=int, metavar="N", help="GPU to report (default: the busiest).")
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
