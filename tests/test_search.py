"""The plan search: every candidate judged, the ranking honest, the output plans real.

Runs on the synthetic calibration (structure, not accuracy) and small spaces (pinned
dimensions), so each search takes a second or two.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ghsim.errors import GhsimError
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Framework, Plan, Precision, Recompute
from ghsim.search.core import memo_calibration, search
from ghsim.search.objective import Objective
from ghsim.search.screen import Evaluation, Status
from ghsim.search.space import default_space, groups, pin, searched_fields_cover_plan
from ghsim.simulate import simulate

H100 = load_hardware("h100-sxm")
SMALL = dataclasses.replace(load_model("gpt3-1.7b"), num_layers=8)  # layers repeat: 8 show every effect
BASE = Plan(gpus=1, seq=1024, global_batch=8, framework=Framework.DEEPSPEED, optimizer_impl="fused")


def small_search(cal, objective=Objective.TIME, jobs=1, base=BASE, model=SMALL, hw=H100, **pins):
    pins = {"precision": Precision.BF16, **pins}
    space = pin(default_space(model, hw, base), pins)
    return search(model, hw, base, space, objective, cal, top=3, jobs=jobs)


def test_every_plan_field_is_searched_or_given():
    assert searched_fields_cover_plan() == set()


def test_every_candidate_gets_one_verdict(cal):
    r = small_search(cal, cuda_graphs=True)
    space = pin(default_space(SMALL, H100, BASE), {"precision": Precision.BF16, "cuda_graphs": True})
    assert r.n_evaluated == space.size(BASE) == sum(r.count(s) for s in Status)
    assert len({e.plan for e in r.evaluations}) == len(r.evaluations)  # no plan judged twice
    assert r.n_feasible == len(r.ranked) > 0


def test_groups_hold_distinct_plans():
    space = default_space(load_model("llama-3-70b"), load_hardware("gh200-96gb-quad"), Plan(gpus=8, global_batch=32))
    base = Plan(gpus=8, global_batch=32)
    keys = set()
    n = 0
    for g in groups(space, base):
        key = g.base
        assert key not in keys
        keys.add(key)
        n += g.size
    assert n == space.size(base) > 2000


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(recompute=st.sampled_from([None, Recompute.FULL, Recompute.NONE]),
       offload=st.sampled_from([None, frozenset(), frozenset({"optimizer", "grads"})]),
       seq=st.sampled_from([512, 1024]), gb=st.sampled_from([4, 8]))
def test_best_under_time_is_never_slower_and_every_output_plan_fits(cal, recompute, offload, seq, gb):
    pins = {k: v for k, v in (("recompute", recompute), ("offload", offload)) if v is not None}
    r = small_search(cal, base=BASE.with_(seq=seq, global_batch=gb), cuda_graphs=True, **pins)
    feasible = [e for e in r.evaluations if e.status == Status.FEASIBLE]
    assert len(feasible) == r.n_feasible
    if not r.ranked:
        return
    best = r.ranked[0]
    assert all(best.step_time_s <= e.step_time_s for e in feasible)
    for e in r.ranked[:3]:  # the output plans: simulated in full they fit, with the numbers shown
        full = simulate(SMALL, H100, e.plan, cal, keep_timeline=False)
        assert full.fits
        assert e.exact
        assert e.step_time_s == pytest.approx(full.step_time_s, rel=2e-3)
        assert e.hbm_peak_bytes == pytest.approx(full.hbm.peak_bytes, rel=2e-3)


def test_objectives_rank_by_their_measure(cal):
    by_mem = small_search(cal, Objective.MEMORY, cuda_graphs=True, recompute=Recompute.FULL)
    peaks = [e.hbm_peak_bytes for e in by_mem.ranked]
    assert peaks == sorted(peaks)
    by_cost = small_search(cal, Objective.COST, cuda_graphs=True, recompute=Recompute.FULL)
    price = by_cost.price_per_gpu_hour
    costs = [e.usd_per_mtok(price) for e in by_cost.ranked]
    assert costs == sorted(costs) and price == H100.price_per_gpu_hour
    best = by_cost.ranked[0]
    assert best.usd_per_mtok(price) == pytest.approx(price / 3600 * 1e6 / best.tokens_per_s)


def test_unknown_objective_is_a_one_line_error():
    with pytest.raises(GhsimError, match="unknown objective 'speed'"):
        Objective.parse("speed")


def test_cost_needs_a_price(cal):
    import dataclasses

    free = dataclasses.replace(H100, price_per_gpu_hour=0.0)
    with pytest.raises(GhsimError, match="--price"):
        small_search(cal, Objective.COST, hw=free)


def test_memo_calibration_changes_nothing(cal):
    plan = BASE.with_(recompute=Recompute.FULL)
    a = simulate(SMALL, H100, plan, cal, keep_timeline=False)
    b = simulate(SMALL, H100, plan, memo_calibration(cal), keep_timeline=False)
    assert a.step_time_s == b.step_time_s and a.hbm.peak_bytes == b.hbm.peak_bytes


def test_workers_give_the_same_answer(cal):
    one = small_search(cal, cuda_graphs=True, recompute=Recompute.FULL)
    two = small_search(cal, jobs=2, cuda_graphs=True, recompute=Recompute.FULL)
    assert [(e.plan, e.step_time_s) for e in one.ranked] == [(e.plan, e.step_time_s) for e in two.ranked]
    assert {s: one.count(s) for s in Status} == {s: two.count(s) for s in Status}


def test_what_cannot_fit_is_pruned_without_simulating(cal):
    big = load_model("llama-3.1-405b")
    r = small_search(cal, model=big, recompute=Recompute.FULL, cuda_graphs=True)
    assert not r.ranked
    assert r.count(Status.PRUNED) == r.n_evaluated  # nothing simulated
    assert all("GB" in g.reason for g in r.pruned_groups)


def test_gpu_compute_bound_prunes_without_losing_the_best(cal):
    """Branch and bound: the plans set aside as 'cannot win' are slower than the best."""
    r = small_search(cal, cuda_graphs=True)
    bounded = [e for e in r.evaluations if e.status == Status.BOUNDED]
    best = r.ranked[0].step_time_s
    for e in bounded[:5]:
        full = simulate(SMALL, H100, e.plan, cal, keep_timeline=False)
        assert full.step_time_s > best or not full.fits
    assert not math.isnan(best)


def test_bounds_and_dominance_never_change_the_ranking(cal, monkeypatch):
    """Multi-GPU: the same top plans, and no plan wrongly said not to fit, as a search that
    simulates every survivor in full (no branch and bound, no 'needs at least the memory of')."""
    import ghsim.search.best_first as best_first
    from ghsim.search.memory_order import NoFit

    model, hw = dataclasses.replace(load_model("llama-2-7b"), num_layers=8), load_hardware("a100-sxm-40gb")
    # (seq 8192: the class bounds set aside every plan of seq 4096 that would not fit before simulating it)
    base = Plan(gpus=4, seq=8192, global_batch=16, framework=Framework.DEEPSPEED, optimizer_impl="fused")
    pins = dict(cuda_graphs=True, tp=1, pp=2, offload_ratio=1.0)
    fast = small_search(cal, base=base, model=model, hw=hw, **pins)
    assert fast.count(Status.BOUNDED) > 0 and fast.count(Status.NO_FIT) > 0
    monkeypatch.setattr(best_first, "SCREEN_TOLERANCE", math.inf)
    monkeypatch.setattr(NoFit, "dominates", lambda self, p: "")
    full = small_search(cal, base=base, model=model, hw=hw, **pins)
    assert full.count(Status.BOUNDED) == 0
    assert [(e.plan, e.step_time_s) for e in fast.ranked[:3]] == [(e.plan, e.step_time_s) for e in full.ranked[:3]]
    verdict = {e.plan: e.status for e in full.evaluations}
    assert all(verdict[e.plan] == Status.NO_FIT for e in fast.evaluations if e.status == Status.NO_FIT)


def test_a_time_limit_leaves_the_rest_unexplored(cal):
    space = pin(default_space(SMALL, H100, BASE), {"precision": Precision.BF16})
    r = search(SMALL, H100, BASE, space, Objective.TIME, cal, top=3, jobs=1, time_limit=1e-6)
    left = r.count(Status.UNEXPLORED)
    assert left > 0 and r.n_evaluated == r.n_candidates - left
    assert all(e.status != Status.FEASIBLE for e in r.evaluations if "time limit" in e.reason)


@pytest.mark.parametrize("smaller,bigger", [
    ({"offload": frozenset({"optimizer", "grads", "activations"})}, {"offload": frozenset({"optimizer", "grads"})}),
    ({"offload": frozenset({"optimizer", "grads"}), "offload_ratio": 1.0},
     {"offload": frozenset({"optimizer", "grads"}), "offload_ratio": 0.5}),
    ({"micro_batch": 1, "recompute": Recompute.FULL}, {"micro_batch": 2, "recompute": Recompute.NONE}),
])
def test_memory_order_the_search_relies_on(cal, smaller, bigger):
    """A plan that does not fit rules out the plans 'bigger' than it (search.memory_order.NoFit)."""
    base = Plan(gpus=4, pp=2, seq=1024, global_batch=8, framework=Framework.DEEPSPEED, optimizer_impl="fused")
    a = simulate(SMALL, H100, base.with_(**smaller), cal, keep_timeline=False)
    b = simulate(SMALL, H100, base.with_(**bigger), cal, keep_timeline=False)
    assert a.hbm.peak_bytes <= b.hbm.peak_bytes * 1.001


OFFLOADED = frozenset({"optimizer", "grads", "activations"})


@pytest.mark.parametrize("smaller,bigger", [
    ({"offload": frozenset({"optimizer", "grads"})}, {"offload": OFFLOADED}),
    ({"offload": frozenset({"optimizer", "grads"}), "offload_ratio": 0.5},
     {"offload": frozenset({"optimizer", "grads"}), "offload_ratio": 1.0}),
    ({"micro_batch": 1, "recompute": Recompute.FULL}, {"micro_batch": 2, "recompute": Recompute.NONE}),
])
def test_host_memory_order_the_search_relies_on(cal, smaller, bigger):
    """Host memory grows the other way with what is offloaded: a plan that overflows the host
    rules out those offloading more (search.memory_order.NoFit), not those offloading less."""
    base = Plan(gpus=4, pp=2, seq=1024, global_batch=8, framework=Framework.DEEPSPEED, optimizer_impl="fused",
                zero=2, offload=OFFLOADED)
    a = simulate(SMALL, H100, base.with_(**smaller), cal, keep_timeline=False)
    b = simulate(SMALL, H100, base.with_(**bigger), cal, keep_timeline=False)
    assert a.host.peak_bytes <= b.host.peak_bytes * 1.001


def test_a_host_overflow_does_not_rule_out_offloading_less(cal):
    from ghsim.search.memory_order import NoFit

    hw = H100
    no_fit = NoFit(hw)
    plan = Plan(gpus=4, zero=2, offload=OFFLOADED | {"params"})
    no_fit.add(Evaluation(plan, Status.NO_FIT, hbm_peak_bytes=1e9, host_peak_bytes=2 * hw.host.capacity_bytes))
    assert no_fit.dominates(plan.with_(micro_batch=2)).startswith("host memory of micro-batch 1")
    assert not no_fit.dominates(plan.with_(offload=OFFLOADED))  # less on the host: may fit
    assert not no_fit.dominates(plan.with_(zero=3))
    no_fit.add(Evaluation(plan, Status.NO_FIT, hbm_peak_bytes=2 * hw.hbm.capacity_bytes, host_peak_bytes=1e9))
    assert no_fit.dominates(plan.with_(offload=OFFLOADED)).startswith("HBM memory of")


def test_cuda_graphs_never_slow_a_plan_or_change_its_memory(cal):
    for kw in ({}, {"offload": frozenset({"optimizer", "grads"})}, {"gpus": 2, "zero": 2, "global_batch": 16}):
        plan = BASE.with_(**kw)
        off = simulate(SMALL, H100, plan, cal, keep_timeline=False)
        on = simulate(SMALL, H100, plan.with_(cuda_graphs=True), cal, keep_timeline=False)
        assert on.step_time_s <= off.step_time_s * (1 + 1e-9)
        assert on.hbm.peak_bytes == pytest.approx(off.hbm.peak_bytes)


def test_plan_with_is_dataclasses_replace():
    """Plan.with_ skips dataclasses.replace for speed: same values, equality and hash; unknown fields refused."""
    p = Plan(gpus=8, zero=2, offload=frozenset({"optimizer"}))
    changes = {"micro_batch": 4, "recompute": Recompute.FULL, "cuda_graphs": True}
    q = p.with_(**changes)
    assert q == dataclasses.replace(p, **changes) and hash(q) == hash(dataclasses.replace(p, **changes))
    assert p.micro_batch == 1 and q.grad_accum == dataclasses.replace(p, **changes).grad_accum
    with pytest.raises(TypeError, match="no field"):
        p.with_(micro_batches=2)


def test_explanation_shows_the_nearest_value_that_loses():
    """'nearest plans that lose': of micro-batches 8 and 2 that do not fit, the one next to the best's 1."""
    from ghsim.search.core import SearchResult
    from ghsim.search.explain import why_best

    best = Evaluation(BASE.with_(micro_batch=1), Status.FEASIBLE, step_time_s=1.0, tokens_per_s=1.0,
                      hbm_peak_bytes=1e9)
    lost = [Evaluation(BASE.with_(micro_batch=m), Status.NO_FIT, f"HBM peak at micro-batch {m}") for m in (8, 2)]
    r = SearchResult(SMALL, H100, BASE, Objective.TIME, 1.0, (best,), (best, *lost), (), 3, 0.0, 1)
    lines = why_best(r)
    shown = [line for line in lines if line.strip().startswith("micro batch")]
    assert shown == ["  micro batch 2: does not fit: HBM peak at micro-batch 2"]


def test_best_first_screening_can_reach_every_survivor():
    """With a time limit, screening walks from seeds to their neighbours (one searched
    choice away). Every survivor must be reachable that way; a layout missing from the
    seeds (expert parallelism once was) left the best MoE plans unexplored."""
    from ghsim.search.core import _prune, _Ticker, _valid
    from ghsim.search.order import neighbours, seed_tiers

    model, hw = load_model("mixtral-8x7b"), H100
    base = dataclasses.replace(BASE, gpus=8, global_batch=32)
    space = pin(default_space(model, hw, base), {"precision": Precision.BF16, "cuda_graphs": True,
                                                  "recompute": Recompute.FULL})
    _, survivors, _ = _prune(model, hw, groups(space, base), _Ticker(None, 0))
    plans = [p for p, _ in _valid(model, hw, survivors, _Ticker(None, 0))[0]]
    assert len({p.ep for p in plans}) > 1 and len({p.tp for p in plans}) > 1
    index = {p: j for j, p in enumerate(plans)}
    reached = set(seed_tiers(plans, [0.0] * len(plans), [()] * len(plans)))
    frontier, tables = list(reached), {}
    while frontier:
        for q in neighbours(plans[frontier.pop()], index, tables):
            if q not in reached:
                reached.add(q)
                frontier.append(q)
    assert len(reached) == len(plans), {(p.tp, p.pp, p.ep) for j, p in enumerate(plans) if j not in reached}


def test_screening_order_alternates_and_exploits_only_near_the_top():
    """Seeds (by tier) and neighbours of good plans are taken in turn; a neighbour of a plan
    slower than the top plans' bar waits; stale entries (improved or settled) are dropped."""
    from ghsim.search.order import Order

    keys = [1.0] * 6
    order = Order(keys, {0: 0, 1: 1}, [(j,) for j in range(6)])
    assert order.take(2, math.inf) == [0, 1]  # no neighbours yet: seeds by tier, then the rest
    order.put_back([0, 1])
    order.near(4, 10.0)
    order.near(5, 30.0)
    order.near(4, 8.0)  # improved: the 10.0 entry is stale
    assert order.take(4, bar=20.0) == [4, 0, 1, 2]  # 5 neighbours a plan above the bar: explore instead
    order.pending.difference_update([4, 0])
    order.put_back([1, 2])
    assert order.take(6, bar=40.0) == [5, 1, 2, 3]


def test_class_bounds_prefetched_while_pruning_are_those_computed_when_asked(cal):
    """Without a time limit the workers compute compute-class bounds while the main process
    prunes (_Runner.prefetch_bounds); bounds() must hand out the same numbers as computing
    them when asked, and a plan the simulator refuses (whose class may not schedule) must not
    reach the workers."""
    from ghsim.search.core import _prune, _Runner, _Ticker, _valid
    from ghsim.search.screen import compute_class

    base = dataclasses.replace(BASE, gpus=8, global_batch=32)
    space = pin(default_space(SMALL, H100, base), {"precision": Precision.BF16, "cuda_graphs": True})
    memo = memo_calibration(cal)
    with _Runner(SMALL, H100, memo, 2) as ahead:
        _, survivors, _ = _prune(SMALL, H100, groups(space, base), _Ticker(None, 0), found=ahead.prefetch_bounds)
        valid = [p for p, _ in _valid(SMALL, H100, survivors, _Ticker(None, 0))[0]]
        assert 0 < len(valid) < len(survivors)  # (some refused: the filter is exercised)
        classes = list(dict.fromkeys(map(compute_class, valid)))
        assert ahead._asked == set(classes)
        prefetched = ahead.bounds(classes)
        assert set(ahead._prefetched) == set(classes)  # every one came from the workers
    with _Runner(SMALL, H100, memo, 1) as asked:
        assert prefetched == asked.bounds(classes)
