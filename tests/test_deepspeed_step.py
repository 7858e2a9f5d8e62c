"""DeepSpeed's ZeRO step on the GPU as its 0.19 code runs it (graph/deepspeed_optimizer.py)."""

from __future__ import annotations

from hypothesis import given, strategies as st

from ghsim.graph.deepspeed_optimizer import deepspeed_optimizer_ops

P = 3.2e9


def _bytes(ops, name):
    return sum(op.bytes for op in ops if op.name == name)


def test_stage2_gradients_go_through_the_bucket_and_norm_in_fp64():
    ops = deepspeed_optimizer_ops(P, 254, 2, 2, clip=True)
    names = [op.name for op in ops]
    # no flatten in the step: the backward hooks already copied each gradient into the reduce
    # bucket and from it into the flat partition
    assert "ds.flatten_grads" not in names
    assert _bytes(ops, "ds.grads_to_bucket") == _bytes(ops, "ds.bucket_to_partition") == 4 * P
    # bf16 -> fp64 cast (2 + 8), the fp64 norm (8), amax and amin over bf16 (2 + 2)
    assert _bytes(ops, "ds.grad_norm") == 22 * P
    assert names.index("ds.grad_norm") < names.index("adamw.fused") < names.index("ds.masters_to_weights")


def test_stage3_norm_unchanged_and_no_bucket_copies():
    ops = deepspeed_optimizer_ops(P, 254, 3, 2, clip=False)
    assert _bytes(ops, "ds.grad_norm") == 8 * P
    assert not any(op.name.startswith(("ds.grads_to_bucket", "ds.bucket_to_partition", "ds.clip")) for op in ops)


@given(zero=st.sampled_from([1, 2, 3]), width=st.sampled_from([2, 4]), clip=st.booleans(),
       params=st.floats(1e6, 1e11))
def test_the_step_frees_every_temporary_it_allocates(zero, width, clip, params):
    ops = deepspeed_optimizer_ops(params, 100, zero, width, clip)
    assert abs(sum(op.hbm_alloc - op.hbm_free for op in ops)) <= 1e-6 * params
    assert all(op.bytes > 0 for op in ops if op.name.startswith("ds."))
