"""The Hugging Face eager layer as its traces show it (issue 15): HF's rotary embedding runs in
fp32 under torch-amp (cos/sin come in the fp32 residual stream's dtype), and gradients arriving in
bf16 for fp32 tensors are cast up at the measured bf16 -> fp32 rate."""

from ghsim.cost.calibration import load_calibration
from ghsim.cost.compute import CostModel
from ghsim.graph.dtypes import DOWNCAST, UPCAST
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Framework, Plan
from ghsim.simulate import simulate

MODEL, H100 = load_model("llama-2-7b"), load_hardware("h100-sxm")
PLAN = Plan(seq=1024)


def _op_names(report) -> set[str]:
    return {op.name for op in report.timeline.ops}


def test_hf_rotation_runs_in_fp32_under_autocast_only():
    hf, cast = simulate(MODEL, H100, PLAN), simulate(MODEL, H100, PLAN.with_(rope_cast=True))
    assert hf.step_time_s > cast.step_time_s
    assert {"rope.cast", "rope.grad_cast"} <= _op_names(hf)
    assert not {"rope.cast", "rope.grad_cast"} & _op_names(cast)
    # the fp32 rotation's outputs are transient: what backward keeps is the same
    assert abs(hf.hbm.peak_bytes - cast.hbm.peak_bytes) <= 0.01 * cast.hbm.peak_bytes
    for bf16_stream in (PLAN.with_(framework=Framework.FSDP_MIXED), PLAN.with_(lora_rank=16)):
        a, b = simulate(MODEL, H100, bf16_stream), simulate(MODEL, H100, bf16_stream.with_(rope_cast=True))
        assert a.step_time_s == b.step_time_s


def test_upcasts_cost_more_than_downcasts_of_the_same_bytes():
    cm = CostModel(H100, load_calibration(H100.calibration))
    nbytes = 6 * 2048 * 8192
    assert cm.membound_time(nbytes, UPCAST) > 1.3 * cm.membound_time(nbytes, DOWNCAST)
