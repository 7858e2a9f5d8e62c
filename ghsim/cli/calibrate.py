"""`ghsim calibrate`: turn a microbenchmark file measured on a real GPU into a calibration set."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import numpy as np

from ghsim.cost.calibration import CALIBRATION_DIR, calibration_from_dict
from ghsim.errors import GhsimError
from ghsim.hardware import load_hardware
from ghsim.tomlio import read_json, write_text


@click.command()
@click.argument("microbench", type=click.Path())
@click.option("--reference", required=True, help="Profile of the GPU it was measured on (e.g. h100-sxm).")
@click.option("--name", default=None, help="Calibration name (default: the file's stem).")
@click.option("--extra", "extras", multiple=True, type=click.Path(),
              help="More microbenchmark files of the same GPU (microbench2.py) to merge in.")
@click.option("--out-dir", type=click.Path(), default=None, help="Where to write (default hardware_profiles/calibration).")
def calibrate(microbench: str, reference: str, name: str | None, extras: tuple[str, ...], out_dir: str | None) -> None:
    """Check a microbenchmark JSON, name its reference GPU, and install it as a calibration set."""
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


_CHIP = re.compile(r"\b[ABH]\d{3}\b")  # A100, H100, H200, B200: the GPU chip in a product name


def data_meta(data: object, where: str) -> dict:
    if not isinstance(data, dict) or not isinstance(data.get("meta"), dict):
        raise GhsimError(f"{where}: not a microbenchmark file (no 'meta' table)")
    return data["meta"]


def check_measured_on(meta: dict, ref, where: str) -> None:
    """Refuse a file measured on another GPU than the reference profile's: its efficiencies would
    be read against the wrong datasheet peaks. The chip (H100 vs H200) and SM count must agree
    where the file records them."""
    measured = str(meta.get("gpu", ""))
    chips, profile_chips = set(_CHIP.findall(measured)), set(_CHIP.findall(ref.gpu_model))
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
