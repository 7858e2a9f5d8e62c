"""Published multi-GPU offload figures, reproduced (validation/published/RESULTS_offload.md, section 5).

Nothing here is fitted: the bounds only catch regressions, the errors themselves are reported
in RESULTS_offload.md. Memory checks use the synthetic calibration (memory does not depend on
it); the ETH throughput ratios use the profile's own (as RESULTS.md does).
"""

from __future__ import annotations

import math

import pytest

from ghsim.errors import GhsimError
from ghsim.hardware import load_hardware
from ghsim.model import load_model, model_from_dict
from ghsim.plan import plan_from_dict
from ghsim.simulate import simulate
from published_tables import PUBLISHED, render, steiger

QUAD = load_hardware("gh200-96gb-quad")
SUPEROFFLOAD = dict(offload=["optimizer"], offload_schedule="superoffload")


def eth_model(d: int):
    """The ETH study's model at width d: 32 layers, 32 heads, 8 KV heads, Llama-3 FFN sizing
    (1.3 x 8/3 d, a multiple of 1024), the Mistral-Nemo tokenizer's 131072 tokens (their src/train.py)."""
    ffn = 1024 * math.ceil(int(1.3 * int(8 * d / 3)) / 1024)
    return model_from_dict(dict(name=f"eth-d{d}", hidden_size=d, intermediate_size=ffn, num_layers=32,
                                num_attention_heads=32, num_kv_heads=8, vocab_size=131072, max_seq_len=8192), "test")


def test_eth_offload_rows_on_four_gh200(capsys):
    rows = [r for r in steiger(PUBLISHED / "steiger2025-eth-gh200-deepspeed.toml") if "Offload" in r.case]
    assert len(rows) == 4 and all(r.predicted is not None for r in rows)
    # regression bounds, not accuracy claims (see RESULTS_offload.md). Since the GH200 profiles price
    # Grace's launch path (host_path_factor) the ZeRO-3 baseline is launch-bound and within 1 % of the
    # authors' log, while the offload steps stay 23-35 % fast (steiger2025-eth-gh200/README.md): the
    # ratios to ZeRO-3 are high (0.75, 1.25 against 0.55, 0.80), SuperOffload's above 1, a miss reported there
    for r in rows:
        bound = 0.60 if r.metric.startswith("throughput") else 0.25
        if r.case.startswith("ZeRO-3 + SuperOffload") and r.metric.startswith("peak"):
            # ghsim follows stage3.py's whole-sub-group split: ratio 0.8 of 2 sub-groups per rank keeps
            # none on the GPU; the published run (30.5 GB) did not update its parameters (its caveat)
            bound = 0.35
        assert abs(r.error) < bound, r
    ratio = {r.case.split(" (")[0]: r.predicted for r in rows if r.metric.startswith("throughput")}
    assert ratio["ZeRO-3 + ZeRO-Offload"] < ratio["ZeRO-3 + SuperOffload"]
    with capsys.disabled():
        print()
        print(render(rows))


@pytest.mark.parametrize("gpus", [1, 2, 3, 4])
def test_eth_table3_offload_trains_d5120_on_one_to_four_gh200(cal, gpus):
    """Steiger et al. 2025, Table 3: ZeRO-3 with ZeRO-Offload or SuperOffload trains d_model 5120
    (the largest they tried) on 1-4 GPUs of a quad node; plain ZeRO-0 does not at any count."""
    base = dict(gpus=gpus, zero=3, micro_batch=1, seq=2048, framework="deepspeed")
    for extra in (dict(offload=["optimizer"]), dict(**SUPEROFFLOAD, offload_ratio=0.8)):
        assert simulate(eth_model(5120), QUAD, plan_from_dict({**base, **extra}), cal, keep_timeline=False).fits
    assert not simulate(eth_model(5120), QUAD, plan_from_dict({**base, "zero": 0}), cal, keep_timeline=False).fits


def test_superoffload_llama70b_on_four_gh200(cal):
    """Lian et al. 2025 (DeepSpeed blog): Llama-3-70B fine-tunes on 4x GH200 with SuperOffload.
    Assumed as in the single-GPU scripts: ZeRO-3, ratio 0.9, full recompute, micro-batch 1, seq 4096.
    It fits on GH200s with 480 GB of LPDDR5X each; a quad node's 4 x 128 GB cannot hold the
    offloaded fp32 masters, moments and gradients (16 B per parameter: 1016 GB at ratio 0.9)."""
    plan = plan_from_dict(dict(gpus=4, zero=3, micro_batch=1, seq=4096, recompute="full", framework="deepspeed",
                               offload_ratio=0.9, **SUPEROFFLOAD))
    llama70 = load_model("llama-3-70b")
    assert simulate(llama70, load_hardware("gh200-96gb"), plan, cal, keep_timeline=False).fits
    with pytest.raises(GhsimError, match="host memory per node"):
        simulate(llama70, QUAD, plan, cal, keep_timeline=False)
