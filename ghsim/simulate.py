"""simulate(): model + hardware + plan -> StepReport. The one entry point the CLI, the
search and the validation call; every plan, one GPU included (tp = pp = dp = 1), runs
through the layout simulator (simulate_parallel.py)."""

from __future__ import annotations

from ghsim.cost.calibration import Calibration, load_calibration
from ghsim.errors import GhsimError
from ghsim.graph.parallel import check_layout
from ghsim.hardware import Hardware
from ghsim.model import ModelSpec
from ghsim.plan import Plan, Precision, check_plan
from ghsim.report.step_report import StepReport
from ghsim.simulate_parallel import simulate_parallel


def check_fit_to_model(model: ModelSpec, hw: Hardware, plan: Plan) -> None:
    """Plan choices the model or the hardware cannot honour: one clear line each."""
    check_plan(plan)
    if plan.gpus > 1:
        check_layout(model, hw, plan)
    if plan.seq > model.max_seq_len * 64:
        raise GhsimError(f"--seq {plan.seq} is far beyond {model.name}'s context ({model.max_seq_len})")
    if plan.unified_memory and not hw.unified_memory.supported:
        raise GhsimError(f"{hw.name} does not support unified memory")
    if plan.lora_rank and plan.lora_rank > model.hidden_size:
        raise GhsimError(f"--lora-rank {plan.lora_rank} exceeds the hidden size {model.hidden_size}")
    if plan.precision == Precision.FP8 and plan.lora_rank:
        raise GhsimError("fp8 with LoRA is not modeled: LoRA adapters run in bf16 (drop --precision fp8)")


def simulate(model: ModelSpec, hw: Hardware, plan: Plan, calibration: Calibration | None = None,
             keep_timeline: bool = True) -> StepReport:
    check_fit_to_model(model, hw, plan)
    return simulate_parallel(model, hw, plan, calibration or load_calibration(hw.calibration), keep_timeline)
