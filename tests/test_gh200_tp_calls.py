"""Issue 16: the Grace host's seconds per tensor-parallel collective call (torch.distributed through
ProcessGroupNCCL on the training thread), `[launch] tp_collective_call_us` of the GH200 profiles.

The figure is derived from Sailor's published per-layer profile on GH200 (the same rows
hardware_profiles/calibration/gh200_measured_blocks.toml holds): a host-bound decoder block forward at
TP > 1 issues the TP 1 block's kernels plus two all-reduce calls, so the difference over the two calls is
the host seconds per call. Profiles without a measured figure (the x86 hosts) price no call.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from ghsim.cost import measured_blocks
from ghsim.cost.calibration import load_calibration
from ghsim.cost.compute import CostModel
from ghsim.errors import GhsimError
from ghsim.graph.ops import Category, Collective, Kind, Op, Resource
from ghsim.hardware import load_hardware
from ghsim.simulate import simulate
from ghsim.tomlio import read_toml
from ghsim.validate.cases import case_model, load_case, load_tolerances

SAILOR = Path(__file__).resolve().parents[1] / "validation" / "published" / "sailor2025-clariden"
GH200 = ("gh200-96gb", "gh200-96gb-quad", "gh200-144gb")
# Megatron's block forward at TP > 1: RowParallelLinear's all-reduce after the attention dense and after fc2
CALLS_PER_BLOCK_FORWARD = 2


def _forward(tp: int, mb: int) -> float:
    rows = read_toml(measured_blocks.TABLE)[f"tp{tp}"]["block"]
    return dict(zip(rows["micro_batch"], rows["forward_s"]))[mb]


def _tp_call(calls: int = 1) -> Op:
    return Op(name="x.tp_all_reduce", category=Category.COMMUNICATION, kind=Kind.COLLECTIVE, resource=Resource.TP,
              variant=Collective.ALL_REDUCE, bytes=8e6, kernels=calls)


def test_the_figure_is_what_the_published_profile_gives():
    """(TP 2 mb 1 - TP 1 mb 1) / 2 and (TP 4 mb 2 - TP 1 mb 1) / 2, host-bound block forwards: their mean."""
    per_call = [(_forward(2, 1) - _forward(1, 1)) / CALLS_PER_BLOCK_FORWARD,
                (_forward(4, 2) - _forward(1, 1)) / CALLS_PER_BLOCK_FORWARD]
    assert per_call == pytest.approx([105e-6, 142e-6], abs=1e-6)
    for name in GH200:
        assert load_hardware(name).tp_collective_call_s == pytest.approx(statistics.mean(per_call), abs=0.5e-6)


def test_each_tp_call_costs_the_grace_host_and_an_unmeasured_host_prices_none():
    cal = load_calibration("h100")
    gh200, h100 = CostModel(load_hardware("gh200-96gb-quad"), cal), CostModel(load_hardware("h100-sxm"), cal)
    assert gh200.issue_cost(_tp_call(3), cuda_graphs=False) == pytest.approx(3 * 123.5e-6)
    assert gh200.issue_cost(_tp_call(), cuda_graphs=True) == 0.0  # replayed by the GPU
    assert h100.issue_cost(_tp_call(), cuda_graphs=False) == 0.0
    dp_call = _tp_call()._replace(resource=Resource.DP)  # not what the figure measured: not priced
    assert gh200.issue_cost(dp_call, cuda_graphs=False) == 0.0


def test_a_host_bound_tp_step_pays_every_call_and_a_tp1_step_none():
    """Sailor's micro-batch 1 TP 4 step is host-bound: 99 tensor-parallel calls per micro-batch (4 per
    block, the embedding's, the LM head's input gradient, 3 in the vocab-parallel cross entropy) add
    99 x 123.5 us to it; without tensor parallelism the figure changes nothing."""
    case = load_case(SAILOR / "cases" / "sailor-gh200x4-opt350m-tp4-pp1-dp1-mb1-gb1", load_tolerances(SAILOR))
    model = case_model(case)
    off = {"launch.tp_collective_call_us": {"value": 0.0, "source": "test: what-if"}}
    with_calls = simulate(model, load_hardware("gh200-96gb-quad"), case.plan, keep_timeline=False).step_time_s
    without = simulate(model, load_hardware("gh200-96gb-quad", off), case.plan, keep_timeline=False).step_time_s
    assert with_calls - without == pytest.approx(99 * 123.5e-6, rel=0.1)
    tp1 = case.plan.with_(tp=1, gpus=1)
    assert simulate(model, load_hardware("gh200-96gb-quad"), tp1, keep_timeline=False).step_time_s == \
        simulate(model, load_hardware("gh200-96gb-quad", off), tp1, keep_timeline=False).step_time_s


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_tp_call_figure_must_be_non_negative_and_finite(bad):
    with pytest.raises(GhsimError, match="tp_collective_call_us"):
        load_hardware("gh200-96gb", {"launch.tp_collective_call_us": {"value": bad, "source": "test"}})
