"""GH200 layer times from Sailor's published per-layer profile (cost/measured_blocks.py): they price the
profiled block on the profiled part only, reproduce the profiled time, and leave every other plan alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from ghsim.cost import measured_blocks
from ghsim.cost.calibration import load_calibration
from ghsim.graph.parallel import rank_templates
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Framework, Plan, Precision
from ghsim.plan_build import RankPricing
from ghsim.simulate import prepare, simulate
from ghsim.validate.cases import case_model, load_case, load_tolerances

SAILOR = Path(__file__).resolve().parents[1] / "validation" / "published" / "sailor2025-clariden"


@pytest.fixture(scope="module")
def sailor_case():
    return load_case(SAILOR / "cases" / "sailor-gh200x8-opt350m-tp4-pp2-dp1-mb8-gb32", load_tolerances(SAILOR))


@pytest.fixture(scope="module")
def quad():
    return load_hardware("gh200-96gb-quad")


def test_the_profiled_block_on_the_profiled_part_is_covered(sailor_case, quad):
    model, plan = case_model(sailor_case), sailor_case.plan
    assert measured_blocks.applies(model, quad, plan)
    assert not measured_blocks.applies(model, load_hardware("h100-sxm"), plan)  # another part
    assert not measured_blocks.applies(model, quad, plan.with_(precision=Precision.FP32))  # ghsim's fp32: no TF32
    assert not measured_blocks.applies(model, quad, plan.with_(precision=Precision.BF16))
    assert not measured_blocks.applies(model, quad, plan.with_(framework=Framework.MEGATRON))  # flash attention
    assert not measured_blocks.applies(model, quad, plan.with_(seq=4096))
    assert not measured_blocks.applies(model, quad, plan.with_(tp=8, gpus=8, gpus_per_node=8))  # not profiled


def test_corrected_layers_take_the_measured_time(sailor_case, quad):
    """At every GPU-bound profiled micro-batch ghsim's corrected block (kernels x factor + collectives)
    is within 4% of the profiled block; the factor is a slowdown (GH200 blocks were slower than the
    H100 microbenchmarks' kernels)."""
    model, plan = case_model(sailor_case), sailor_case.plan
    build = prepare(model, quad, plan, load_calibration(quad.calibration))
    factors = set(build.rank.cost.corrections.by_name.values())
    assert len(factors) == 2 and all(2.0 < f < 3.5 for f in factors)  # block, head
    for mb, measured in measured_blocks.gpu_bound_points(plan.tp, "block"):
        ops = measured_blocks.profiled_layers(rank_templates(model, plan.with_(micro_batch=mb), build.layout))["block"]
        kernels, comm = measured_blocks.layer_prices(ops, build.rank.price)
        assert kernels + comm == pytest.approx(measured, rel=0.04)


def test_other_plans_keep_the_microbenchmark_prices(quad):
    """An 8B model on the same part (ETH's shapes) is outside the profile: no factor at all."""
    model = load_model("llama-3-8b")
    plan = Plan(gpus=4, gpus_per_node=4, tp=4, micro_batch=1, seq=2048, precision=Precision.TF32,
                framework=Framework.MEGATRON_LEGACY)
    cal = load_calibration(quad.calibration)
    pricing = RankPricing.of(quad, plan, cal)
    assert measured_blocks.corrections(model, quad, plan, pricing.cost, pricing.price,
                                       lambda p: rank_templates(model, p, pricing.layout)) is None
    assert prepare(model, quad, plan, cal).rank.cost.corrections is None


def test_the_measured_blocks_slow_the_sailor_step(sailor_case, quad):
    """The same TF32 step on an H100 profile (no profile there) is faster than on the GH200 quad node."""
    model, plan = case_model(sailor_case), sailor_case.plan
    gh = simulate(model, quad, plan).step_time_s
    h100 = simulate(model, load_hardware("h100-sxm"), plan.with_(gpus_per_node=8, gpus=8)).step_time_s
    assert gh > 1.5 * h100
