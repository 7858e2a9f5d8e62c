"""Uneven pipeline splits (--pp-layers): each stage built with its own decoder layers, the schedule
fed each stage's times, memory per stage; an even split stated explicitly changes nothing."""

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from ghsim.cli import main
from ghsim.errors import GhsimError
from ghsim.plan import Plan, plan_from_dict
from ghsim.plan_toml import plan_to_toml
from ghsim.simulate import chunk_kinds, chunk_run, prepare, simulate
from test_multigpu_properties import CAL, H100, SETTINGS, TINY  # TINY: 8 decoder layers


def splits(pp: int):
    """Decoder layers per stage adding up to TINY's 8, each stage at least one: pp - 1 cut points."""
    def layers(cuts):
        bounds = [0, *sorted(cuts), TINY.num_layers]
        return [b - a for a, b in zip(bounds, bounds[1:])]
    return st.lists(st.integers(1, TINY.num_layers - 1), min_size=pp - 1, max_size=pp - 1, unique=True).map(layers)


@SETTINGS
@given(data=st.data(), pp=st.sampled_from([2, 4]), m=st.integers(1, 5))
def test_a_split_step_is_at_least_its_slowest_stage_work(data, pp, m):
    """Each stage runs its micro-batches one after another on its compute stream: the step lasts at least
    the busiest stage's forwards and backwards, each priced by its own chunk's kernel-level run."""
    split = tuple(data.draw(splits(pp)))
    plan = Plan(gpus=pp, pp=pp, pp_layers=split, seq=256, global_batch=m)
    step = simulate(TINY, H100, plan, CAL, keep_timeline=False).step_time_s
    rank = prepare(TINY, H100, plan, CAL)
    work = []
    for chunk in chunk_kinds(rank.layout, TINY.num_layers):
        assert chunk.layers == split[len(work)]
        final = chunk_run(TINY, H100, plan, rank, chunk.layers, (chunk.first, chunk.last), True).times["t_bwd"]
        middle = chunk_run(TINY, H100, plan, rank, chunk.layers, (chunk.first, chunk.last), False).times["t_bwd"]
        work.append(final + (m - 1) * middle)
    assert step >= max(work) * (1 - 1e-9)


@pytest.mark.parametrize("pp, m", [(2, 4), (4, 6)])
def test_an_even_split_stated_equals_the_default_exactly(pp, m):
    base = Plan(gpus=pp, pp=pp, seq=256, global_batch=m)
    stated = base.with_(pp_layers=(TINY.num_layers // pp,) * pp)
    a, b = (simulate(TINY, H100, p, CAL, keep_timeline=False) for p in (base, stated))
    assert a.step_time_s == b.step_time_s
    assert a.hbm.peak_bytes == b.hbm.peak_bytes
    assert a.time_breakdown_s == b.time_breakdown_s


def test_memory_is_per_stage_and_the_fuller_stage_holds_more():
    """Stage 1 with 7 of 8 layers holds more model state and activations than with 1; the reported
    peak is the worst stage's."""
    def stages(split):
        report = simulate(TINY, H100, Plan(gpus=2, pp=2, pp_layers=split, seq=256, global_batch=4), CAL,
                          keep_timeline=False)
        par = report.extra["parallel"]
        assert par["stage_layers"] == list(split)
        assert report.hbm.peak_bytes == max(s["hbm_peak_bytes"] for s in par["stages"])
        return par["stages"]

    heavy_last, light_last = stages((1, 7)), stages((7, 1))
    assert heavy_last[1]["hbm_peak_bytes"] > light_last[1]["hbm_peak_bytes"]
    assert heavy_last[0]["hbm_peak_bytes"] < light_last[0]["hbm_peak_bytes"]


def test_the_split_round_trips_through_flags_dict_and_plan_toml():
    plan = Plan(gpus=4, pp=4, pp_layers=(1, 3, 3, 1))
    assert "--pp-layers 1,3,3,1" in plan.flags()
    assert plan_from_dict({"gpus": 4, "pp": 4, "pp_layers": plan.to_dict()["pp_layers"]}).pp_layers == (1, 3, 3, 1)
    assert "pp_layers = [1, 3, 3, 1]" in plan_to_toml(plan)
    assert "pp_layers" not in plan_to_toml(Plan()) and "pp_layers" not in Plan().to_dict()


@pytest.mark.parametrize("flags, says", [
    (["--pp", "2", "--pp-layers", "3,3"], "adds up to 6 decoder layers; llama-3-8b has 32"),
    (["--pp", "2", "--pp-layers", "32"], "lists 1 stage(s) but --pp is 2"),
    (["--pp", "2", "--pp-layers", "0,32"], "at least 1 decoder layer"),
    (["--pp", "2", "--pp-layers", "4,x"], "whole numbers"),
    (["--pp", "2", "--pp-interleave", "2", "--pp-layers", "16,16"], "--pp-interleave is not modeled"),
])
def test_bad_splits_are_one_line_errors(flags, says):
    result = CliRunner().invoke(main, ["simulate", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "2",
                                       "--global-batch", "4", *flags])
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output


def test_the_plan_search_refuses_a_fixed_split():
    result = CliRunner().invoke(main, ["plan", "--model", "llama-3-8b", "--gpus", "8", "--pp-layers", "16,16"])
    assert result.exit_code == 2 and "searches even splits" in result.output


def test_parse_rejects_non_lists():
    with pytest.raises(GhsimError):
        plan_from_dict({"pp": 2, "gpus": 2, "pp_layers": 7})


def test_blocking_sends_hold_the_sending_stage():
    """Megatron-LM 2021-22 (and DeepSpeed's PipelineEngine) wait for each send before computing on:
    with sends on the stage's own GPU the step grows by at least one send."""
    from dataclasses import replace

    from ghsim.graph.pipeline import ChunkTimes, StageTail
    from ghsim.sim.pipeline import schedule_pipeline

    pp, M, send = 4, 8, 0.01
    chunks = [ChunkTimes(0.1, 0.2, 0.0, 0.1, 0.2, 0.0, send)] * pp
    tails = [StageTail(0.0, 0.0)] * pp
    overlapped = schedule_pipeline(pp, 1, M, chunks, tails).schedule.makespan
    blocking = schedule_pipeline(pp, 1, M, [replace(c, send_blocks=True) for c in chunks], tails).schedule.makespan
    assert blocking >= overlapped + send - 1e-12
