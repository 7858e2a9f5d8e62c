"""`ghsim calibrate`: turn a microbenchmark file measured on a real GPU into a calibration set."""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

from ghsim.cli.options import FLOAT, plan_options
from ghsim.cost.calibration import CALIBRATION_DIR, calibration_from_dict
from ghsim.errors import GhsimError
from ghsim.hardware import gpu_chips, load_hardware
from ghsim.tomlio import read_json, read_toml, write_text


@click.command()
@click.argument("microbench", type=click.Path(), required=False)
@click.option("--reference", default=None, help="Profile of the GPU it was measured on (e.g. h100-sxm).")
@click.option("--name", default=None, help="Calibration name (default: the file's stem).")
@click.option("--extra", "extras", multiple=True, type=click.Path(),
              help="More microbenchmark files of the same GPU (microbench2.py) to merge in.")
@click.option("--out-dir", type=click.Path(), default=None, help="Where to write (default hardware_profiles/calibration).")
@click.option("--trace", "trace_file", type=click.Path(), default=None,
              help="Instead of MICROBENCH: a measured run (PyTorch profiler JSON, nsys SQLite export, or nsys stats "
                   "CSV with --steps) of the plan the other flags describe; fit a calibration overlay on it.")
@click.option("--steps", default=None, help="With --trace: the ProfilerStep#N range to fit on, e.g. 5-7 "
                                              "(default: every profiled step; an nsys stats CSV: the steps it holds).")
@click.option("--step-time-ms", type=FLOAT, default=None,
              help="With --trace: the run's step time measured without the profiler (which lengthens host-bound "
                   "steps); host time is fitted to it (default: the fastest profiled step).")
@click.option("--hardware", "hardware_name", default=None, help="With --trace: the profile of the GPU it ran on.")
@click.option("--out", "out_file", type=click.Path(), default=None,
              help="With --trace: the overlay to write (default calibration-overlay.toml).")
@plan_options
def calibrate(microbench: str | None, reference: str | None, name: str | None, extras: tuple[str, ...],
              out_dir: str | None, trace_file: str | None, steps: str | None, step_time_ms: float | None,
              hardware_name: str | None, out_file: str | None, **kw) -> None:
    """Install a microbenchmark JSON measured on a real GPU as a calibration set (MICROBENCH --reference
    PROFILE), or fit a calibration overlay on a measured training run (--trace RUN --model M --hardware H
    and the run's plan flags) for simulate, compare and plan to take with --calibration."""
    if trace_file:
        if microbench or reference or extras or name or out_dir:
            raise GhsimError("--trace fits an overlay from a run: give it without a MICROBENCH file, --reference, "
                             "--extra, --name or --out-dir")
        return calibrate_trace(trace_file, steps, step_time_ms, hardware_name, out_file, kw)
    given = [f"--{k.replace('_', '-')}" for k, v in kw.items() if v is not None] + \
        [f for f, v in (("--steps", steps), ("--step-time-ms", step_time_ms), ("--hardware", hardware_name),
                        ("--out", out_file)) if v is not None]
    if not microbench:
        raise click.UsageError("give a MICROBENCH file (with --reference) or --trace RUN (with the run's --model, "
                               "--hardware and plan flags)")
    if given:
        raise GhsimError(f"{', '.join(given)}: only with --trace (a MICROBENCH file carries its own measurements)")
    if not reference:
        raise click.UsageError("Missing option '--reference'.")
    path = Path(microbench)
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("meta"), dict):
        raise GhsimError(f"{path}: not a microbenchmark file (no 'meta' table; see docs/formats.md)")
    ref = load_hardware(reference)
    check_measured_on(data["meta"], ref, str(path))
    for extra in extras:
        merge(data, read_json(Path(extra)), extra)
        check_measured_on(data_meta(read_json(Path(extra)), extra), ref, extra)
    data["meta"]["reference_profile"] = reference
    data["meta"]["calibrated_from"] = str(path)
    cal = calibration_from_dict(data, ref, str(path))  # raises on anything malformed
    target = Path(out_dir) if out_dir else CALIBRATION_DIR
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GhsimError(f"{target}: cannot make the folder: {e.strerror or e}") from None
    out = write_text(target / f"{name or path.stem}.json", json.dumps(data, indent=1))
    click.echo(f"wrote {out} (reference {reference}: {ref.gpu_model})")
    click.echo(summary(cal))


def data_meta(data: object, where: str) -> dict:
    if not isinstance(data, dict) or not isinstance(data.get("meta"), dict):
        raise GhsimError(f"{where}: not a microbenchmark file (no 'meta' table)")
    return data["meta"]


def check_measured_on(meta: dict, ref, where: str) -> None:
    """Refuse a file measured on another GPU than the reference profile's: its efficiencies would
    be read against the wrong datasheet peaks. The chip (H100 vs H200) and SM count must agree
    where the file records them."""
    measured = str(meta.get("gpu", ""))
    chips, profile_chips = gpu_chips(measured), gpu_chips(ref.gpu_model)
    if chips and profile_chips and not chips & profile_chips:
        raise GhsimError(f"{where}: measured on {measured!r}, not on {ref.name}'s {ref.gpu_model}; "
                         f"give --reference the profile of the GPU it was measured on")
    sm = str(meta.get("sm_count", "")).strip()
    if sm.isdigit() and getattr(ref, "sm_count", None) and int(sm) != ref.sm_count:
        raise GhsimError(f"{where}: measured on a GPU with {sm} SMs, {ref.name} has {ref.sm_count}; "
                         f"give --reference the profile of the GPU it was measured on")


def merge(data: dict, extra: dict, where: str) -> None:
    """Append an extra file's rows; its tables (framework_overhead, unified_memory) replace earlier ones."""
    data_meta(extra, where)
    for key, value in extra.items():
        if key == "meta":
            data["meta"].setdefault("merged", []).append(where)
        elif isinstance(value, list):
            data.setdefault(key, []).extend(value)
        elif key == "framework_overhead":  # repeated runs: keep every row, the calibration takes medians
            data.setdefault(key, {"rows": []})
            data[key]["rows"] = data[key].get("rows", []) + value.get("rows", [])
            data[key]["method"] = value.get("method", "")
        elif isinstance(value, dict):
            data[key] = value


def summary(cal) -> str:
    """The measured efficiencies, as a short table."""
    lines = ["GEMM efficiency vs datasheet peak      min    median    max   points"]
    for dtype, table in sorted(cal.gemm.items()):
        v = table.values
        lines.append(f"  {dtype:<34}{v.min():6.2f}  {np.median(v):7.2f}  {v.max():6.2f}  {len(v):6d}")
    for which, tables in (("attention fwd", cal.attention_fwd), ("attention bwd", cal.attention_bwd)):
        for dtype, table in sorted(tables.items()):
            v = table.values
            lines.append(f"  {which + ' ' + dtype:<34}{v.min():6.2f}  {np.median(v):7.2f}  {v.max():6.2f}  {len(v):6d}")
    lines.append("memory-bound ops: fixed time, achieved bandwidth (fraction of datasheet HBM)")
    for op, fit in sorted(cal.membound.items()):
        lines.append(f"  {op:<24}{fit.fixed_s * 1e6:8.1f} us  {fit.rate / 1e9:8.0f} GB/s  ({fit.rate / cal.ref_hbm_Bps:4.2f})")
    for impl, fit in sorted(cal.optimizer_gpu.items()):
        lines.append(f"GPU AdamW {impl:<8} {fit.rate / 1e9:6.1f} G params/s")
    lines.append(f"CPU AdamW  {cal.optimizer_cpu_params_per_s / 1e9:6.2f} G params/s on {cal.optimizer_cpu_threads} threads")
    lines.append(f"eager op on the host {cal.eager_op_s * 1e6:.1f} us; kernel in a CUDA graph {cal.cuda_graph_kernel_s * 1e6:.1f} us")
    lines.append("host time per kernel in a training step (fwd / bwd / optimizer, us):")
    for variant, costs in sorted(cal.framework_overhead.items()):
        lines.append(f"  {variant:<26}" + " / ".join(f"{c * 1e6:6.1f}" for c in costs))
    return "\n".join(lines)


DEFAULT_OVERLAY = "calibration-overlay.toml"


def calibrate_trace(trace_file: str, steps: str | None, step_time_ms: float | None, hardware_name: str | None,
                    out_file: str | None, kw: dict) -> None:
    """Fit a calibration overlay on a measured run of the plan the flags describe, write it, show it."""
    from ghsim.cli.checks import check_simulated_plan
    from ghsim.cli.options import load_hardware_for, model_and_hardware, plan_from_flags
    from ghsim.cost.calibration import load_calibration
    from ghsim.cost.overlay import to_toml
    from ghsim.hardware import node_profile_for
    from ghsim.model import load_model
    from ghsim.simulate import simulate
    from ghsim.trace_calibration import fit_overlay
    from ghsim.traces import load_trace

    recorded = read_toml(Path(kw["plan_file"])).get("hardware") if kw.get("plan_file") else None
    if not hardware_name and not recorded:  # no default part: the overlay is fitted on the one the run used
        raise GhsimError("--trace needs --hardware: the profile of the GPU the run was measured on")
    model_name, hardware_name = model_and_hardware(kw, hardware_name)
    model = load_model(model_name)
    plan = plan_from_flags(kw)
    hw = node_profile_for(load_hardware_for(hardware_name, kw), plan.gpus, plan.gpus_per_node).hardware
    check_simulated_plan(kw, plan, [hw])
    trace = load_trace(trace_file)
    out = out_file or DEFAULT_OVERLAY
    overlay = fit_overlay(trace, steps, model, model_name, hw, plan, load_calibration(hw.calibration),
                          lambda cal: simulate(model, hw, plan, cal), out,
                          step_time_ms / 1e3 if step_time_ms is not None else None)
    write_text(out, to_toml(overlay))
    for note in overlay.notes:
        click.echo(f"ghsim: note: {note}", err=True)
    click.echo(f"wrote {out}: fitted on {trace_file} ({overlay.window}) for {model.name} on {hw.name}")
    click.echo(overlay_table(overlay))


def overlay_table(overlay) -> str:
    """Each fitted factor with the measured and predicted figures behind it; what was not fitted, and why."""
    lines = [f"  {'figure':<34}{'factor':>8}   measured / predicted"]
    for section, figures in (("kernel", overlay.kernel), ("copy", overlay.copy), ("host", overlay.host)):
        for key, f in figures.items():
            d = f.detail
            pair = next(((d[m], d[p], unit) for m, p, unit in (
                ("measured_ms", "predicted_ms", "ms/step"), ("measured_GBps", "predicted_GBps", "GB/s"),
                ("measured_step_ms", "predicted_step_ms", "ms step")) if m in d and p in d), None)
            shown = f"{pair[0]:.2f} / {pair[1]:.2f} {pair[2]}" if pair else ""
            lines.append(f"  {section + '.' + key:<34}{f.factor:8.3f}   {shown}")
    for key, why in overlay.not_fitted.items():
        lines.append(f"  not fitted: {key}: {why}")
    return "\n".join(lines)

