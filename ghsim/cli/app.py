"""The `ghsim` command line. It only parses, calls and renders; errors become one line + exit 2."""

from __future__ import annotations

import sys
from typing import Any

import click

from ghsim.cli.calibrate import calibrate
from ghsim.cli.catalog import hardware, models
from ghsim.cli.compare import compare
from ghsim.cli.plan import plan, sweep
from ghsim.cli.simulate import simulate
from ghsim.cli.trace import trace
from ghsim.cli.validate import validate
from ghsim.errors import GhsimError


class GhsimGroup(click.Group):
    """Turns GhsimError (and click's usage errors) into one line on stderr and exit code 2."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args:  # bare `ghsim`: its help, exit 0 (not a usage error)
            click.echo(ctx.get_help())
            ctx.exit(0)
        return super().parse_args(ctx, args)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        argv = kwargs.get("args") if kwargs.get("args") is not None else (args[0] if args else sys.argv[1:])
        if any("\x00" in str(a) for a in argv or ()):  # no file name or value holds one (open() raises)
            click.echo("ghsim: error: an argument holds a NUL byte", err=True)
            sys.exit(2)
        try:
            return super().main(*args, **kwargs)
        except GhsimError as e:
            click.echo(f"ghsim: error: {e}", err=True)
            sys.exit(2)
        except (OverflowError, MemoryError) as e:
            # sizes beyond what any float or this machine holds: input no check caught, still one line
            click.echo(f"ghsim: error: the input's sizes are too large to simulate "
                       f"({str(e)[:120] or 'out of memory'})", err=True)
            sys.exit(2)
        except OSError as e:  # a path the OS refuses (name too long, permission) that no check caught
            click.echo(f"ghsim: error: {str(e.filename or '')[:120]}: {e.strerror or 'cannot be used'}", err=True)
            sys.exit(2)
        except click.exceptions.NoArgsIsHelpError as e:  # bare `ghsim`: the help, not an error
            click.echo(e.ctx.get_help())
            sys.exit(0)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("ghsim: aborted", err=True)
            sys.exit(1)
        except click.ClickException as e:
            click.echo(f"ghsim: error: {e.format_message()}", err=True)
            sys.exit(2)


@click.group(cls=GhsimGroup)
@click.version_option(package_name="ghsim")
def main() -> None:
    """Predict LLM training steps on Grace Hopper (GH200) and PCIe/SXM Hopper GPUs."""


for _command in (simulate, models, hardware, plan, sweep, compare, validate, trace, calibrate):
    main.add_command(_command)
