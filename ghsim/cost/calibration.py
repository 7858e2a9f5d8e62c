"""Calibration: measured efficiencies, read from a microbenchmark file.

A calibration file is the JSON that validation/harness/microbench.py writes on
a real GPU (format in docs/formats.md), copied to hardware_profiles/calibration/
by `ghsim calibrate`, which also names the profile of the GPU it was measured on
("reference_profile"). Every rate here is turned into an efficiency relative to
that reference GPU's datasheet peak, so the same curves can price a part of the
same die with other peaks (an H100 measurement priced at GH200's clocks and HBM).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ghsim.graph.flops import attention_bwd_flops, attention_fwd_flops
from ghsim.errors import GhsimError
from ghsim.tomlio import read_json, repo_root

if TYPE_CHECKING:
    from ghsim.cost.overlay import Overlay
    from ghsim.hardware import Hardware

CALIBRATION_DIR = repo_root() / "hardware_profiles" / "calibration"


@dataclass(frozen=True)
class PointTable:
    """Measured efficiencies at points in a log-feature space, queried by inverse distance."""

    features: np.ndarray  # (n, d)
    values: np.ndarray  # (n,)

    def query(self, x: tuple[float, ...], neighbours: int = 4) -> float:
        d2 = ((self.features - np.asarray(x)) ** 2).sum(axis=1)
        k = min(neighbours, len(d2))
        idx = np.argpartition(d2, k - 1)[:k]
        near = d2[idx]
        if near.min() < 1e-12:
            return float(self.values[idx[near.argmin()]])
        w = 1.0 / near
        return float((w * self.values[idx]).sum() / w.sum())


@dataclass(frozen=True)
class LinearFit:
    """time = fixed_s + amount / rate, fitted by least squares to measured (amount, time)."""

    fixed_s: float
    rate: float  # amount per second

    def time(self, amount: float) -> float:
        return self.fixed_s + amount / self.rate


def fit_linear(amounts: list[float], times: list[float], where: str) -> LinearFit:
    a = np.asarray(amounts, dtype=float)
    t = np.asarray(times, dtype=float)
    if len(a) == 0:
        raise GhsimError(f"{where}: no measurements to fit")
    if len(a) == 1 or np.ptp(a) == 0:
        return LinearFit(0.0, float(a.mean() / t.mean()))
    slope, intercept = np.polyfit(a, t, 1)
    if slope <= 0:
        return LinearFit(0.0, float(a.max() / t[a.argmax()]))
    return LinearFit(max(float(intercept), 0.0), float(1.0 / slope))


@dataclass(frozen=True)
class Calibration:
    name: str
    reference_profile: str  # the profile of the GPU it was measured on
    gpu: str
    ref_peak_flops: dict[str, float]  # that GPU's datasheet peaks, FLOP/s by dtype
    ref_hbm_Bps: float  # that GPU's datasheet HBM bandwidth
    gemm: dict[str, PointTable]  # dtype -> efficiency vs (log2 m, log2 n, log2 k)
    attention_fwd: dict[str, PointTable]  # dtype -> efficiency vs attention_features()
    attention_bwd: dict[str, PointTable]
    framework_overhead: dict[str, tuple[float, float, float]]  # variant -> host s/kernel (fwd, bwd, opt)
    membound: dict[str, LinearFit]  # op -> fixed time and achieved bytes/s on the reference
    optimizer_gpu: dict[str, LinearFit]  # impl -> params/s on the reference
    optimizer_cpu_params_per_s: float  # measured on the reference host (its cores)
    optimizer_cpu_threads: int
    eager_op_s: float  # host time per eager PyTorch op
    cuda_graph_kernel_s: float
    kernel_gap_s: float  # GPU idle between stream-launched kernels (see _kernel_gap)
    min_kernel_s: float  # shortest kernel (fixed time of a device copy)
    source: str
    # time factors fitted on a measured step (cost/overlay.py: `--calibration overlay.toml`), resolved per
    # plan into the CostModel's corrections; None: the microbenchmarks alone
    overlay: "Overlay | None" = None


def _gemm_tables(rows: list[dict[str, Any]], peaks: dict[str, float]) -> dict[str, PointTable]:
    by_dtype: dict[str, list[tuple[tuple[float, float, float], float]]] = {}
    for r in rows:
        dt = r["dtype"]
        eff = r["tflops"] * 1e12 / peaks[dt]
        feat = (np.log2(r["m"]), np.log2(r["n"]), np.log2(r["k"]))
        by_dtype.setdefault(dt, []).append((feat, min(eff, 1.0)))
    return {
        dt: PointTable(np.array([f for f, _ in pts]), np.array([e for _, e in pts]))
        for dt, pts in by_dtype.items()
    }


def attention_features(seq: int, batch_heads: int, head_dim: int, gqa: bool) -> tuple[float, ...]:
    """Where an attention call sits among the measured ones. GQA is a feature because it
    changes which SDPA backend PyTorch picks in fp32 (memory-efficient vs math)."""
    return (math.log2(max(seq, 1)), math.log2(max(batch_heads, 1)), head_dim / 64, 4.0 * gqa)


def _attention_tables(rows: list[dict[str, Any]], peak: dict[str, float], which: str) -> dict[str, PointTable]:
    """Efficiency by dtype from measured times, with ghsim's own FLOP convention (graph/flops.py).

    Rows measured with the backend PyTorch picks by default ("default_backend")
    are the ones a training step runs; forced-backend rows are used only for a
    dtype that has no default-backend measurement.
    """
    flops_of = attention_fwd_flops if which == "fwd" else attention_bwd_flops
    tables: dict[str, PointTable] = {}
    for dtype in sorted({r.get("dtype", "bf16") for r in rows}):
        mine = [r for r in rows if r.get("dtype", "bf16") == dtype and r.get(f"{which}_time_s")]
        default = [r for r in mine if r.get("default_backend")]
        feats, effs = [], []
        for r in default or mine:
            t = r[f"{which}_time_s"]
            flops = flops_of(r["batch"], r["heads"], r["seq"], r["head_dim"], bool(r.get("causal", True)))
            feats.append(attention_features(r["seq"], r["batch"] * r["heads"], r["head_dim"],
                                            r.get("kv_heads", r["heads"]) != r["heads"]))
            effs.append(min(flops / t / peak["fp32" if dtype == "fp32" else "bf16"], 1.0))
        if feats:
            tables[dtype] = PointTable(np.array(feats), np.array(effs))
    if "bf16" not in tables:
        raise GhsimError(f"calibration has no bf16 attention {which} measurements")
    return tables


def _kernel_gap(launch: dict[str, Any]) -> float:
    """Idle time the GPU spends between two kernels launched one by one on a stream.

    Measured tiny kernels run back to back every `empty_kernel_us` when launched
    on a stream and every `cuda_graph_kernel_us` when replayed from a graph; the
    difference is the per-kernel front-end cost a graph removes, which a profiler
    shows as a gap between kernels.
    """
    empty = launch.get("empty_kernel_us")
    if not empty:
        return 0.0
    return max(float(empty) - float(launch["cuda_graph_kernel_us"]), 0.0) * 1e-6


def _framework_overhead(d: dict[str, Any]) -> dict[str, tuple[float, float, float]]:
    """Host seconds per launched kernel in forward, backward and the optimizer, by step variant."""
    samples: dict[str, list[tuple[float, ...]]] = {}
    for r in d.get("framework_overhead", {}).get("rows", []):
        if "error" in r or not r.get("fwd_launches") or not r.get("bwd_launches"):
            continue
        variant = re.sub(r"-L\d+$", "", r["variant"])  # depth sweeps ("bf16-amp-L22") pool with their variant
        samples.setdefault(variant, []).append(
            tuple(r[f"{p}_host_s"] / max(r[f"{p}_launches"], 1) for p in ("fwd", "bwd", "opt")))
    # repeated runs (on other lent machines too): the median of each phase
    return {v: tuple(float(np.median([row[i] for row in rows])) for i in range(3)) for v, rows in samples.items()}


def calibration_from_dict(d: dict[str, Any], reference: "Hardware", where: str) -> Calibration:
    """Build a Calibration measured on the GPU that profile `reference` describes."""
    peaks = reference.peak_flops
    try:
        meta = d["meta"]
        # one fit per op over all dtypes, and one per (op, dtype) as "op:dtype"
        membound_rows: dict[str, tuple[list[float], list[float]]] = {}
        for r in d["memory_bound"]:
            for key in (r["op"], f"{r['op']}:{r.get('dtype', '')}"):
                a, t = membound_rows.setdefault(key, ([], []))
                a.append(r["bytes_moved"])
                t.append(r["time_s"])
        membound = {op: fit_linear(a, t, f"{where} memory_bound/{op}") for op, (a, t) in membound_rows.items()}
        opt_rows: dict[str, tuple[list[float], list[float]]] = {}
        for r in d["optimizer_gpu"]:
            a, t = opt_rows.setdefault(r["impl"], ([], []))
            a.append(r["n_params"])
            t.append(r["time_s"])
        cpu_rows = d.get("optimizer_cpu", [])
        best_cpu = max(cpu_rows, key=lambda r: r["params_per_s"]) if cpu_rows else None
        launch = d["launch"]
        return Calibration(
            name=Path(where).stem,
            reference_profile=str(meta.get("reference_profile", "")),
            gpu=str(meta.get("gpu", "")),
            ref_peak_flops=dict(peaks),
            ref_hbm_Bps=reference.hbm.bandwidth,
            gemm=_gemm_tables(d["gemm"], peaks),
            attention_fwd=_attention_tables(d["attention"], peaks, "fwd"),
            attention_bwd=_attention_tables(d["attention"], peaks, "bwd"),
            framework_overhead=_framework_overhead(d),
            membound=membound,
            optimizer_gpu={k: fit_linear(a, t, f"{where} optimizer_gpu/{k}") for k, (a, t) in opt_rows.items()},
            optimizer_cpu_params_per_s=best_cpu["params_per_s"] if best_cpu else 0.0,
            optimizer_cpu_threads=int(best_cpu["threads"]) if best_cpu else 0,
            eager_op_s=float(launch["eager_small_op_us"]) * 1e-6,
            cuda_graph_kernel_s=float(launch["cuda_graph_kernel_us"]) * 1e-6,
            kernel_gap_s=_kernel_gap(launch),
            min_kernel_s=membound["copy"].fixed_s if "copy" in membound else 0.0,
            source=where,
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise GhsimError(f"{where}: malformed calibration ("
                         f"{f'no {e.args[0]!r} entry' if isinstance(e, KeyError) else str(e)[:200]})") from None


@lru_cache(maxsize=16)
def load_calibration(name: str) -> Calibration:
    """The calibration `name` (hardware_profiles/calibration/NAME.json), priced on its reference GPU."""
    from ghsim.hardware import load_hardware  # the reference profile supplies the peaks

    path = CALIBRATION_DIR / f"{name}.json"
    d = read_json(path)
    ref = d.get("meta", {}).get("reference_profile")
    if not ref:
        raise GhsimError(f"{path}: meta.reference_profile is missing (run `ghsim calibrate`)")
    return calibration_from_dict(d, load_hardware(ref), str(path))
