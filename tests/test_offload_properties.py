"""Properties of the host-side model that hold for any plan (hypothesis):

- a faster host link never slows a step;
- offload never raises the HBM peak;
- NVLink-C2C never loses to PCIe for the same plan on the same GPU.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ghsim.hardware import load_hardware
from ghsim.model import model_from_dict
from ghsim.plan import OffloadSchedule, plan_from_dict
from ghsim.simulate import simulate

TINY = model_from_dict(dict(name="tiny", hidden_size=512, intermediate_size=1408, num_layers=4,
                            num_attention_heads=8, num_kv_heads=4, vocab_size=8000), "test")
PROFILES = {name: load_hardware(name) for name in ("h100-pcie", "gh200-96gb", "h100-sxm")}
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

plans = st.fixed_dictionaries({
    "seq": st.sampled_from([256, 512, 1024]),
    "micro_batch": st.integers(1, 2),
    "global_batch": st.sampled_from([0, 0, 2]),
    "recompute": st.sampled_from(["none", "selective", "full"]),
    "framework": st.sampled_from(["torch-amp", "deepspeed", "fsdp-mixed"]),
    "offload": st.sets(st.sampled_from(["optimizer", "grads", "params", "activations"]), min_size=1),
    "offload_schedule": st.sampled_from(["auto", "sync", "overlapped", "superoffload"]),
    "offload_ratio": st.sampled_from([1.0, 0.9, 0.5, 0.0]),
    "offload_pinned": st.booleans(),
    "lora_rank": st.sampled_from([0, 0, 8]),
})


def make(d: dict):
    d = dict(d)
    if d["global_batch"]:
        d["global_batch"] = d["micro_batch"] * 2
    if d["offload_schedule"] == "superoffload":
        d["offload"] = set(d["offload"]) | {"optimizer"}
    d["offload"] = sorted(d["offload"])
    return plan_from_dict(d)


def faster_link(hw, k: float):
    link = hw.host_link
    return dataclasses.replace(hw, host_link=dataclasses.replace(
        link, h2d_pinned=link.h2d_pinned * k, d2h_pinned=link.d2h_pinned * k, h2d_pageable=link.h2d_pageable * k,
        d2h_pageable=link.d2h_pageable * k, bidirectional_total=link.bidirectional_total * k,
        in_place_read=link.in_place_read * k, latency_s=link.latency_s / k))


@SETTINGS
@given(plans, st.sampled_from(sorted(PROFILES)), st.floats(1.0, 16.0))
def test_faster_host_link_never_slows_a_step(cal, d, hw_name, k):
    plan, hw = make(d), PROFILES[hw_name]
    slow = simulate(TINY, hw, plan, cal, keep_timeline=False)
    fast = simulate(TINY, faster_link(hw, k), plan, cal, keep_timeline=False)
    assert fast.step_time_s <= slow.step_time_s * (1 + 1e-9)


@SETTINGS
@given(plans, st.sampled_from(sorted(PROFILES)))
def test_offload_never_raises_the_hbm_peak(cal, d, hw_name):
    plan, hw = make(d), PROFILES[hw_name]
    with_offload = simulate(TINY, hw, plan, cal, keep_timeline=False)
    without = simulate(TINY, hw, plan.with_(offload=frozenset(), offload_schedule=OffloadSchedule.AUTO), cal,
                       keep_timeline=False)
    assert with_offload.hbm.peak_bytes <= without.hbm.peak_bytes * (1 + 1e-9)


@SETTINGS
@given(plans, st.booleans())
def test_c2c_never_loses_to_pcie(cal, d, unified):
    plan = make(d).with_(unified_memory=unified)
    gh = PROFILES["gh200-96gb"]
    pcie_link = dataclasses.replace(gh, host_link=PROFILES["h100-pcie"].host_link)  # same GPU, CPU, memory
    c2c = simulate(TINY, gh, plan, cal, keep_timeline=False)
    pcie = simulate(TINY, pcie_link, plan, cal, keep_timeline=False)
    # SuperOffload's Superchip-aware casting issues a few more ops on C2C (casts on the GPU); when
    # Grace's launch path bounds the step (host_path_factor), those launches can cost more than the
    # faster link saves: at most a few launches
    assert c2c.step_time_s <= pcie.step_time_s * (1 + 1e-9) + 4 * gh.kernel_launch_s
