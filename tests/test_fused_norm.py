"""RMSNorm as torch.nn.RMSNorm runs it (issue 15): one kernel each way and only 1/rms saved,
against Hugging Face's six-kernel LlamaRMSNorm that keeps an fp32 normalised copy."""

from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Plan
from ghsim.simulate import simulate

MODEL, H100 = load_model("llama-2-7b"), load_hardware("h100-sxm")


def test_fused_norm_is_faster_and_saves_the_fp32_copies():
    plan = Plan(seq=2048, lora_rank=16)  # LoRA: activations, not optimizer state, set the peak
    hf, fused = simulate(MODEL, H100, plan), simulate(MODEL, H100, plan.with_(fused_norm=True))
    assert fused.step_time_s < hf.step_time_s
    # two norms per layer no longer keep a tokens x hidden fp32 copy each
    saved = 2 * MODEL.num_layers * 2048 * MODEL.hidden_size * 4
    assert hf.hbm.peak_bytes - fused.hbm.peak_bytes >= 0.5 * saved
    kernels = lambda r: sum(op.kernels for op in r.timeline.ops if op.category == "norm_reduction")
    assert kernels(fused) < kernels(hf) / 2
