"""PyTorch's SDPA picks its kernel by head dimension (issue 15): cuDNN and the memory-efficient
kernel need a multiple of 8, else FlashAttention-2 runs at about half the rate (measured,
validation/microbench/issue15)."""

import dataclasses

from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Plan
from ghsim.simulate import simulate

MODEL, H100 = load_model("llama-2-7b"), load_hardware("h100-sxm")


def attention_seconds(head_dim: int) -> float:
    r = simulate(dataclasses.replace(MODEL, head_dim=head_dim), H100, Plan(seq=2048))
    tl = r.timeline
    return sum(tl.schedule.end[i] - tl.schedule.start[i] for i, op in enumerate(tl.ops)
               if op.kind in ("attn_fwd", "attn_bwd"))


def test_a_head_dim_without_cudnn_kernels_falls_back_to_flash_attention_2():
    t96, t100, t104 = (attention_seconds(h) for h in (96, 100, 104))
    assert t96 < t104 < 1.2 * t96  # more work, the same kernels
    assert t100 > 1.8 * t96  # fewer FLOPs than at 104, at half the rate
