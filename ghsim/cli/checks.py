"""Checks of a concrete plan against the flags that made it and the part it runs on: a flag that
changes nothing is refused or noted, never echoed as if it mattered, and a precision the part
has no Tensor Cores for is refused rather than simulated at another precision's rate."""

from __future__ import annotations

from typing import Any, Iterable

import click

from ghsim.errors import GhsimError
from ghsim.hardware import Hardware, has_fp8
from ghsim.plan import Plan, Precision


def supported_precisions(hw: Hardware, precisions: Iterable[Precision]) -> tuple[Precision, ...]:
    """The precisions of a search the part can run (fp8 only with FP8 Tensor Cores)."""
    return tuple(p for p in precisions if p != Precision.FP8 or has_fp8(hw))


def check_precision(plan: Plan, hw: Hardware) -> None:
    if plan.precision == Precision.FP8 and not has_fp8(hw):
        raise GhsimError(f"--precision fp8: {hw.name} ({hw.gpu_model}) has no FP8 Tensor Cores; "
                         f"use bf16 (ghsim would otherwise price fp8 at the 16-bit rate)")


def check_flags_matter(kw: dict[str, Any], plan: Plan) -> list[str]:
    """Refuse a flag the plan cannot use; return notes for a flag whose cost the plan hides."""
    if kw.get("offload_ratio") is not None and "optimizer" not in plan.offload:
        raise GhsimError("--offload-ratio splits the optimizer step between CPU and GPU: it needs "
                         "--offload optimizer (the plan offloads " + (
                             ",".join(sorted(plan.offload)) or "nothing") + ")")
    if kw.get("pp_interleave") is not None and plan.pp_interleave > 1 and plan.pp < 2:
        raise GhsimError("--pp-interleave splits each pipeline stage into model chunks: it needs --pp 2 or more")
    notes = []
    if kw.get("dataloader_workers") is not None and plan.batch_prep_s <= 0:
        notes.append("--dataloader-workers changes nothing without --batch-prep-ms (batches are already on the GPU)")
    if kw.get("batch_prep_ms") is not None and plan.batch_prep_s > 0 and plan.dataloader_workers > 0 \
            and plan.resolved_global_batch <= plan.micro_batch * plan.dp:
        notes.append(f"--batch-prep-ms costs nothing here: the {plan.dataloader_workers} data-loader workers "
                     f"prepare the step's only micro-batch ahead of it (--dataloader-workers 0: the trainer waits)")
    return notes


def check_simulated_plan(kw: dict[str, Any], plan: Plan, hardware: Iterable[Hardware]) -> None:
    """Every check of a plan simulated as given (simulate, compare, trace command); notes go to stderr."""
    for hw in hardware:
        check_precision(plan, hw)
    for note in check_flags_matter(kw, plan):
        click.echo(f"ghsim: note: {note}", err=True)
