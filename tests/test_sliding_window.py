"""Sliding-window attention (issue 15): a window shorter than the sequence changes attention's work;
flash kernels with a window (Megatron / Transformer Engine) skip the pairs outside it, PyTorch SDPA
under Hugging Face gets a boolean mask and computes every pair (measured: microbench15)."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghsim.cost.calibration import load_calibration
from ghsim.cost.compute import CostModel
from ghsim.cost.library_overheads import sdpa_mask_over_causal_time
from ghsim.errors import GhsimError
from ghsim.graph.flops import window_pair_fraction
from ghsim.graph.step import _layer_templates
from ghsim.hardware import load_hardware
from ghsim.model import load_model, model_from_dict
from ghsim.plan import Framework, Plan

H100 = load_hardware("h100-sxm")
COST = CostModel(H100, load_calibration("h100"))
MISTRAL = load_model("mistral-7b")  # window 4096 on every layer


def attention_s(model, plan) -> float:
    fwd, bwd, _, _ = _layer_templates(model, plan)
    return sum(COST.duration(op) for op in fwd + bwd if op.kind in ("attn_fwd", "attn_bwd"))


@given(st.integers(1, 1 << 16), st.integers(0, 1 << 17))
def test_window_pairs_are_a_share_of_the_causal_pairs(seq, window):
    f = window_pair_fraction(seq, window)
    assert 0 < f <= 1
    assert (f == 1) == (window <= 0 or window >= seq)
    assert window == 0 or window_pair_fraction(seq, window + 1) >= f  # 0: no window


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([1024, 2048, 8192]), st.integers(16, 16384), st.sampled_from(["all", "alternate"]),
       st.sampled_from([Framework.MEGATRON, Framework.DEEPSPEED]))
def test_flash_windows_never_cost_more_and_masks_cost_what_was_measured(seq, window, pattern, framework):
    windowed = replace(MISTRAL, sliding_window=window, sliding_window_pattern=pattern)
    full = replace(MISTRAL, sliding_window=0)
    plan = Plan(seq=seq, framework=framework)
    t_window, t_full = attention_s(windowed, plan), attention_s(full, plan)
    if window >= seq:
        assert t_window == pytest.approx(t_full)
    elif framework == Framework.MEGATRON:  # the kernel skips the blocks outside the window
        assert t_window <= t_full * (1 + 1e-9)
    else:  # a boolean mask: the windowed layers cost the measured masked call
        share = 1.0 if pattern == "all" else 0.5
        assert t_window == pytest.approx(t_full * (1 - share + share * sdpa_mask_over_causal_time()), rel=1e-6)


def test_a_short_window_cuts_flash_attention_time_and_flops():
    plan = Plan(seq=32768, framework=Framework.MEGATRON)
    short = replace(MISTRAL, sliding_window=1024)
    assert attention_s(short, plan) < 0.2 * attention_s(replace(MISTRAL, sliding_window=0), plan)
    fwd, _, _, _ = _layer_templates(short, plan)
    fwd_full, _, _, _ = _layer_templates(replace(MISTRAL, sliding_window=0), plan)
    flops = {op.name: op.flops for op in fwd}
    assert flops["flash_attn"] == pytest.approx(
        {op.name: op.flops for op in fwd_full}["flash_attn"] * window_pair_fraction(32768, 1024))


def test_window_patterns_from_files_and_hf_configs(tmp_path):
    base = dict(hidden_size=256, intermediate_size=512, num_layers=2, num_attention_heads=4, vocab_size=1000,
                sliding_window=64)
    assert model_from_dict({**base, "sliding_window_pattern": "alternate"}, "t", "t").sliding_window_pattern == "alternate"
    with pytest.raises(GhsimError, match="sliding_window_pattern"):
        model_from_dict({**base, "sliding_window_pattern": "every-third"}, "t", "t")
    assert load_model("gpt-oss-20b").sliding_window_pattern == "alternate"
