"""FSDP2's CPUOffloadPolicy as its trace shows it (issue 14, session 4): parameter copies on the
compute stream, and clip_grad_norm_'s norm priced at the measured _foreach_norm rate
(validation/measured_libraries/_raw/dtensor_step.json)."""

from __future__ import annotations

import pytest

from ghsim.cost.cpu_optimizer import foreach_norm_bandwidth
from ghsim.errors import GhsimError
from ghsim.graph.step import param_counts
from ghsim.graph.ops import Resource
from ghsim.plan import CpuOptimizer, Framework, Plan, Precision, plan_from_dict
from ghsim.simulate import simulate
from tests.test_library_offload_paths import H100, SMALL

ALL = frozenset({"params", "grads", "optimizer"})


def _fsdp(**kw) -> Plan:
    return Plan(seq=1024, micro_batch=1, precision=Precision.BF16, framework=Framework.FSDP_MIXED, zero=3,
                offload=ALL, cpu_optimizer=CpuOptimizer.TORCH_FORLOOP, grad_clip=True, **kw)


def _ops(report, prefix: str):
    tl = report.timeline
    return [(op, tl.schedule.start[i], tl.schedule.end[i]) for i, op in enumerate(tl.ops) if op.name.startswith(prefix)]


def test_fsdp2_fetches_parameters_on_the_compute_stream_fsdp1_on_a_copy_stream():
    one, two = simulate(SMALL, H100, _fsdp()), simulate(SMALL, H100, _fsdp(fsdp2=True))
    assert {op.resource for op, _, _ in _ops(one, "params.h2d.")} == {Resource.H2D}
    assert {op.resource for op, _, _ in _ops(two, "params.h2d.")} == {Resource.GPU}
    # the same bytes move; serialised with the kernels they can only make the step longer
    assert sum(op.bytes for op, _, _ in _ops(two, "params.h2d.")) == sum(op.bytes for op, _, _ in _ops(one, "params.h2d."))
    assert two.step_time_s > one.step_time_s


def test_fsdp2_parameter_copies_never_overlap_the_kernels():
    r = simulate(SMALL, H100, _fsdp(fsdp2=True))
    copies = [(s, e) for _, s, e in _ops(r, "params.h2d.")]
    tl = r.timeline
    kernels = [(tl.schedule.start[i], tl.schedule.end[i]) for i, op in enumerate(tl.ops)
               if op.resource == Resource.GPU and not op.name.startswith("params.h2d.") and op.kernels]
    assert copies and kernels
    assert all(e <= ks + 1e-12 or ke <= s + 1e-12 for s, e in copies for ks, ke in kernels)


def test_the_host_norm_reads_every_fp32_gradient_at_the_measured_foreach_norm_rate():
    r = simulate(SMALL, H100, _fsdp(fsdp2=True))
    norm = _ops(r, "grads.norm.cpu")
    p = param_counts(SMALL, Plan()).trainable
    assert sum(op.bytes for op, _, _ in norm) == pytest.approx(4 * p, rel=0.01)
    assert sum(e - s for _, s, e in norm) == pytest.approx(4 * p / foreach_norm_bandwidth(), rel=0.01)


def test_fsdp2_round_trips_through_the_plan_and_rejects_a_non_boolean():
    plan = _fsdp(fsdp2=True)
    assert "--fsdp2" in plan.flags() and "--fsdp2" not in _fsdp().flags()
    assert plan_from_dict({"fsdp2": True, "offload": ["params"]}).fsdp2
    with pytest.raises(GhsimError, match="fsdp2"):
        plan_from_dict({"fsdp2": "yes"}, "test")
