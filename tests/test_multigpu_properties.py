"""Properties of multi-GPU predictions that must hold for any plan (hypothesis, synthetic calibration)."""

import math
import os
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ghsim.graph.dtypes import Dtypes
from ghsim.hardware import load_hardware
from ghsim.model import ModelSpec
from ghsim.plan import DEEPSPEED_REDUCE_BUCKET, Framework, Plan, Precision, Recompute
from ghsim.sim import engine
from ghsim.simulate import simulate
from synthetic import synthetic_calibration

CAL = synthetic_calibration()
H100 = load_hardware("h100-sxm")
QUAD = load_hardware("gh200-96gb-quad")
TINY = ModelSpec(name="tiny", hidden_size=1024, intermediate_size=2816, num_layers=8, num_attention_heads=16,
                 num_kv_heads=4, head_dim=64, vocab_size=32000)
# GHSIM_PROPERTY_EXAMPLES=200 searches harder (random seeds) than the fast default run.
EXAMPLES = int(os.environ.get("GHSIM_PROPERTY_EXAMPLES", "12"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize="GHSIM_PROPERTY_EXAMPLES" not in os.environ,
                    suppress_health_check=[HealthCheck.too_slow])

frameworks = st.sampled_from(list(Framework))
recomputes = st.sampled_from(list(Recompute))
precisions = st.sampled_from([Precision.BF16, Precision.FP32])
seqs = st.sampled_from([256, 512])


def hbm(**plan) -> float:
    return simulate(TINY, H100, Plan(**plan), CAL, keep_timeline=False).hbm.peak_bytes


@SETTINGS
@given(zero=st.integers(0, 2), dp=st.sampled_from([2, 4, 8]), tp=st.sampled_from([1, 2]), fw=frameworks,
       rc=recomputes, prec=precisions, seq=seqs)
def test_higher_zero_stage_never_raises_memory(zero, dp, tp, fw, rc, prec, seq):
    base = dict(gpus=dp * tp, tp=tp, framework=fw, recompute=rc, precision=prec, seq=seq)
    # except by DeepSpeed's reduce bucket, which its ZeRO stages allocate whole however small the
    # model (graph/states.comm_buckets): TINY's gradients are smaller than it
    bucket = DEEPSPEED_REDUCE_BUCKET * Dtypes.of(Plan(**base)).grad if fw == Framework.DEEPSPEED and zero == 0 else 0
    assert hbm(**base, zero=zero + 1) <= hbm(**base, zero=zero) * (1 + 1e-12) + bucket


@SETTINGS
@given(dp=st.sampled_from([2, 4, 8]), fw=frameworks, rc=recomputes, seq=seqs, tp=st.sampled_from([1, 2]))
def test_more_data_parallel_gpus_never_raise_memory_under_zero3(dp, fw, rc, seq, tp):
    base = dict(zero=3, tp=tp, framework=fw, recompute=rc, seq=seq)
    assert hbm(**base, gpus=2 * dp * tp) <= hbm(**base, gpus=dp * tp) * (1 + 1e-12)


def faster(hw, nvlink: float, net: float):
    return replace(hw, gpu_link=replace(hw.gpu_link, bandwidth=hw.gpu_link.bandwidth * nvlink,
                                        per_peer=hw.gpu_link.per_peer * nvlink),
                   network=replace(hw.network, bandwidth=hw.network.bandwidth * net))


@SETTINGS
@given(layout=st.sampled_from([(8, 1, 1, 8), (16, 2, 1, 8), (16, 2, 2, 4), (8, 1, 2, 2), (4, 1, 1, 4)]),
       zero=st.integers(0, 3), fw=frameworks, ga=st.sampled_from([1, 2]), nvlink=st.floats(1.0, 4.0),
       net=st.floats(1.0, 4.0), quad=st.booleans())
def test_faster_links_never_slow_a_step(layout, zero, fw, ga, nvlink, net, quad):
    gpus, tp, pp, per_node = layout
    hw = QUAD if quad and per_node <= 4 else H100
    plan = Plan(gpus=gpus, tp=tp, pp=pp, gpus_per_node=per_node, zero=zero, framework=fw, seq=512,
                global_batch=gpus // (tp * pp) * ga * pp)
    slow = simulate(TINY, hw, plan, CAL, keep_timeline=False).step_time_s
    fast = simulate(TINY, faster(hw, nvlink, net), plan, CAL, keep_timeline=False).step_time_s
    assert fast <= slow * (1 + 1e-9)


@SETTINGS
@given(pp=st.sampled_from([2, 4]), m=st.integers(1, 4), extra=st.integers(1, 4), v=st.sampled_from([1, 2]))
def test_pipeline_bubble_shrinks_with_more_micro_batches(pp, m, extra, v):
    def bubble(M):
        plan = Plan(gpus=pp, pp=pp, pp_interleave=v, seq=256, global_batch=M)
        return simulate(TINY, H100, plan, CAL, keep_timeline=False).extra["parallel"]["pipeline_bubble_fraction"]

    unit = pp if v > 1 else 1  # interleaving needs whole groups of pp micro-batches
    assert bubble((m + extra) * unit) <= bubble(m * unit) + 1e-12


@SETTINGS
@given(layout=st.sampled_from([(2, 1, 1), (8, 2, 2), (8, 1, 4), (16, 4, 2)]), zero=st.integers(0, 3),
       fw=frameworks, rc=recomputes, ga=st.sampled_from([1, 3]), sp=st.booleans())
def test_breakdown_sums_to_step_time(layout, zero, fw, rc, ga, sp):
    gpus, tp, pp = layout
    plan = Plan(gpus=gpus, tp=tp, pp=pp, zero=zero, framework=fw, recompute=rc, seq=256, sequence_parallel=sp,
                global_batch=gpus // (tp * pp) * ga)
    r = simulate(TINY, H100, plan, CAL, keep_timeline=False)
    assert math.isclose(sum(r.time_breakdown_s.values()), r.step_time_s, rel_tol=1e-9)
    assert all(v >= -1e-12 for v in r.time_breakdown_s.values())
    assert 0 < r.gpu_utilization <= 1


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.data())
def test_engine_never_overlaps_ops_on_a_single_server_resource(data):
    """Random DAGs on streams, a slowed compute stream and a 2-server pool: one op at a time per server."""
    resources = [engine.Resource("gpu", slowed_by=("comm", "comm2"), slowdown=data.draw(st.floats(0.0, 0.5))),
                 engine.Resource("comm"), engine.Resource("comm2"), engine.Resource("pool", servers=2)]
    n = data.draw(st.integers(1, 60))
    res = [data.draw(st.integers(0, 3)) for _ in range(n)]
    dur = [data.draw(st.floats(0.0, 5.0)) for _ in range(n)]
    deps = [tuple(sorted(set(data.draw(st.lists(st.integers(0, i - 1), max_size=3))))) if i else () for i in range(n)]
    issue = [data.draw(st.floats(0.0, 0.5)) for _ in range(n)]
    waits = [data.draw(st.booleans()) for _ in range(n)]
    sched = engine.run(resources, res, dur, deps, issue, waits)
    for r, resource in enumerate(resources):
        idx = [i for i in range(n) if res[i] == r]
        intervals = sorted((sched.start[i], sched.end[i]) for i in idx)
        # at any instant at most `servers` ops run
        events = sorted([(s, 1) for s, e in intervals if e > s] + [(e, -1) for s, e in intervals if e > s])
        running = 0
        for _, step in events:
            running += step
            assert running <= resource.servers
        for i in idx:
            assert sched.end[i] >= sched.start[i] + dur[i] - 1e-12  # slowed, never sped up
            for d in deps[i]:
                assert sched.start[i] >= sched.end[d] - 1e-12
    assert np.all(sched.end <= sched.makespan + 1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 3)), max_size=8), st.floats(-1, 12), st.floats(0, 12))
def test_coverage_matches_a_direct_count(spans, x, width):
    """window()'s CPU coverage (prefix sums; overlapping intervals merged first) against a plain sweep."""
    from ghsim.report.breakdown import Coverage as _Coverage

    y = x + width
    clipped = sorted((max(s, x), min(s + w, y)) for s, w in spans if min(s + w, y) > max(s, x))
    direct, reach = 0.0, -math.inf
    for a, b in clipped:  # union length of the clipped spans
        if b > reach:
            direct += b - max(a, reach)
            reach = b
    starts = np.array([s for s, _ in spans], float)
    ends = np.array([s + w for s, w in spans], float)
    assert math.isclose(_Coverage(starts, ends).over(x, y), direct, abs_tol=1e-9)
