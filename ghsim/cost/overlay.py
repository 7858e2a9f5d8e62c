"""A calibration overlay: time corrections fitted on one measured training step, applied on top of
a profile's microbenchmark calibration (`ghsim calibrate --trace` writes it; `simulate`, `compare`
and `plan` take it with `--calibration overlay.toml`).

Each figure is a factor on the time ghsim prices (measured / predicted), kept with the trace file
and window it came from:
- kernel time by category (GEMM and attention per dtype, since one plan's trace says nothing of
  another dtype's kernels; elementwise, norm/reduction, optimizer, other by category),
- host<->device copy time by direction,
- GPU idle between stream-launched kernels, host time per launched kernel, CPU optimizer time.

A factor fitted at one plan's shapes is applied to every op of its category in another plan:
that is the transfer the overlay assumes, and why an overlay is refused on another GPU or on a
model with other layer shapes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ghsim.errors import GhsimError
from ghsim.graph.ops import KERNEL_CATEGORIES, Category, Kind
from ghsim.tomlio import read_toml

if TYPE_CHECKING:
    from ghsim.cost.calibration import Calibration
    from ghsim.hardware import Hardware
    from ghsim.model import ModelSpec
    from ghsim.plan import Plan

FORMAT = 1
PER_DTYPE = (Category.GEMM, Category.ATTENTION)  # kernel categories whose factor is kept per dtype
HOST_FIGURES = ("kernel_gap",)  # and launch:<step variant> (launch_key), cpu_optimizer:<impl>:<config>
COPY_DIRECTIONS = ("HtoD", "DtoH")
FACTOR_RANGE = (0.05, 20.0)  # a factor outside it describes another plan, not a correction
# the layer shapes a kernel factor was fitted at (depth and vocabulary may differ)
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_kv_heads", "head_dim")


def kernel_key(category: str, dtype: str) -> str:
    return f"{category}:{dtype}" if category in PER_DTYPE else str(category)


def launch_key(plan: "Plan") -> str:
    """Kept per step variant, as the microbenchmarks measure host time per kernel (cost/compute.LaunchCosts):
    checkpointed, LoRA, fp8 and fp32 steps run other Python per kernel."""
    from ghsim.cost.compute import LaunchCosts

    return f"launch:{LaunchCosts.variant(plan)}"


OFFLOADABLE = ("activations", "grads", "optimizer", "params")


def offload_config(plan: "Plan") -> str:
    """What shapes the copies a step makes and how its CPU optimizer's time shows: the library, ZeRO
    stage, offload schedule, what is offloaded and into which host memory."""
    offloaded = "+".join(sorted(plan.offload)) or "none"
    memory = "pinned" if plan.offload_pinned else "pageable"
    return f"{plan.framework.value}:zero{plan.zero}:{plan.offload_schedule.value}:{offloaded}:{memory}"


def _is_offload_config(parts: list[str]) -> bool:
    from ghsim.plan import Framework, OffloadSchedule

    return (len(parts) == 5 and parts[0] in {f.value for f in Framework} and parts[1] in {f"zero{z}" for z in range(4)}
            and parts[2] in {o.value for o in OffloadSchedule}
            and (parts[3] == "none" or set(parts[3].split("+")) <= set(OFFLOADABLE))
            and parts[4] in ("pinned", "pageable"))


def copy_key(direction: str, plan: "Plan") -> str:
    """Copy rates are fitted on the copies one offload configuration makes (their sizes, buffers and
    overlap): a SuperOffload trace's rate says little about ZeRO-Offload's copies (validation/README.md)."""
    return f"{direction}:{offload_config(plan)}"


def cpu_optimizer_key(impl: str, plan: "Plan") -> str:
    """Kept per implementation (DeepSpeedCPUAdam and torch's for-loop AdamW run at other rates) and per
    offload configuration: the fit gives the CPU optimizer what the prediction leaves of the step, and
    what that is differs between, say, SuperOffload and ZeRO-Offload (validation/README.md)."""
    return f"cpu_optimizer:{impl}:{offload_config(plan)}"


@dataclass(frozen=True)
class Corrections:
    """Time factors the cost model multiplies its prices by (1.0: not fitted)."""

    kernel: Mapping[str, float] = field(default_factory=dict)  # kernel_key -> factor
    copy: Mapping[str, float] = field(default_factory=dict)  # HtoD / DtoH -> factor
    kernel_gap: float = 1.0
    launch: float = 1.0
    cpu_optimizer: Mapping[str, float] = field(default_factory=dict)  # implementation -> factor
    # attention's factor holds at the shape it was fitted at only: the measured error of the
    # microbenchmarks' attention efficiency changes with batch x heads (validation/README.md)
    attention_shapes: frozenset = frozenset()
    # a factor for named ops, ahead of their category's (cost/measured_blocks.py: a profiled layer's kernels)
    by_name: Mapping[str, float] = field(default_factory=dict)

    def op_factor(self, op: Any) -> float:
        named = self.by_name.get(op.name) if self.by_name else None
        if named is not None:
            return named
        kind = op.kind
        if kind == Kind.H2D:
            return self.copy.get("HtoD", 1.0)
        if kind == Kind.D2H:
            return self.copy.get("DtoH", 1.0)
        if kind == Kind.OPT_CPU:
            return self.cpu_optimizer.get(getattr(op.variant, "value", op.variant), 1.0)
        if op.category not in KERNEL_CATEGORIES:
            return 1.0
        if op.split:  # a composite op: its kernels' categories, weighted by their share of its time
            return sum(part * self.kernel.get(kernel_key(cat, op.dtype), 1.0) for cat, part in op.split)
        if op.category == Category.ATTENTION and tuple(op.shape) not in self.attention_shapes:
            return 1.0
        return self.kernel.get(kernel_key(op.category, op.dtype), 1.0)


@dataclass(frozen=True)
class Figure:
    """One fitted factor and where it came from."""

    factor: float
    source: str
    detail: Mapping[str, float] = field(default_factory=dict)  # measured / predicted figures behind it
    shapes: tuple[tuple[int, ...], ...] = ()  # attention: the (batch, heads, kv_heads, seq, head_dim) fitted at


@dataclass(frozen=True)
class Overlay:
    path: str
    fitted_on: str  # hardware profile name
    gpu_model: str  # that profile's GPU
    trace_gpu: str  # the GPU as the trace names it
    calibration: str  # the microbenchmark set it corrects
    model: str
    model_shape: Mapping[str, int]
    plan: str  # the flags of the measured plan
    precision: str  # its precision: kernel factors apply to plans of the same precision only
    trace: str
    window: str
    kernel: Mapping[str, Figure]
    copy: Mapping[str, Figure]
    host: Mapping[str, Figure]  # kernel_gap / launch / cpu_optimizer
    not_fitted: Mapping[str, str]
    notes: tuple[str, ...] = ()  # what the trace's reading noted (the window taken, the device chosen)

    def kernel_factors_apply(self, plan: "Plan") -> bool:
        """Kernel factors are fitted on one precision's kernels (another precision runs other casts,
        quantizations and GEMM kernels), so a plan of another precision keeps the microbenchmarks'."""
        return plan.precision.value == self.precision

    def changed(self, plan: "Plan") -> dict[str, float]:
        """Every figure the overlay changes for `plan`, by name (kernel.gemm:bf16, host.launch:bf16-amp)."""
        out = {f"kernel.{k}": f.factor for k, f in self.kernel.items()} if self.kernel_factors_apply(plan) else {}
        config = offload_config(plan)
        out.update({f"copy.{k}": f.factor for k, f in self.copy.items() if k.endswith(":" + config)})
        launch = launch_key(plan)
        # a CUDA graph's replay has neither the eager launch path nor its gaps between kernels
        stream_launched = ("kernel_gap", launch) if not plan.cuda_graphs else ()
        out.update({f"host.{k}": f.factor for k, f in self.host.items()
                    if k in stream_launched or (k.startswith("cpu_optimizer:") and k.endswith(":" + config))})
        return out

    def corrections(self, plan: "Plan") -> Corrections:
        changed = self.changed(plan)
        kernel = {k[len("kernel."):]: v for k, v in changed.items() if k.startswith("kernel.")}
        cpu = {k.split(":")[1]: v for k, v in changed.items() if k.startswith("host.cpu_optimizer:")}
        shapes = frozenset(s for k, f in self.kernel.items() if k.startswith(str(Category.ATTENTION)) for s in f.shapes)
        copy = {k.split(":")[0][len("copy."):]: v for k, v in changed.items() if k.startswith("copy.")}
        return Corrections(kernel, copy, changed.get("host.kernel_gap", 1.0),
                           changed.get(f"host.{launch_key(plan)}", 1.0), cpu, shapes)

    def report_section(self, plan: "Plan") -> dict[str, Any]:
        """What a report says about the overlay it used (text: its summary line; JSON: all of it)."""
        changed = self.changed(plan)
        figures = ", ".join(f"{k} x{v:.3f}" for k, v in changed.items()) or "none"
        kept = ("" if self.kernel_factors_apply(plan) or not self.kernel else
                f"; kernel factors not applied (fitted on a {self.precision} plan, this one runs "
                f"{plan.precision.value})")
        return {"file": self.path, "fitted_on": self.fitted_on, "trace": self.trace, "window": self.window,
                "plan": self.plan, "precision": self.precision, "changed": changed,
                "not_fitted": dict(self.not_fitted),
                "summary": f"calibrated with {self.path} (fitted on {Path(self.trace).name}, {self.window}, "
                           f"{self.fitted_on}): {figures}{kept}"}


def model_shape(model: "ModelSpec") -> dict[str, int]:
    return {k: int(getattr(model, k)) for k in SHAPE_KEYS}


def check_applies(overlay: Overlay, hw: "Hardware", model: "ModelSpec") -> None:
    """Refuse an overlay fitted on another GPU or on a model with other layer shapes: its factors
    correct this cost model at that part's clocks, host and kernels' shapes, not at these."""
    if hw.name != overlay.fitted_on and hw.gpu_model != overlay.gpu_model:
        raise GhsimError(f"{overlay.path}: fitted on {overlay.fitted_on} ({overlay.trace_gpu or overlay.gpu_model}), "
                         f"not on {hw.name} ({hw.gpu_model}); calibrate on a trace measured on {hw.name}")
    shape = model_shape(model)
    differ = [f"{k} {overlay.model_shape.get(k)} vs {v}" for k, v in shape.items() if overlay.model_shape.get(k) != v]
    if differ:
        raise GhsimError(f"{overlay.path}: fitted on {overlay.model}, whose layers differ from {model.name}'s "
                         f"({'; '.join(differ)}): its kernel factors do not transfer; calibrate on a trace of this "
                         f"model")


def apply(cal: "Calibration", overlay: Overlay) -> "Calibration":
    """The calibration with the overlay on top (each plan priced with it takes its own corrections)."""
    if cal.name != overlay.calibration:
        raise GhsimError(f"{overlay.path}: corrects the calibration set {overlay.calibration!r}, "
                         f"this part is priced with {cal.name!r}")
    return replace(cal, overlay=overlay, name=f"{cal.name}+{Path(overlay.path).name}")


# -- the file --------------------------------------------------------------------------------------

def _value(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    return json.dumps(str(v))  # a TOML basic string


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def _figure_table(section: str, name: str, f: Figure) -> list[str]:
    lines = [f"[{section}.{_key(name)}]", f"factor = {f.factor!r}"]
    lines += [f"{_key(k)} = {_value(float(v))}" for k, v in f.detail.items()]
    if f.shapes:
        lines.append(f"shapes = {json.dumps([list(s) for s in f.shapes])}")
    lines.append(f"source = {_value(f.source)}")
    return lines + [""]


def to_toml(o: Overlay) -> str:
    lines = ["# ghsim calibration overlay, written by `ghsim calibrate --trace` (format: docs/formats.md).",
             "# Every factor multiplies the time ghsim prices for that figure; its source names the trace and window.",
             "[overlay]", f"format = {FORMAT}"]
    for key in ("fitted_on", "gpu_model", "trace_gpu", "calibration", "model", "plan", "precision", "trace", "window"):
        lines.append(f"{key} = {_value(getattr(o, key))}")
    if o.notes:
        lines.append(f"notes = [{', '.join(_value(n) for n in o.notes)}]")
    lines += ["", "[model_shape]"] + [f"{k} = {v}" for k, v in o.model_shape.items()] + [""]
    for section, figures in (("kernel", o.kernel), ("copy", o.copy), ("host", o.host)):
        for name, f in figures.items():
            lines += _figure_table(section, name, f)
    if o.not_fitted:
        lines += ["[not_fitted]"] + [f"{_key(k)} = {_value(v)}" for k, v in o.not_fitted.items()] + [""]
    return "\n".join(lines)


def _factor(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or not FACTOR_RANGE[0] <= v <= FACTOR_RANGE[1]:
        raise GhsimError(f"{where}: factor must be a number in [{FACTOR_RANGE[0]}, {FACTOR_RANGE[1]}], got {v!r}")
    return float(v)


def _figures(d: Any, section: str, allowed: Callable[[str], bool], known: str, where: str) -> dict[str, Figure]:
    if d is None:
        return {}
    if not isinstance(d, dict):
        raise GhsimError(f"{where}: [{section}] must be a table")
    out = {}
    for name, t in d.items():
        at = f"{where} [{section}.{name}]"
        if not allowed(name):
            raise GhsimError(f"{at}: unknown figure (known: {known})")
        if not isinstance(t, dict) or not isinstance(t.get("source"), str) or not t["source"].strip():
            raise GhsimError(f"{at}: needs a factor and the source it was fitted from")
        detail = {k: float(v) for k, v in t.items() if k not in ("factor", "source")
                  and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        out[name] = Figure(_factor(t.get("factor"), at), t["source"], detail, _shapes(t.get("shapes", []), at))
    return out


def _shapes(v: Any, where: str) -> tuple[tuple[int, ...], ...]:
    if not isinstance(v, list) or not all(isinstance(s, list) and s and all(
            isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in s) for s in v):
        raise GhsimError(f"{where}: shapes must be a list of lists of positive integers")
    return tuple(tuple(s) for s in v)


def _kernel_keys() -> tuple[str, ...]:
    dtypes = ("fp32", "tf32", "bf16", "fp16", "fp8")
    return tuple(kernel_key(c, d) for c in KERNEL_CATEGORIES if c in PER_DTYPE for d in dtypes) + tuple(
        str(c) for c in KERNEL_CATEGORIES if c not in PER_DTYPE)


def _host_key(name: str) -> bool:
    from ghsim.cost.compute import LaunchCosts
    from ghsim.plan import CpuOptimizer

    kind, _, rest = name.partition(":")
    if kind == "launch":
        return rest in LaunchCosts.VARIANTS
    if kind != "cpu_optimizer":
        return name in HOST_FIGURES
    impl, _, config = rest.partition(":")
    return impl in {c.value for c in CpuOptimizer} and _is_offload_config(config.split(":"))


def _copy_key(name: str) -> bool:
    direction, _, config = name.partition(":")
    return direction in COPY_DIRECTIONS and _is_offload_config(config.split(":"))


CONFIG_KNOWN = "<framework>:zero<N>:<offload schedule>:<offloaded, + between>:<pinned|pageable>"
HOST_KNOWN = f"kernel_gap, launch:<step variant>, cpu_optimizer:<implementation>:{CONFIG_KNOWN}"


def read_overlay(path: str | Path) -> Overlay:
    where = str(path)
    if not Path(path).is_file():
        raise GhsimError(f"{where}: no such calibration overlay")
    d = read_toml(Path(path))
    head = d.get("overlay")
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise GhsimError(f"{where}: not a calibration overlay (no [overlay] table of format {FORMAT}; "
                         f"`ghsim calibrate --trace` writes one)")
    text = {}
    for key in ("fitted_on", "gpu_model", "calibration", "model", "precision", "trace", "window"):
        if not isinstance(head.get(key), str) or not head[key]:
            raise GhsimError(f"{where}: [overlay] lacks '{key}'")
        text[key] = head[key]
    shape = d.get("model_shape")
    if not isinstance(shape, dict) or any(isinstance(shape.get(k), bool) or not isinstance(shape.get(k), int)
                                          for k in SHAPE_KEYS):
        raise GhsimError(f"{where}: [model_shape] needs integers {', '.join(SHAPE_KEYS)}")
    not_fitted = d.get("not_fitted", {})
    if not isinstance(not_fitted, dict):
        raise GhsimError(f"{where}: [not_fitted] must be a table")
    notes = head.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise GhsimError(f"{where}: [overlay] notes must be a list of strings")
    return Overlay(path=where, trace_gpu=str(head.get("trace_gpu", "")), plan=str(head.get("plan", "")),
                   model_shape={k: shape[k] for k in SHAPE_KEYS},
                   kernel=_figures(d.get("kernel"), "kernel", _kernel_keys().__contains__, ", ".join(_kernel_keys()),
                                   where),
                   copy=_figures(d.get("copy"), "copy", _copy_key, f"HtoD|DtoH:{CONFIG_KNOWN}", where),
                   host=_figures(d.get("host"), "host", _host_key, HOST_KNOWN, where),
                   not_fitted={str(k): str(v) for k, v in not_fitted.items()}, notes=tuple(notes), **text)
