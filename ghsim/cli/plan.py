"""`ghsim plan` (search the plan space for one model and cluster) and `ghsim sweep` (many)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from ghsim.cli.calibration_overlay import REPORT_KEY, is_overlay, overlaid, read_checked
from ghsim.cli.options import FLOAT, INT, FLAG_TO_FIELD, load_hardware_for, model_and_hardware, plan_from_flags, plan_options
from ghsim.errors import GhsimError
from ghsim.search.space import DEFAULT_FRAMEWORK, DEFAULT_OPTIMIZER, DEFAULT_PRECISIONS, LAYOUT, SEARCHED

PRECISIONS_OPTION = ",".join(p.value for p in DEFAULT_PRECISIONS)
from ghsim.tomlio import write_text

# plan fields the search varies: an explicit flag pins them
_PINNABLE = SEARCHED


class ProgressBar:
    """A one-line progress bar on stderr, only when stderr is a terminal."""

    def __init__(self, enabled: bool | None = None, label: str = "searching"):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.label, self.last, self.t0 = label, 0.0, time.perf_counter()
        self.finished = False  # the search reports its total more than once; clear the line once

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if not self.enabled or self.finished or (now - self.last < 0.1 and done < total):
            return
        self.last = now
        frac = done / total if total else 1.0
        bar = "#" * int(frac * 30)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac:4.0%} {done:,}/{total:,} plans {now - self.t0:5.1f} s")
        if done >= total:
            self.finished = True
            sys.stderr.write("\r" + " " * 90 + "\r")
        sys.stderr.flush()


def _calibration(path: str | None):
    """A calibration from a microbenchmark JSON whose meta names its reference profile."""
    if not path:
        return None
    if is_overlay(path):
        raise GhsimError(f"{path}: a calibration overlay is fitted on one part and model; give it to "
                         f"`ghsim plan --calibration` for that part, not to a sweep")
    from ghsim.cost.calibration import calibration_from_dict
    from ghsim.hardware import load_hardware
    from ghsim.tomlio import read_json

    d = read_json(Path(path))
    meta = d.get("meta") if isinstance(d, dict) else None
    ref = meta.get("reference_profile") if isinstance(meta, dict) else None
    if not isinstance(ref, str) or not ref:
        raise GhsimError(f"{path}: meta.reference_profile is missing (the profile of the GPU it was measured on)")
    return calibration_from_dict(d, load_hardware(ref), path)


def searched_precisions(precisions: str, pins: dict[str, Any], base, hw) -> tuple:
    """The --precisions list the part can run (no fp8 without FP8 Tensor Cores); a pinned
    --precision the part cannot run is refused."""
    from ghsim.cli.checks import check_precision, supported_precisions
    from ghsim.plan import Precision

    try:
        precs = tuple(Precision(p.strip()) for p in precisions.split(",") if p.strip())
    except ValueError:
        raise GhsimError(f"--precisions: each of {precisions!r} must be one of "
                         f"{', '.join(p.value for p in Precision)}") from None
    if "precision" in pins:
        check_precision(base.with_(precision=pins["precision"]), hw)
    if base.fp8_recipe:  # an FP8 recipe names the precision
        check_precision(base.with_(precision=Precision.FP8), hw)
        precs = (Precision.FP8,)
    precs = supported_precisions(hw, precs)
    if not precs:
        raise GhsimError(f"--precisions: {hw.name} runs none of {precisions!r} (it has no FP8 Tensor Cores)")
    return precs


def base_and_pins(kw: dict[str, Any]):
    """The given plan fields (gpus, seq, batch, LoRA, software), the pinned search dimensions,
    and the user's own plan when a plan.toml or ds_config.json was given."""
    from ghsim.plan import check_values, plan_from_dict
    from ghsim.search.space import default_global_batch

    baseline = None
    if kw.get("pp_layers") is not None:
        raise GhsimError("--pp-layers fixes one pipeline split; ghsim plan searches even splits (run the split "
                         "with ghsim simulate --pp-layers)")
    if kw.get("plan_file") or kw.get("ds_file"):
        baseline = plan_from_flags(kw)
        given = baseline.with_(pp_layers=())  # the user's split is theirs; the search splits evenly
    else:
        fields = {f: kw[flag] / 1e3 if flag == "batch_prep_ms" else kw[flag]
                  for flag, f in FLAG_TO_FIELD.items() if kw.get(flag) is not None and f not in _PINNABLE}
        given = plan_from_dict(fields, "plan")
        if kw.get("framework") is None:
            given = given.with_(framework=DEFAULT_FRAMEWORK)
        if kw.get("optimizer_impl") is None:
            given = given.with_(optimizer_impl=DEFAULT_OPTIMIZER)
    if kw.get("global_batch") is None and (baseline is None or not baseline.global_batch):
        given = given.with_(global_batch=default_global_batch(given.gpus))
    pins: dict[str, Any] = {}
    explicit = plan_from_flags({k: v for k, v in kw.items() if k not in ("plan_file", "ds_file")})
    for flag, f in FLAG_TO_FIELD.items():
        if f in _PINNABLE and kw.get(flag) is not None:
            pins[f] = getattr(explicit, f)
    check_values(given)
    check_values(explicit)
    base = given.with_(**{f: v for f, v in pins.items() if f in LAYOUT})
    if pins.get("pp_interleave", 1) > 1 and pins.get("pp", 1) < 2:
        raise GhsimError("--pp-interleave splits each pipeline stage into model chunks: pin --pp 2 or more with it")
    if base.gpus % (base.tp * base.pp):
        raise GhsimError(f"--gpus {base.gpus} is not divisible by tp*pp = {base.tp}*{base.pp}")
    return base, pins, baseline


@click.command()
@functools.partial(plan_options, searched=True)
@click.option("--hardware", "hardware_name", default=None, help="Profile name or TOML path (default: the --plan file's, else gh200-96gb).")
@click.option("--objective", default="time", show_default=True,
              help="Rank by: time (step time), cost (dollars per million tokens), memory (HBM headroom).")
@click.option("--price", type=FLOAT, default=None, help="Dollars per GPU-hour (default: the profile's).")
@click.option("--top", type=INT, default=5, show_default=True, help="Plans to list.")
@click.option("--jobs", type=INT, default=None, help="Worker processes (default: every core).")
@click.option("--precisions", default=PRECISIONS_OPTION, show_default=True,
              help="Precisions to search (--precision pins one).")
@click.option("--calibration", "calibration_file", type=click.Path(), default=None,
              help="Microbenchmark/calibration JSON to price ops with (default: the profile's set), or a calibration "
                   "overlay TOML (`ghsim calibrate --trace`) fitted on a measured run of this model on this part.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (plans, n_evaluated, n_feasible, ...).")
@click.option("--plot", "plot_file", type=click.Path(), default=None, help="Pareto front of step time vs HBM (PNG).")
@click.option("--trace", "trace_file", type=click.Path(), default=None, help="The best plan's timeline (Chrome trace).")
@click.option("--save-plan", "save_file", type=click.Path(), default=None, help="Write the best plan as plan.toml.")
@click.option("--time-limit", type=FLOAT, default=7.0, show_default=True,
              help="Seconds of simulating before the rest is reported unexplored (0: simulate every survivor).")
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr (default: when a terminal).")
def plan(hardware_name: str | None, objective: str, price: float | None, top: int, jobs: int | None, precisions: str,
         time_limit: float,
         calibration_file: str | None, as_json: bool, plot_file: str | None, trace_file: str | None,
         save_file: str | None, progress: bool | None, **kw: Any) -> None:
    """Search the plan space (ZeRO, offload, unified memory, precision, recompute, micro-batch,
    TP/PP/EP, CUDA graphs) and rank the plans that fit.

    Given: --gpus (default 1), --seq (default 4096), --global-batch (default max(32, 4 x gpus)
    sequences), --lora-rank, --framework (default deepspeed), --optimizer-impl (default fused).
    Any other plan flag pins that dimension. --plan/--deepspeed: your own plan, simulated and
    compared with the best one found.
    """
    from ghsim.hardware import node_profile_for
    from ghsim.model import load_model
    from ghsim.search.objective import Objective
    from ghsim.search.explain import baseline_line, no_fit_advice, render_table, reproduce_flags, to_json
    from ghsim.search.space import default_space, pin

    goal = Objective.parse(objective)
    if top < 1:
        raise GhsimError("--top must be at least 1")
    if price is not None and price <= 0:
        raise GhsimError("--price must be positive")
    model_name, hardware_name = model_and_hardware(kw, hardware_name)
    model = load_model(model_name)
    overlay = None
    cal = None if is_overlay(calibration_file) else _calibration(calibration_file)
    base, pins, baseline = base_and_pins(kw)
    asked = load_hardware_for(hardware_name, kw)
    hw = (node := node_profile_for(asked, base.gpus, base.gpus_per_node)).hardware
    if is_overlay(calibration_file):
        overlay = read_checked(calibration_file, hw, model)
        cal = overlaid(overlay, hw)
    space = pin(default_space(model, hw, base, searched_precisions(precisions, pins, base, hw)), pins)
    if not time_limit >= 0 or time_limit == float("inf"):
        raise GhsimError(f"--time-limit must be a finite number of seconds >= 0 (got {time_limit})")
    result = _search(model, hw, base, space, goal, cal, price, top, jobs, progress, time_limit)
    base_eval = None
    if baseline is not None:
        from ghsim.search.core import memo_calibration
        from ghsim.search.screen import evaluate

        from ghsim.cost.calibration import load_calibration

        base_eval = evaluate(model, hw, baseline, memo_calibration(cal or load_calibration(hw.calibration)),
                             level="confirm")
    if result.ranked:
        best = result.ranked[0]
        if save_file:
            from ghsim.plan_toml import plan_to_toml

            note = (f"ghsim plan: best of {result.n_evaluated:,} plans for {model.name} on {base.gpus} x {hw.name} "
                    f"(objective {goal.value}): {best.step_time_s:.2f} s/step, {best.hbm_peak_bytes / 1e9:.1f} GB HBM")
            write_text(save_file, plan_to_toml(best.plan, note, model_name, hw, hardware_name if hw is asked else hw.name))
        if trace_file:
            from ghsim.report.step_report import chrome_trace
            from ghsim.simulate import simulate

            write_text(trace_file, json.dumps(chrome_trace(simulate(model, hw, best.plan, cal))))
        if plot_file:
            from ghsim.search.plot import plot_pareto

            plot_pareto(result, plot_file)
    advice = [] if result.ranked else no_fit_advice(result)  # (it loads every hardware profile)
    # the overlay's figures as they apply to the best plan (kernel factors hold for one precision)
    calibrated = {REPORT_KEY: overlay.report_section(result.ranked[0].plan if result.ranked else base)} \
        if overlay is not None else {}
    if as_json:
        note = {"node_note": node.note} if node.note else {}
        click.echo(json.dumps({**to_json(result, top, base_eval), **note, **calibrated}, indent=2))
    else:
        if node.note:
            click.echo(f"note: {node.note}")
        if calibrated:
            click.echo(calibrated[REPORT_KEY]["summary"] + " (figures as they apply to the best plan)")
        if base_eval is not None:
            click.echo(baseline_line(result, base_eval))
        click.echo(render_table(result, top) if result.ranked else "\n".join(advice))
    if not result.ranked:
        fixes = [line.strip("- ").strip() for line in advice if line.startswith("  - ")]
        raise GhsimError(advice[0].rstrip(".") + (f"; try {fixes[0]}" if fixes else ""))
    if save_file and not as_json:
        click.echo(f"wrote {save_file} ({reproduce_flags(result.ranked[0].plan)})")


def _search(model, hw, base, space, goal, cal, price, top: int, jobs: int | None, progress: bool | None,
            time_limit: float):
    """The search on at most one worker per core, stopped by SIGTERM; nothing found before
    the time limit is a one-line error."""
    from ghsim.search.core import search, usable_jobs
    from ghsim.search.explain import cut_short
    from ghsim.search.screen import Status

    n_jobs, note = usable_jobs(jobs)
    if note:
        click.echo(f"ghsim: note: {note}", err=True)
    with stop_on_sigterm():
        result = search(model, hw, base, space, goal, cal, price, top=top, jobs=n_jobs,
                        progress=ProgressBar(progress), time_limit=time_limit)
    if not result.ranked and result.count(Status.UNEXPLORED):
        raise GhsimError(f"no plan found: {cut_short(result)}")
    return result


@contextlib.contextmanager
def stop_on_sigterm():
    """SIGTERM stops the search and its worker processes (the search's own cleanup runs), not
    the process alone: one line on stderr and the shell's exit status for it (143)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    owner = os.getpid()

    def interrupt(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a pool worker forked before its initializer reset the handler: die quietly
            os._exit(128 + signum)
        click.echo("ghsim: stopped by SIGTERM", err=True)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _csv(value: str, what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise GhsimError(f"{what}: give at least one value")
    return items


@click.command()
@click.option("--models", required=True, help="Comma list of catalog names or model files.")
@click.option("--hardware", "hardware_names", default="gh200-96gb,h100-sxm", show_default=True,
              help="Comma list of hardware profiles.")
@click.option("--gpus", "gpu_counts", default="1,4,8", show_default=True, help="Comma list of cluster sizes.")
@click.option("--seq", type=INT, default=4096, show_default=True)
@click.option("--global-batch", type=INT, default=0, help="Sequences per step (default: max(32, 4 x gpus)).")
@click.option("--lora-rank", type=INT, default=0)
@click.option("--objective", default="time", show_default=True, help="time | cost | memory")
@click.option("--precisions", default=PRECISIONS_OPTION, show_default=True)
@click.option("--pin", "pins", default="", help="Plan dimensions fixed in every search, e.g. recompute=full,zero=3.")
@click.option("--scheduler", default=None, help="Dask scheduler address (tcp://host:8786): run the searches there.")
@click.option("--jobs", type=INT, default=None, help="Local worker processes without --scheduler (default: every core).")
@click.option("--calibration", "calibration_file", type=click.Path(), default=None,
              help="Microbenchmark/calibration JSON for every search (default: each profile's set).")
@click.option("--out", "out_file", type=click.Path(), default=None, help="Write the results (.parquet or .csv).")
@click.option("--time-limit", type=FLOAT, default=7.0, show_default=True,
              help="Seconds of simulating per search before the rest is left unexplored (0: none), as in plan.")
@click.option("--progress/--no-progress", default=None)
def sweep(models: str, hardware_names: str, gpu_counts: str, seq: int, global_batch: int, lora_rank: int,
          objective: str, precisions: str, pins: str, scheduler: str | None, jobs: int | None,
          calibration_file: str | None,
          out_file: str | None, time_limit: float, progress: bool | None) -> None:
    """Search the best plan for every model x hardware x cluster size (locally or on Dask)."""
    import pandas as pd

    from ghsim.search.core import default_jobs
    from ghsim.search.objective import Objective
    from ghsim.search.sweep import sweep as run_sweep
    from ghsim.search.sweep import check_scheduler_address, failures, pinned_values, tasks_for, write_results

    Objective.parse(objective)
    if scheduler is not None:
        check_scheduler_address(scheduler)
    try:
        counts = [int(g) for g in _csv(gpu_counts, "--gpus")]
    except ValueError:
        raise GhsimError(f"--gpus: {gpu_counts!r} must be a comma list of integers") from None
    if any(not 1 <= g <= INT.limit for g in counts):
        raise GhsimError(f"--gpus: every cluster size must lie in 1..{INT.limit:,}")
    if time_limit < 0:
        raise GhsimError("--time-limit must not be negative")
    pinned = []
    for item in (p for p in pins.split(",") if p.strip()):
        key, sep, value = item.partition("=")
        if not sep:
            raise GhsimError(f"--pin: {item!r} must be field=value")
        pinned.append((key.strip(), value.strip()))
    pinned_values(dict(pinned))  # a bad field or value fails here, once
    tasks = tasks_for(_csv(models, "--models"), _csv(hardware_names, "--hardware"), counts, seq=seq,
                      global_batch=global_batch, lora_rank=lora_rank, objective=objective,
                      precisions=tuple(_csv(precisions, "--precisions")), pins=tuple(pinned), time_limit=time_limit)
    df = run_sweep(tasks, _calibration(calibration_file), scheduler, jobs or default_jobs(),
                   ProgressBar(progress, "sweeping"))
    if out_file:
        write_results(df, out_file)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60):
        shown = df[["model", "hardware", "gpus", "status", "step_time_s", "step_time_lo_s", "step_time_hi_s",
                    "tokens_per_s", "mfu", "hbm_peak_gb", "usd_per_mtok", "n_evaluated"]]
        click.echo(shown.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if out_file:
        click.echo(f"wrote {out_file} ({len(df)} rows)")
    n_failed, reason = failures(df)
    if n_failed == len(df):
        raise GhsimError(f"every sweep row failed ({n_failed} of {len(df)}); the first: {reason}")
    if n_failed:
        click.echo(f"ghsim: warning: {n_failed} of {len(df)} sweep rows failed; the first: {reason}", err=True)
