"""Hold predictions against measured training steps: validation/cases/*/case.toml.

Each case names its hardware, model and plan and records what was measured
(step time, peak allocated HBM, kernel-busy fraction, and a profiler trace from
which kernel time by category is read with ghsim's own importer). validate()
simulates every case and reports the errors; a case whose plan this build does
not model is reported as skipped, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ghsim.cost.calibration import load_calibration
from ghsim.cost.cpu_optimizer import ADAMW_STREAM_BYTES, curve_of
from ghsim.cost.device_memory import device_total_bytes, nccl_buffer_bytes
from ghsim.errors import GhsimError
from ghsim.graph.ops import KERNEL_CATEGORIES
from ghsim.graph.parallel import Layout
from ghsim.hardware import apply_overrides, hardware_from_dict, load_hardware
from ghsim.model import load_model, model_from_dict
from ghsim.plan import CpuOptimizer, Plan, plan_from_dict
from ghsim.tomlio import read_toml

DEFAULT_TOLERANCES = {
    "step_time_rel": 0.25,  # issue 3: worst case at most 25%
    "peak_memory_rel": 0.10,
    "utilization_abs": 0.07,
    "kernel_share_abs": 0.10,  # largest per-category share difference
}


@dataclass(frozen=True)
class Case:
    name: str
    folder: Path
    description: str
    hardware_name: str
    hardware_overrides: dict[str, Any]
    model_table: dict[str, Any]
    plan: Plan
    measured: dict[str, Any]
    tolerance: dict[str, float]
    trace: Path | None
    published: bool = False  # measured by others (a paper's data): the profile's host figures stand
    peak_memory_kind: str = "allocated"  # what [measured] peak_allocated_bytes is: PEAK_MEMORY_KINDS


# What a case's measured peak is: torch's allocated peak (what the replay predicts), or nvidia-smi's
# device total, compared with the predicted device total (cost/device_memory.py).
PEAK_MEMORY_KINDS = ("allocated", "nvidia-smi")


@dataclass
class CaseResult:
    case: Case
    status: str  # ok | fail | skipped
    reason: str = ""
    measured: dict[str, float] = field(default_factory=dict)
    predicted: dict[str, float] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.case.name, "status": self.status, "reason": self.reason,
                "hardware": self.case.hardware_name, "plan": self.case.plan.flags(),
                "measured": self.measured, "predicted": self.predicted, "errors": self.errors,
                "tolerance": self.case.tolerance, "failed": self.failed}


def load_tolerances(root: Path) -> dict[str, float]:
    path = root / "tolerances.toml"
    tol = dict(DEFAULT_TOLERANCES)
    if path.exists():
        d = read_toml(path)
        tol.update(_checked_tolerances(d.get("tolerance", d), str(path)))
    return tol


def _checked_tolerances(table: Any, where: str) -> dict[str, float]:
    """A [tolerance] table: known keys with numbers only (a misspelt key would silently do nothing)."""
    if not isinstance(table, dict):
        raise GhsimError(f"{where}: [tolerance] must be a table")
    for k, v in table.items():
        if k not in DEFAULT_TOLERANCES or isinstance(v, bool) or not isinstance(v, (int, float)):
            raise GhsimError(f"{where}: unknown or non-numeric tolerance '{k}'")
    return {k: float(v) for k, v in table.items()}


def load_case(folder: Path, defaults: dict[str, float]) -> Case:
    path = folder / "case.toml"
    d = read_toml(path)
    where = str(path)
    for section in ("case", "model", "plan", "measured"):
        if not isinstance(d.get(section), dict):
            raise GhsimError(f"{where}: missing table [{section}]")
    c, measured = d["case"], d["measured"]
    for key in ("name", "hardware"):
        if key not in c:
            raise GhsimError(f"{where}: [case] lacks '{key}'")
    # a published table may give throughput only: its case states no peak, and none is compared
    optional = ("peak_allocated_bytes",) if _published(c, where) else ()
    for key in ("step_time_s", "peak_allocated_bytes"):
        if key in optional and key not in measured:
            continue
        v = measured.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise GhsimError(f"{where}: [measured] '{key}' must be a positive number")
    tol = dict(defaults)
    tol.update(_checked_tolerances(d.get("tolerance", {}), where))
    trace = folder / c["trace"] if c.get("trace") else None
    if trace is not None and not trace.exists():
        raise GhsimError(f"{where}: trace file {c['trace']} is missing")
    return Case(name=str(c["name"]), folder=folder, description=str(c.get("description", "")),
                hardware_name=str(c["hardware"]), hardware_overrides=dict(d.get("hardware_overrides", {})),
                model_table=d["model"], plan=plan_from_dict(d["plan"], f"{where} [plan]"), measured=measured,
                tolerance=tol, trace=trace, published=_published(c, where),
                peak_memory_kind=_peak_memory_kind(c, where))


def _published(c: dict[str, Any], where: str) -> bool:
    value = c.get("published", False)
    if not isinstance(value, bool):
        raise GhsimError(f"{where}: [case] 'published' must be true or false")
    return value


def _peak_memory_kind(c: dict[str, Any], where: str) -> str:
    kind = c.get("peak_memory_kind", "allocated")
    if kind not in PEAK_MEMORY_KINDS:
        raise GhsimError(f"{where}: [case] 'peak_memory_kind' must be one of {', '.join(PEAK_MEMORY_KINDS)}")
    return str(kind)


def find_cases(root: Path) -> list[Path]:
    if (root / "case.toml").exists():
        return [root]
    base = root / "cases" if (root / "cases").is_dir() else root
    if not base.is_dir():
        raise GhsimError(f"{root}: no such validation folder")
    return sorted(p.parent for p in base.glob("*/case.toml"))


def measured_kernel_shares(trace: Path) -> tuple[dict[str, float], float | None]:
    """Kernel time share by category, and kernel-busy seconds per step, from the case's own trace."""
    from ghsim.traces import load_trace, summarize

    data = load_trace(trace)
    try:
        s = summarize(data, steps="all")  # the profiled steps
    except GhsimError:
        s = summarize(data)  # a trace of one step recorded without a profiler schedule: all of it
    busy_per_step = None
    if s.gpu_busy_fraction is not None and s.window_s and s.step_times_s:
        busy_per_step = s.gpu_busy_fraction * s.window_s / len(s.step_times_s)
    return dict(s.kernel_share_by_category), busy_per_step


COMPUTE_CATEGORIES = tuple(c for c in KERNEL_CATEGORIES if c != "communication")


def _compute_shares(times: dict[str, float]) -> dict[str, float]:
    total = sum(times.get(c, 0.0) for c in COMPUTE_CATEGORIES)
    return {c: (times.get(c, 0.0) / total if total > 0 else 0.0) for c in COMPUTE_CATEGORIES}


def case_hardware(case: Case):
    """The case's profile, with the measuring machine's differences applied.

    The lent machines' host memory bandwidth is the one their calibration run measured: its
    fastest CPU AdamW row (torch's fused AdamW on all threads) times the bytes that implementation
    streams per update (cost/cpu_optimizer.py), expressed as the profile's bandwidth-derived
    adamw_params_per_s (28 B per update), not the profile's whole-node figure;
    a published case ran on the machine its profile describes, so the profile's figure stands.
    """
    base = load_hardware(case.hardware_name)
    overrides = dict(case.hardware_overrides)
    cal = load_calibration(base.calibration)
    if cal.optimizer_cpu_params_per_s and "cpu.adamw_params_per_s" not in overrides and not case.published:
        fused_bytes = curve_of(CpuOptimizer.TORCH_FUSED).bytes_per_param
        overrides["cpu.adamw_params_per_s"] = {
            "value": cal.optimizer_cpu_params_per_s * fused_bytes / ADAMW_STREAM_BYTES,
            "source": f"derived from the lent machine's measurement: {cal.source} optimizer_cpu (torch fused, "
                      f"{cal.optimizer_cpu_threads} threads) x {fused_bytes} B/param / {ADAMW_STREAM_BYTES} B",
        }
    return hardware_from_dict(apply_overrides(base.raw, overrides, str(case.folder / "case.toml")),
                              base.source_file)


def case_model(case: Case):
    """The case's model: a catalog name, or the shape its case.toml spells out."""
    return (load_model(case.model_table["name"]) if set(case.model_table) == {"name"}
            else model_from_dict(case.model_table, str(case.folder / "case.toml"), case.name))


def run_case(case: Case, with_trace: bool = True) -> CaseResult:
    from ghsim.simulate import simulate

    model = case_model(case)
    hw = case_hardware(case)
    measured = {"step_time_s": float(case.measured["step_time_s"])}
    if "peak_allocated_bytes" in case.measured:
        measured["peak_memory_bytes"] = float(case.measured["peak_allocated_bytes"])
    stored_utilization = case.measured.get("gpu_utilization")
    if stored_utilization and case.trace is None:  # measured over the timed step itself
        measured["gpu_utilization"] = float(stored_utilization)
    elif stored_utilization:
        # over the profiled steps, which the profiler's host overhead lengthens: checked
        # only once the trace gives the kernel-busy time of a step (below)
        measured["gpu_utilization_profiled"] = float(stored_utilization)
    try:
        report = simulate(model, hw, case.plan)
    except GhsimError as e:
        return CaseResult(case, "skipped", str(e), measured)
    peak = report.hbm.peak_bytes
    predicted = {"step_time_s": report.step_time_s, "gpu_utilization": report.gpu_utilization,
                 "host_peak_bytes": report.host.peak_bytes}
    if case.peak_memory_kind == "nvidia-smi":  # like with like: the device total, not live tensors
        predicted["peak_allocated_bytes"] = peak
        peak = device_total_bytes(peak, nccl_buffer_bytes(Layout.of(case.plan, hw).groups()))
    predicted["peak_memory_bytes"] = peak
    errors = {"step_time_rel": report.step_time_s / measured["step_time_s"] - 1}
    if "peak_memory_bytes" in measured:  # published cases may publish no peak
        errors["peak_memory_rel"] = peak / measured["peak_memory_bytes"] - 1
    if with_trace and case.trace is not None:
        shares, busy_per_step = measured_kernel_shares(case.trace)
        if busy_per_step is not None:
            # The profiler slows the host, so profiled steps of a launch-bound run are
            # longer than timed ones while its kernels are not: utilization is the
            # kernel-busy time of a profiled step over the (unprofiled) timed step.
            measured["gpu_utilization"] = min(1.0, busy_per_step / measured["step_time_s"])
        elif "gpu_utilization_profiled" in measured:  # a trace without steps: the profiled figure is all there is
            measured["gpu_utilization"] = measured["gpu_utilization_profiled"]
        # Shares over compute kernels only: an NCCL kernel's duration in a trace includes
        # the time it spins waiting for its peers, which is not link time, so
        # communication is reported beside the shares rather than inside them.
        measured["communication_kernel_share"] = shares.get("communication", 0.0)
        predicted["communication_kernel_share"] = report.time_breakdown_s.get("communication", 0.0) / max(
            sum(report.time_breakdown_s[c] for c in KERNEL_CATEGORIES), 1e-30)
        pred_shares = _compute_shares({c: report.time_breakdown_s[c] for c in KERNEL_CATEGORIES})
        meas_shares = _compute_shares(shares)
        for c in COMPUTE_CATEGORIES:
            measured[f"share_{c}"] = meas_shares[c]
            predicted[f"share_{c}"] = pred_shares[c]
        errors["kernel_share_abs"] = max(abs(pred_shares[c] - meas_shares[c]) for c in COMPUTE_CATEGORIES)
    if "gpu_utilization" in measured:
        errors["utilization_abs"] = report.gpu_utilization - measured["gpu_utilization"]
    failed = [k for k, v in errors.items() if abs(v) > case.tolerance.get(k, float("inf"))]
    return CaseResult(case, "fail" if failed else "ok", "", measured, predicted, errors, failed)


def validate(root: Path, with_trace: bool = True, only: str | None = None) -> list[CaseResult]:
    defaults = load_tolerances(root if (root / "cases").is_dir() else root.parent)
    folders = find_cases(root)
    if only:
        folders = [f for f in folders if only in f.name]
    if not folders:
        raise GhsimError(f"{root}: no cases (folders with case.toml)")
    return [_failed_run(f) or run_case(load_case(f, defaults), with_trace) for f in folders]


def _failed_run(folder: Path) -> CaseResult | None:
    """A measured run that failed (e.g. out of memory at initialisation) has no [measured] table:
    reported as skipped with the recorded reason, not silently left out."""
    path = folder / "case.toml"
    d = read_toml(path)
    c = d.get("case")
    if "measured" in d or not isinstance(c, dict) or not str(c.get("status", "")).startswith("failed"):
        return None
    case = Case(name=str(c.get("name", folder.name)), folder=folder, description=str(c.get("description", "")),
                hardware_name=str(c.get("hardware", "")), hardware_overrides={}, model_table=d.get("model", {}),
                plan=plan_from_dict(d.get("plan", {}), f"{path} [plan]"), measured={}, tolerance={}, trace=None)
    return CaseResult(case, "skipped", reason="the measured run " + str(c["status"])[:120])


def summary(results: list[CaseResult]) -> dict[str, Any]:
    import numpy as np

    ran = [r for r in results if r.status != "skipped"]
    out: dict[str, Any] = {"cases": len(results), "simulated": len(ran),
                           "skipped": len(results) - len(ran), "failed": sum(r.status == "fail" for r in results)}
    for key in ("step_time_rel", "peak_memory_rel", "utilization_abs", "kernel_share_abs"):
        vals = np.array([abs(r.errors[key]) for r in ran if key in r.errors])
        if len(vals):
            out[key] = {"median": float(np.median(vals)), "max": float(vals.max()), "n": int(len(vals))}
    return out


def render(results: list[CaseResult]) -> str:
    head = (f"{'case':<44} {'step ms meas/pred':>19} {'err':>7} {'peak GB meas/pred':>19} {'err':>7}"
            f" {'util meas/pred':>15} {'share':>6}  status")
    lines = [head, "-" * len(head)]
    for r in results:
        m, p, e = r.measured, r.predicted, r.errors
        if r.status == "skipped":
            step = f"{m['step_time_s'] * 1e3:8.1f}" if "step_time_s" in m else "       -"
            lines.append(f"{r.case.name:<44} {step} /      -          -  skipped: {r.reason}")
            continue
        util = (f"{m['gpu_utilization']:.2f}/{p['gpu_utilization']:.2f}" if "gpu_utilization" in m
                else f"   -/{p['gpu_utilization']:.2f}")
        share = f"{e['kernel_share_abs']:.2f}" if "kernel_share_abs" in e else "-"
        status = "ok" if r.status == "ok" else "FAIL " + ",".join(r.failed)
        peak = (f"{m['peak_memory_bytes'] / 1e9:8.2f}/{p['peak_memory_bytes'] / 1e9:8.2f}  {e['peak_memory_rel']:+6.1%}"
                if "peak_memory_bytes" in m else f"       -/{p['peak_memory_bytes'] / 1e9:8.2f}        -")
        lines.append(
            f"{r.case.name:<44} {m['step_time_s'] * 1e3:8.1f}/{p['step_time_s'] * 1e3:8.1f}  {e['step_time_rel']:+6.1%}"
            f" {peak} {util:>15} {share:>6}  {status}")
    s = summary(results)
    lines.append("")
    for key, label in (("step_time_rel", "step time"), ("peak_memory_rel", "peak memory"),
                       ("utilization_abs", "utilization (abs)"), ("kernel_share_abs", "kernel share (abs)")):
        if key in s:
            lines.append(f"{label:<20} median |error| {s[key]['median']:.3f}   max {s[key]['max']:.3f}   over {s[key]['n']} cases")
    lines.append(f"{s['simulated']} of {s['cases']} cases simulated, {s['skipped']} skipped, {s['failed']} outside tolerance")
    return "\n".join(lines)
