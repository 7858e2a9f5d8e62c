"""MoE shared experts in the op graph (Qwen2-MoE, DeepSeek): the work they add is exactly
their dense MLP on every token, in both kernel sets, and they leave no tensor behind."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ghsim.graph.layer_ops import LayerSplit
from ghsim.graph.ops import Category, Phase
from ghsim.graph.parallel import Layout, rank_shard
from ghsim.graph.transformer import LayerBuilder
from ghsim.hardware import load_hardware
from ghsim.model import model_from_dict
from ghsim.plan import Framework, Plan, Precision, Recompute
from ghsim.simulate import simulate

QWEN_MOE = model_from_dict(dict(name="qwen-moe-tiny", hidden_size=512, intermediate_size=1408, num_layers=4,
                                num_attention_heads=8, num_kv_heads=8, vocab_size=8000,
                                moe=dict(num_experts=8, experts_per_token=2, expert_intermediate_size=352,
                                         shared_intermediate_size=1408)), "qwen-moe-tiny")
ROUTED_ONLY = replace(QWEN_MOE, moe=replace(QWEN_MOE.moe, shared_intermediate_size=0))
H100 = load_hardware("h100-sxm")


def _layer(model, plan, split=LayerSplit()):
    """One layer's forward and backward ops, and the tensors left live after its backward."""
    b = LayerBuilder(model, plan, split)
    b.t.live["x"] = b.Tn * model.hidden_size * b.dt.residual
    kept = b.forward(save=plan.recompute != Recompute.FULL)
    del b.t.live["x_next"]
    if plan.recompute == Recompute.FULL:
        for n in [n for n in b.t.live if n != "x"]:
            del b.t.live[n]
        kept = b.forward(save=True, phase=Phase.RECOMPUTE)
        del b.t.live["x_next"]
    b.t.live["g"] = b.Tn * model.hidden_size * 4
    b.backward(kept)
    return b.ops, {n for n in b.t.live if not n.startswith("grad.")}


PLANS = [Plan(seq=256), Plan(seq=256, framework=Framework.MEGATRON), Plan(seq=256, recompute=Recompute.FULL),
         Plan(seq=256, recompute=Recompute.SELECTIVE), Plan(seq=256, precision=Precision.FP8)]


@pytest.mark.parametrize("plan", PLANS, ids=["eager", "megatron", "full-recompute", "selective", "fp8"])
@pytest.mark.parametrize("tp", [1, 2])
def test_shared_experts_add_exactly_their_dense_mlp(plan, tp):
    layout = Layout(gpus=tp, tp=tp, pp=1, dp=1, ep=1, gpus_per_node=8, interleave=1, sequence_parallel=False)
    split = LayerSplit(tp=tp)
    with_shared, left = _layer(rank_shard(QWEN_MOE, layout), plan, split)
    routed, left_routed = _layer(rank_shard(ROUTED_ONLY, layout), plan, split)
    T, h, fs = plan.micro_batch * plan.seq, QWEN_MOE.hidden_size, QWEN_MOE.moe.shared_intermediate_size // tp
    passes = 3 + (1 if plan.recompute == Recompute.FULL else 0)  # forward, dgrad, wgrad (+ the recomputed forward)

    def gemm_flops(ops):
        return sum(op.flops for op in ops if op.category == Category.GEMM and "flash" not in op.name)
    assert gemm_flops(with_shared) - gemm_flops(routed) == pytest.approx(passes * 2 * T * 3 * h * fs, rel=1e-12)
    assert left == left_routed  # every tensor the shared experts create is freed


@pytest.mark.parametrize("fields", [dict(), dict(gpus=2, tp=2), dict(gpus=2, ep=2), dict(gpus=2, zero=3),
                                    dict(framework=Framework.MEGATRON), dict(lora_rank=16),
                                    dict(offload=frozenset({"optimizer"}))])
def test_shared_experts_cost_time_and_memory(cal, fields):
    plan = Plan(seq=256, **fields)
    a, b = simulate(QWEN_MOE, H100, plan, cal), simulate(ROUTED_ONLY, H100, plan, cal)
    assert a.step_time_s > b.step_time_s
    assert a.hbm.peak_bytes > b.hbm.peak_bytes
