"""The compute class's bound (screen.compute_bound on several GPUs: step_floors.compute_time_floor)
answers for a whole family of plans at once, so it must hold for every member: never above a
member's simulated step, and each micro-batch's compute-stream busy time (what it schedules)
never above the member's own forward and backward spans."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ghsim.errors import GhsimError
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Framework, OffloadSchedule, Plan, Precision, Recompute
from ghsim.search.screen import compute_bound, compute_class
from ghsim.search.space import OFFLOAD_SETS
from ghsim.simulate import chunk_kinds, chunk_run, prepare, simulate
from ghsim.step_floors import _stream_busy

MODELS = {"dense": dataclasses.replace(load_model("llama-2-7b"), num_layers=8),
          "moe": dataclasses.replace(load_model("mixtral-8x7b"), num_layers=4)}
HW = {"h100": load_hardware("h100-sxm"), "gh200": load_hardware("gh200-96gb")}

layouts = st.sampled_from([(1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1), (1, 2, 2), (1, 4, 1), (1, 1, 2)])
members = st.fixed_dictionaries({
    "zero": st.sampled_from([0, 1, 2, 3]), "offload": st.sampled_from(OFFLOAD_SETS),
    "offload_ratio": st.sampled_from([1.0, 0.5]), "cuda_graphs": st.booleans(),
    "offload_schedule": st.sampled_from([OffloadSchedule.AUTO, OffloadSchedule.SUPEROFFLOAD]),
    "unified_memory": st.booleans()})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=st.sampled_from(sorted(MODELS)), hw=st.sampled_from(sorted(HW)), layout=layouts,
       precision=st.sampled_from([Precision.BF16, Precision.FP8]), recompute=st.sampled_from(list(Recompute)),
       micro_batch=st.sampled_from([1, 2]), accum=st.sampled_from([1, 2, 3, 6]), sp=st.booleans(),
       interleave=st.sampled_from([1, 2]), family=st.lists(members, min_size=1, max_size=3))
def test_a_class_bound_holds_for_every_member(cal, model, hw, layout, precision, recompute, micro_batch, accum, sp,
                                              interleave, family):
    m, h = MODELS[model], HW[hw]
    tp, pp, ep = layout
    if ep > 1 and m.moe is None:
        ep = 1
    gpus = 8
    dp = gpus // (tp * pp)
    base = Plan(gpus=gpus, seq=512, micro_batch=micro_batch, global_batch=dp * micro_batch * accum, tp=tp, pp=pp,
                ep=ep, precision=precision, recompute=recompute, sequence_parallel=sp and tp > 1,
                pp_interleave=interleave if pp > 1 else 1, framework=Framework.DEEPSPEED, optimizer_impl="fused")
    bound = None
    for fields in family:
        plan = base.with_(**fields)
        if plan.offload_schedule == OffloadSchedule.SUPEROFFLOAD and not (plan.zero == 3 and "optimizer" in plan.offload):
            plan = plan.with_(offload_schedule=OffloadSchedule.AUTO)  # (DeepSpeed runs it at ZeRO-3 only)
        if plan.unified_memory and (plan.offload or pp > 1):
            plan = plan.with_(unified_memory=False)  # (searched only as the alternative to offload)
        try:
            step = simulate(m, h, plan, cal, keep_timeline=False).step_time_s
        except GhsimError:
            continue  # a plan the simulator refuses is never ranked
        if bound is None:
            bound = compute_bound(m, h, plan, cal)
        assert bound == compute_bound(m, h, compute_class(plan), cal)  # one bound per class
        assert 0 < bound <= step * (1 + 1e-9), plan.flags()
        # what the bound schedules: each chunk's compute-stream busy time within the member's spans
        rank, cls = prepare(m, h, plan, cal), compute_class(plan)
        cls_rank = prepare(m, h, cls, cal)
        for chunk in set(chunk_kinds(rank.layout, m.num_layers)):
            kind = (chunk.first, chunk.last)
            fwd, bwd = _stream_busy(cls, cls_rank, chunk.layers, kind)
            for final in (False, True) if plan.grad_accum > 1 else (True,):
                t = chunk_run(m, h, plan, rank, chunk.layers, kind, final).times
                assert fwd <= t["t_fwd"] * (1 + 1e-9) and bwd <= (t["t_bwd"] - t["t_fwd"]) * (1 + 1e-9), plan.flags()


@settings(max_examples=60, deadline=None)
@given(pp=st.sampled_from([1, 2, 3, 4, 8]), v=st.sampled_from([1, 2, 4]), per_stage=st.integers(1, 6),
       data=st.data())
def test_stage_floors_never_exceed_the_scheduled_pipeline(pp, v, per_stage, data):
    """The closed form compute_time_floor uses instead of scheduling the pipeline: never above the
    schedule's makespan, and equal to it for the plain 1F1B of equal chunks."""
    from ghsim.graph.pipeline import ChunkTimes, StageTail
    from ghsim.graph.parallel import Layout
    from ghsim.simulate import pipeline_makespan
    from ghsim.step_floors import _stage_floor

    v = v if pp > 1 else 1
    M = per_stage * pp if v > 1 else per_stage
    times = st.floats(0.0, 1.0)
    chunks = []
    for _ in range(pp * v):
        f, b, ff, fb, s = (data.draw(times) for _ in range(5))
        chunks.append(ChunkTimes(f, b, 0.0, ff, fb, 0.0, s))
    layout = Layout.of(Plan(gpus=pp, pp=pp, pp_interleave=v), HW["h100"])
    plan = Plan(gpus=pp, pp=pp, pp_interleave=v, global_batch=M)
    scheduled = pipeline_makespan(plan, layout, chunks, [StageTail(0.0, 0.0)] * pp)
    floor = max(_stage_floor(chunks, pp, v, M, d) for d in range(pp))
    assert floor <= scheduled * (1 + 1e-9) + 1e-12
    if v == 1:
        same = [ChunkTimes(0.3, 0.6, 0.0, 0.3, 0.6, 0.0, 0.0)] * pp
        exact = pipeline_makespan(plan, layout, same, [StageTail(0.0, 0.0)] * pp)
        assert max(_stage_floor(same, pp, v, M, d) for d in range(pp)) == pytest.approx(exact, rel=1e-9)


def test_after_a_plan_that_does_not_fit_the_walk_looks_where_memory_is_smaller():
    from ghsim.search.memory_order import needs_less_hbm

    p = Plan(gpus=8, micro_batch=2, recompute=Recompute.SELECTIVE, zero=1)
    assert needs_less_hbm(p.with_(offload=frozenset({"activations"})), p)
    assert needs_less_hbm(p.with_(recompute=Recompute.FULL, micro_batch=1), p)
    assert needs_less_hbm(p.with_(zero=3), p)
    assert not needs_less_hbm(p.with_(micro_batch=4), p)
    assert not needs_less_hbm(p.with_(recompute=Recompute.NONE), p)
    assert not needs_less_hbm(p.with_(zero=0), p)


def test_a_seed_that_does_not_fit_hands_its_turn_to_smaller_neighbours():
    from ghsim.search.order import Order

    # plan 0 is the only seed; plans 1 and 2 wait behind plan 3 (lower bound) until 0 fails
    order = Order([1.0, 5.0, 6.0, 2.0], {0: 0}, [()] * 4)
    assert order.take(1, bar=float("inf")) == [0]
    order.pending.discard(0)
    order.inherit_seed(0, [2])
    assert order.take(2, bar=float("inf")) == [2, 3]
