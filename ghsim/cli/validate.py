"""`ghsim validate`: simulate every measured case and fail when an error exceeds its tolerance."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


@click.command()
@click.argument("folder", type=click.Path(), default="validation")
@click.option("--json", "as_json", is_flag=True, help="Print {cases: [...], summary: {...}}.")
@click.option("--plot", "plot_file", type=click.Path(), default=None, help="Predicted vs measured, as a PNG.")
@click.option("--no-trace", is_flag=True, help="Skip reading the traces (faster; no kernel-share or utilization check: a case's utilization needs its trace's kernel-busy time).")
@click.option("--case", "only", default=None, help="Only cases whose folder name contains this.")
@click.option("--explain", is_flag=True, help="Also say where each case's step error comes from (its trace against "
              "the predicted timeline, row by row) and which rows carry the error across the cases.")
def validate(folder: str, as_json: bool, plot_file: str | None, no_trace: bool, only: str | None,
             explain: bool) -> None:
    """Compare predictions with every measured case in FOLDER (default: validation)."""
    from ghsim.errors import GhsimError
    from ghsim.validate.cases import render, summary
    from ghsim.validate.cases import validate as run_validation

    if explain and no_trace:
        raise GhsimError("--explain reads the traces: drop --no-trace")
    results = run_validation(Path(folder), with_trace=not no_trace, only=only)
    explained = []
    if explain:
        from ghsim.validate.explain import explain_case

        explained = [e for r in results if (e := explain_case(r)) is not None]
    if plot_file:
        from ghsim.report.plots import plot_validation

        plot_validation(results, plot_file)
    if as_json:
        doc = {"cases": [r.to_dict() for r in results], "summary": summary(results)}
        if explain:
            from ghsim.validate.explain import to_dict

            doc["explain"] = to_dict(explained)
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(render(results))
        if explain:
            from ghsim.validate.explain import render as render_explained

            click.echo("\n" + render_explained(explained))
    if any(r.status == "fail" for r in results):
        sys.exit(1)
