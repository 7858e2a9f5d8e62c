"""The step floors the plan search sets plans aside with (ghsim/step_floors.py) never exceed the
step the search would simulate (simulate_prepared of the same plan), for any plan of the
searched kind: layouts with pipeline stages (interleaved too), ZeRO stages, every offload set,
split and whole optimizers, SuperOffload, gradient accumulation or none. And their parts
hold where they are used: the CPU AdamW floor is the final graph's own AdamW time (whole
optimizer on the host) or 0, the final micro-batch's floor lies within its run."""

from __future__ import annotations

import dataclasses
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ghsim.errors import GhsimError
from ghsim.graph import ops as K
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Framework, OffloadSchedule, Plan, Recompute
from ghsim.search.space import OFFLOAD_SETS
from ghsim.simulate import check_fit_to_model, chunk_graph, chunk_kinds, chunk_run, prepare, simulate_prepared
from ghsim.step_floors import cpu_optimizer_floor, final_microbatch_floor, step_time_floor

EXAMPLES = int(os.environ.get("GHSIM_PROPERTY_EXAMPLES", "60"))  # (200: a harder search, random seeds)
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize="GHSIM_PROPERTY_EXAMPLES" not in os.environ,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
MODEL = dataclasses.replace(load_model("llama-2-7b"), num_layers=8)
HW = {"h100": load_hardware("h100-sxm"), "gh200": load_hardware("gh200-96gb")}

plans = st.fixed_dictionaries({
    "layout": st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2), (1, 4), (4, 2)]),  # tp, pp on 8 GPUs
    "interleave": st.sampled_from([1, 2]),
    "zero": st.sampled_from([0, 1, 2, 3]), "offload": st.sampled_from(OFFLOAD_SETS),
    "offload_ratio": st.sampled_from([1.0, 0.5]), "cuda_graphs": st.booleans(),
    "offload_schedule": st.sampled_from([OffloadSchedule.AUTO, OffloadSchedule.SUPEROFFLOAD]),
    "recompute": st.sampled_from(list(Recompute)), "micro_batch": st.sampled_from([1, 2]),
    "accum": st.sampled_from([1, 2, 3, 8])})


def make(d: dict) -> Plan:
    tp, pp = d["layout"]
    dp = 8 // (tp * pp)
    zero = 3 if "params" in d["offload"] and dp > 1 else d["zero"]  # (parameter offload shards: ZeRO-3)
    plan = Plan(gpus=8, seq=512, tp=tp, pp=pp, pp_interleave=d["interleave"] if pp > 1 else 1, zero=zero,
                offload=d["offload"], offload_ratio=d["offload_ratio"] if "optimizer" in d["offload"] else 1.0,
                offload_schedule=d["offload_schedule"], recompute=d["recompute"], cuda_graphs=d["cuda_graphs"],
                micro_batch=d["micro_batch"], global_batch=dp * d["micro_batch"] * d["accum"],
                framework=Framework.DEEPSPEED, optimizer_impl="fused")
    if plan.offload_schedule == OffloadSchedule.SUPEROFFLOAD and not (plan.zero == 3 and "optimizer" in plan.offload):
        plan = plan.with_(offload_schedule=OffloadSchedule.AUTO)  # (DeepSpeed runs it at ZeRO-3 only)
    return plan


def prepared(cal, d: dict, hw: str):
    """The plan, its hardware and its PlanBuild; None for a plan the simulator refuses (never ranked)."""
    plan, h = make(d), HW[hw]
    try:
        check_fit_to_model(MODEL, h, plan)
        return plan, h, prepare(MODEL, h, plan, cal)
    except GhsimError:
        return None


@SETTINGS
@given(d=plans, hw=st.sampled_from(sorted(HW)))
def test_step_floors_hold(cal, d, hw):
    if (got := prepared(cal, d, hw)) is None:
        return
    plan, h, rank = got
    # the parts, where they are used: within the last micro-batch of each kind of chunk
    whole = "optimizer" in plan.offload and plan.offload_ratio == 1.0
    busiest = final_microbatch_floor(MODEL, h, plan, rank)
    for chunk in set(chunk_kinds(rank.layout, MODEL.num_layers)):
        kind = (chunk.first, chunk.last)
        adamw = sum(rank.prices(op) for op in chunk_graph(MODEL, plan, rank, chunk.layers, kind, True).graph.ops
                    if op.kind == K.OPT_CPU)
        cpu = cpu_optimizer_floor(MODEL, plan, rank, chunk)
        assert cpu <= adamw and (cpu > adamw * (1 - 1e-6) if whole else cpu == 0.0), plan.flags()
        run = chunk_run(MODEL, h, plan, rank, chunk.layers, kind, True)
        assert busiest[chunk] <= run.times["makespan"] and cpu <= run.times["makespan"], plan.flags()
    # the whole floor, what the search compares (what it built, the simulation reuses: as in the search)
    floor = step_time_floor(MODEL, h, plan, rank)
    step = simulate_prepared(MODEL, h, plan, cal, keep_timeline=False, rank=rank).step_time_s
    assert 0 < floor <= step, plan.flags()
