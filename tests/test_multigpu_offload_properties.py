"""Properties of offload with several GPUs that hold for any plan (hypothesis, synthetic calibration):

- offload never raises the per-GPU HBM peak;
- a faster host link never slows a step;
- sharing one host among more GPUs (its cores, memory bandwidth and links) never speeds a step.

GHSIM_PROPERTY_EXAMPLES=200 searches harder (random seeds) than the fast default run (< 30 s).
"""

from __future__ import annotations

import dataclasses
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ghsim.cost.hostlink import HostSide
from ghsim.hardware import load_hardware
from ghsim.model import ModelSpec
from ghsim.plan import OffloadSchedule, plan_from_dict
from ghsim.simulate import simulate
from ghsim.simulate import prepare, simulate_prepared
from ghsim.step_floors import step_time_floor
from synthetic import synthetic_calibration
from test_offload_properties import faster_link  # the same faster link as on one GPU

CAL = synthetic_calibration()
TINY = ModelSpec(name="tiny", hidden_size=512, intermediate_size=1408, num_layers=4, num_attention_heads=8,
                 num_kv_heads=4, head_dim=64, vocab_size=8000)
PROFILES = {name: load_hardware(name) for name in ("h100-sxm", "gh200-96gb-quad", "h100-pcie")}
EXAMPLES = int(os.environ.get("GHSIM_PROPERTY_EXAMPLES", "30"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize="GHSIM_PROPERTY_EXAMPLES" not in os.environ,
                    suppress_health_check=[HealthCheck.too_slow])

plans = st.fixed_dictionaries({
    "layout": st.sampled_from([(2, 1, 1), (4, 1, 1), (4, 2, 1), (4, 1, 2)]),  # gpus, tp, pp
    "zero": st.integers(0, 3),
    "accumulate": st.booleans(),
    "recompute": st.sampled_from(["none", "full"]),
    "framework": st.sampled_from(["torch-amp", "deepspeed", "fsdp-mixed"]),
    "offload": st.sets(st.sampled_from(["optimizer", "params", "activations"]), min_size=1),
    "offload_schedule": st.sampled_from(["auto", "sync", "overlapped", "superoffload"]),
    "offload_ratio": st.sampled_from([1.0, 0.8, 0.5]),
    "offload_pinned": st.booleans(),
})


def make(d: dict):
    gpus, tp, pp = d["layout"]
    dp = gpus // (tp * pp)
    offload = set(d["offload"])
    if d["offload_schedule"] == "superoffload":
        offload.add("optimizer")
    zero = d["zero"]
    if "params" in offload and dp > 1:
        zero = 3  # parameter offload shards over data-parallel ranks (ZeRO-Infinity, FSDP)
    return plan_from_dict({
        "gpus": gpus, "tp": tp, "pp": pp, "zero": zero, "seq": 256, "recompute": d["recompute"],
        "framework": d["framework"], "offload": sorted(offload), "offload_schedule": d["offload_schedule"],
        "offload_ratio": d["offload_ratio"], "offload_pinned": d["offload_pinned"],
        "global_batch": dp * 2 * pp if d["accumulate"] else 0,
    })


@SETTINGS
@given(plans, st.sampled_from(sorted(PROFILES)))
def test_offload_never_raises_the_per_gpu_hbm_peak(d, hw_name):
    plan, hw = make(d), PROFILES[hw_name]
    with_offload = simulate(TINY, hw, plan, CAL, keep_timeline=False)
    without = simulate(TINY, hw, plan.with_(offload=frozenset(), offload_schedule=OffloadSchedule.AUTO), CAL,
                       keep_timeline=False)
    assert with_offload.hbm.peak_bytes <= without.hbm.peak_bytes * (1 + 1e-9)


@SETTINGS
@given(plans, st.sampled_from(sorted(PROFILES)), st.floats(1.0, 16.0))
def test_faster_host_link_never_slows_a_multi_gpu_step(d, hw_name, k):
    plan, hw = make(d), PROFILES[hw_name]
    slow = simulate(TINY, hw, plan, CAL, keep_timeline=False)
    fast = simulate(TINY, faster_link(hw, k), plan, CAL, keep_timeline=False)
    assert fast.step_time_s <= slow.step_time_s * (1 + 1e-9)


@SETTINGS
@given(plans, st.sampled_from(sorted(PROFILES)), st.integers(1, 4), st.integers(1, 4))
def test_sharing_one_host_among_more_gpus_never_speeds_a_step(d, hw_name, more_on_host, more_on_link):
    plan, hw = make(d), PROFILES[hw_name]
    mine = HostSide.of(hw, plan, CAL)
    shared = dataclasses.replace(mine, node_gpus=mine.node_gpus * more_on_host,
                                 link_sharers=mine.link_sharers * more_on_link)
    alone = simulate_prepared(TINY, hw, plan, CAL, keep_timeline=False, host_side=mine).step_time_s
    crowded = simulate_prepared(TINY, hw, plan, CAL, keep_timeline=False, host_side=shared).step_time_s
    assert crowded >= alone * (1 - 1e-9)


@SETTINGS
@given(plans, st.integers(2, 4))
def test_more_gpus_behind_one_pcie_switch_never_speed_a_step(d, sharing):
    """The same, through the profile: a PCIe host whose GPUs pair up behind switches."""
    plan, hw = make(d), PROFILES["h100-sxm"]
    switched = dataclasses.replace(hw, host_link=dataclasses.replace(hw.host_link, gpus_sharing=sharing))
    alone = simulate(TINY, hw, plan, CAL, keep_timeline=False).step_time_s
    crowded = simulate(TINY, switched, plan, CAL, keep_timeline=False).step_time_s
    assert crowded >= alone * (1 - 1e-9)


@SETTINGS
@given(plans, st.sampled_from(sorted(PROFILES)), st.booleans())
def test_the_search_floor_never_exceeds_the_step(d, hw_name, interleave):
    """step_time_floor, which lets the plan search set a plan aside, is at most its simulated step."""
    plan, hw = make(d), PROFILES[hw_name]
    if interleave and plan.pp > 1 and plan.grad_accum % plan.pp == 0:
        plan = plan.with_(pp_interleave=2)
    floor = step_time_floor(TINY, hw, plan, prepare(TINY, hw, plan, CAL))
    step = simulate(TINY, hw, plan, CAL, keep_timeline=False).step_time_s
    assert floor <= step * (1 + 1e-9)
    assert floor > 0  # never vacuous: the last micro-batch bounds it too
