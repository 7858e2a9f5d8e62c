"""The analytic memory estimate the plan search prunes with, held against the simulator's replay.

Contract (ghsim/search/memory_estimate.py): on single-GPU plans without offload the estimate lies
within MARGIN of the replayed HBM peak; on every plan simulate() accepts it is never above
the peak by more than MARGIN, so "estimate > capacity x (1 + MARGIN)" proves a plan cannot fit.
The agreement is checked at full depth; the safety property on models cut to a few
layers (every layer is the same template: fast, and the non-layer terms weigh more), and
over the whole space the search enumerates (test_estimate_contract_over_the_search_space).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ghsim.errors import GhsimError
from ghsim.hardware import load_hardware
from ghsim.search.memory_estimate import MARGIN, estimate_memory, may_fit
from ghsim.model import ModelSpec, MoESpec, load_model
from ghsim.plan import Framework, Plan, Precision, Recompute
from ghsim.search.space import default_space, groups
from ghsim.simulate import simulate

H100 = load_hardware("h100-sxm")
GH200 = load_hardware("gh200-96gb")
MODELS = {name: dataclasses.replace(load_model(name), num_layers=4)
          for name in ("llama-2-7b", "mixtral-8x7b", "gpt3-1.7b", "qwen3-14b")}
FULL = {name: load_model(name) for name in ("llama-2-7b", "mixtral-8x7b", "gpt3-1.7b")}


def _sim(model, hw, plan, cal):
    try:
        return simulate(model, hw, plan, cal, keep_timeline=False)
    except GhsimError:
        return None


GRID = list(itertools.product(
    ["llama-2-7b", "mixtral-8x7b", "gpt3-1.7b"],
    [Precision.BF16, Precision.FP32, Precision.FP8],
    list(Recompute),
    [Framework.TORCH_AMP, Framework.DEEPSPEED],
    [0, 16],
    [(1, 1), (2, 2)],  # (micro-batch, accumulation)
))


@pytest.mark.parametrize("name,prec,rc,fw,lora,batch", GRID[::3], ids=str)
def test_estimate_agrees_with_replay_on_one_gpu(cal, name, prec, rc, fw, lora, batch):
    mb, ga = batch
    plan = Plan(seq=1024, micro_batch=mb, global_batch=mb * ga, precision=prec, recompute=rc, framework=fw,
                lora_rank=lora, optimizer_impl="foreach")
    r = _sim(FULL[name], H100, plan, cal)
    if r is None:
        pytest.skip("the simulator does not run this plan")
    est = estimate_memory(FULL[name], H100, plan)
    assert est.hbm_bytes == pytest.approx(r.hbm.peak_bytes, rel=MARGIN)


plans = st.builds(
    Plan,
    gpus=st.sampled_from([1, 1, 2, 4, 8]),
    seq=st.sampled_from([512, 1024, 2048]),
    micro_batch=st.sampled_from([1, 2]),
    precision=st.sampled_from([Precision.BF16, Precision.FP8, Precision.FP32]),
    recompute=st.sampled_from(list(Recompute)),
    framework=st.sampled_from(list(Framework)),
    zero=st.sampled_from([0, 1, 2, 3]),
    tp=st.sampled_from([1, 1, 2]),
    pp=st.sampled_from([1, 1, 2]),
    offload=st.sampled_from([frozenset(), frozenset({"optimizer", "grads"}), frozenset({"activations"})]),
    offload_ratio=st.sampled_from([1.0, 0.5]),
    lora_rank=st.sampled_from([0, 0, 8]),
    optimizer_impl=st.sampled_from(["foreach", "fused"]),
    compile=st.sampled_from([False, False, True]),
    fp8_recipe=st.sampled_from(["", "", "tensorwise", "rowwise"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans, accum=st.sampled_from([1, 2, 3]), name=st.sampled_from(["llama-2-7b", "gpt3-1.7b"]))
def test_estimate_never_over_replay_beyond_margin(cal, plan, accum, name):
    """The pruning contract, on any plan the simulator accepts (multi-GPU and offload included)."""
    if plan.gpus % (plan.tp * plan.pp):
        return
    plan = plan.with_(global_batch=plan.dp * plan.micro_batch * accum)
    model = MODELS[name]
    r = _sim(model, GH200, plan, cal)
    if r is None:
        return
    est = estimate_memory(model, GH200, plan)
    assert est.hbm_bytes <= r.hbm.peak_bytes * (1 + MARGIN), (plan.flags(), est.parts)
    assert est.host_bytes <= r.host.peak_bytes * (1 + MARGIN) + 1e6, (plan.flags(), est.host_bytes)
    if r.fits:
        assert may_fit(est, GH200, plan)


def test_explanation_names_states_and_activations():
    est = estimate_memory(load_model("llama-2-7b"), H100, Plan(seq=4096))
    text = est.explain(H100.hbm.capacity_bytes, "ZeRO-0")
    assert text.startswith("ZeRO-0 needs") and "states +" in text and "activations > 80 GB" in text
    assert est.floor_bytes <= est.hbm_bytes


def test_estimate_is_fast():
    import time

    model, plan = load_model("llama-3-70b"), Plan(gpus=8, zero=3, tp=2, global_batch=64)
    t = time.perf_counter()
    for _ in range(2000):
        estimate_memory(model, GH200, plan)
    assert (time.perf_counter() - t) / 2000 < 1e-3  # well under a millisecond per plan


# --- the contract over the whole space the search enumerates ---------------------------------
# Every plan `ghsim plan` can enumerate (ghsim/search_space.py: every offload set, ratio and
# schedule, ZeRO stage, layout tp/pp/ep, sequence parallelism, interleaving, precision,
# framework, optimizer kernels, recompute, micro-batch, unified memory, CUDA graphs), on small
# models, with and without LoRA: where simulate() accepts the plan, the estimate is never above
# its HBM or host peak by more than MARGIN.
SPACE_MODELS = {
    "dense": ModelSpec(name="tiny", hidden_size=512, intermediate_size=1408, num_layers=4, num_attention_heads=8,
                       num_kv_heads=4, head_dim=64, vocab_size=8000),
    "moe": ModelSpec(name="tiny-moe", hidden_size=512, intermediate_size=1408, num_layers=4, num_attention_heads=8,
                     num_kv_heads=4, head_dim=64, vocab_size=8000,
                     moe=MoESpec(num_experts=4, experts_per_token=2, expert_intermediate_size=704)),
}
SPACE_HARDWARE = {name: load_hardware(name) for name in ("h100-pcie", "gh200-96gb", "gh200-96gb-quad")}
SPACE_EXAMPLES = int(os.environ.get("GHSIM_PROPERTY_EXAMPLES", "300"))


@functools.lru_cache(maxsize=None)
def _space_groups(model_key: str, hw_name: str, gpus: int, lora: int, accum: int) -> tuple:
    model, hw = SPACE_MODELS[model_key], SPACE_HARDWARE[hw_name]
    base = Plan(gpus=gpus, seq=256, lora_rank=lora, global_batch=gpus * accum * 2)
    space = dataclasses.replace(
        default_space(model, hw, base, precisions=tuple(Precision)), frameworks=tuple(Framework),
        optimizer_impls=("foreach", "fused"), micro_batches=(1, 2))
    return base, tuple(groups(space, base))


@settings(max_examples=SPACE_EXAMPLES, deadline=None, derandomize="GHSIM_PROPERTY_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.too_slow])
@given(model_key=st.sampled_from(sorted(SPACE_MODELS)), hw_name=st.sampled_from(sorted(SPACE_HARDWARE)),
       gpus=st.sampled_from([1, 2, 4]), lora=st.sampled_from([0, 0, 8]), accum=st.sampled_from([1, 2]),
       pick=st.integers(0, 2**31), member=st.integers(0, 2**31))
def test_estimate_contract_over_the_search_space(cal, model_key, hw_name, gpus, lora, accum, pick, member):
    _, all_groups = _space_groups(model_key, hw_name, gpus, lora, accum)
    g = all_groups[pick % len(all_groups)]
    members = list(itertools.product(g.recomputes, g.micro_batches, g.unified_memory, g.cuda_graphs))
    rc, mb, um, graphs = members[member % len(members)]
    plan = g.base.with_(recompute=rc, micro_batch=mb, unified_memory=um, cuda_graphs=graphs)
    model, hw = SPACE_MODELS[model_key], SPACE_HARDWARE[hw_name]
    r = _sim(model, hw, plan, cal)
    if r is None:
        return
    est = estimate_memory(model, hw, plan)
    slack = 1 + MARGIN
    assert est.hbm_bytes <= r.hbm.peak_bytes * slack, (plan.flags(), est.parts, r.hbm.peak_bytes)
    assert est.floor_bytes <= r.hbm.peak_bytes * slack, (plan.flags(), est.floor_bytes, r.hbm.peak_bytes)
    assert est.host_bytes <= r.host.peak_bytes * slack + 1e6, (plan.flags(), est.host_bytes, r.host.peak_bytes)
    if r.fits:
        assert may_fit(est, hw, plan), plan.flags()
