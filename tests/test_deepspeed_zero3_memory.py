"""What a GPU holds under DeepSpeed ZeRO-3 beyond the layers' gathers (issue 16, session 5): the
embedding's and LM head's gathered weights, torchtitan's eager repeat_kv, and DeepSpeed 0.18's
SuperOffload (whole-sub-group reduction, the fp32 gradient handed to its worker on the GPU)."""

from __future__ import annotations

import json

from ghsim.deepspeed import read_ds_config
from ghsim.graph.parallel import Chunk, Layout, build_microbatch
from ghsim.graph.states import handed_over_gradient
from ghsim.graph.offload import resolve
from ghsim.hardware import load_hardware
from ghsim.model import ModelSpec
from ghsim.plan import Framework, OffloadSchedule, Plan, Precision, plan_from_dict
from ghsim.cost.calibration import load_calibration
from ghsim.simulate import chunk_graph, prepare, simulate

QUAD = load_hardware("gh200-96gb-quad")
GQA = ModelSpec(name="gqa", hidden_size=1024, intermediate_size=2816, num_layers=4, num_attention_heads=8,
                num_kv_heads=2, head_dim=128, vocab_size=32000, max_seq_len=1024)
OPT = frozenset({"optimizer", "grads"})


def _plan(**kw) -> Plan:
    return Plan(**{"gpus": 4, "gpus_per_node": 4, "seq": 1024, "precision": Precision.BF16,
                   "framework": Framework.DEEPSPEED, **kw})


def _graph(plan: Plan):
    return build_microbatch(GQA, plan, Layout.of(plan, QUAD), Chunk(GQA.num_layers, True, True), True).graph


def test_zero3_gathers_embedding_and_head_and_releases_them():
    ops = _graph(_plan(zero=3)).ops
    names = [op.name for op in ops]
    head = GQA.vocab_size * GQA.hidden_size * 2  # untied head, bf16 (the final norm too)
    assert names.count("zero3.all_gather.embedding") == 2 and names.count("zero3.all_gather.lm_head") == 1
    held = sum((op.hbm_by_tag or {}).get("gathered_params", 0.0) for op in ops)
    assert abs(held) < 1  # every gather released
    # the head's weights stay gathered from its forward through its backward (DeepSpeed's reuse distance)
    gathered, at_loss = 0.0, None
    for op in ops:
        gathered += (op.hbm_by_tag or {}).get("gathered_params", 0.0)
        if op.name == "cross_entropy.bwd":
            at_loss = gathered
    assert at_loss is not None and at_loss >= head
    assert "zero3.all_gather.lm_head" not in [op.name for op in _graph(_plan(zero=2)).ops]
    # FSDP's root unit (embedding, final norm, head): gathered once, held until its backward ends
    fsdp = _graph(_plan(zero=3, framework=Framework.FSDP_MIXED)).ops
    assert [op.name for op in fsdp].count("zero3.all_gather.root") == 1
    assert abs(sum((op.hbm_by_tag or {}).get("gathered_params", 0.0) for op in fsdp)) < 1


def _gathered_at_loss(model: ModelSpec, plan: Plan) -> float:
    gathered, at_loss = 0.0, None
    for op in build_microbatch(model, plan, Layout.of(plan, QUAD), Chunk(model.num_layers, True, True), True).graph.ops:
        gathered += (op.hbm_by_tag or {}).get("gathered_params", 0.0)
        if op.name == "cross_entropy.bwd":
            at_loss = gathered
    return at_loss


def test_zero3_tied_head_gathers_the_shared_embedding_weight():
    """HF's tied lm_head.weight is embed_tokens.weight: DeepSpeed's hook on the head fetches it (issue 14,
    session 6: the 2-GPU Llama-3.2-3B case's HBM peak); FSDP's root unit holds the one weight once."""
    import dataclasses
    tied = dataclasses.replace(GQA, tie_embeddings=True)
    weight = GQA.vocab_size * GQA.hidden_size * 2
    ds = _plan(zero=3)
    assert abs(_gathered_at_loss(tied, ds) - _gathered_at_loss(GQA, ds)) < 1  # the same weight, gathered either way
    fsdp = _plan(zero=3, framework=Framework.FSDP_MIXED)
    assert abs(_gathered_at_loss(GQA, fsdp) - _gathered_at_loss(tied, fsdp) - weight) < 1


def test_torchtitan_eager_sdpa_keeps_k_and_v_expanded_to_every_head():
    T, act = 1024, 2
    hf, tt = (build_microbatch(GQA, p, Layout.of(p, QUAD), Chunk(GQA.num_layers, True, True), True)
              for p in (_plan(zero=1), _plan(zero=1, modeling="torchtitan")))
    extra = 2 * T * (GQA.q_dim - GQA.kv_dim) * act * GQA.num_layers
    assert abs((tt.saved_bytes - hf.saved_bytes) - extra) < 1
    assert "repeat_kv" in [op.name for op in tt.graph.ops] and "repeat_kv" not in [op.name for op in hf.graph.ops]


def test_deepspeed_018_superoffload_holds_sub_groups_and_the_handed_over_gradient():
    base = _plan(zero=3, offload=OPT, offload_schedule=OffloadSchedule.SUPEROFFLOAD, sub_group_size=1e7)
    old = base.with_(deepspeed_version="0.18")
    setup = resolve(old)
    assert setup.gpu_grad_handoff and not setup.grad_round_trip and not resolve(base).gpu_grad_handoff
    trainable = 1e9
    assert handed_over_gradient(setup, trainable) == 4 * 1e7  # one sub-group's fp32 gradient
    assert handed_over_gradient(resolve(base), trainable) == 0.0
    rank = prepare(GQA, QUAD, old, load_calibration(QUAD.calibration))
    reduce = [op for op in chunk_graph(GQA, old, rank, GQA.num_layers, (True, True), True).graph.ops
              if op.name == "grads.reduce_scatter"]
    assert reduce and all(op.hbm_transient > 0 for op in reduce)  # the coalesced flat copy and fp32 cast
    assert simulate(GQA, QUAD, old).hbm.peak_bytes > simulate(GQA, QUAD, base).hbm.peak_bytes


def test_ds_config_bucket_and_sub_group_sizes_reach_the_plan(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"zero_optimization": {"stage": 3, "reduce_bucket_size": 4e8, "sub_group_size": 4e8}}))
    fields, notes = read_ds_config(cfg)
    assert fields["reduce_bucket_size"] == 4e8 and fields["sub_group_size"] == 4e8
    assert not any("reduce_bucket_size" in n for n in notes)
    plan = plan_from_dict({k: v for k, v in fields.items() if k != "offload"})
    assert "--reduce-bucket-size 4e+08 --sub-group-size 4e+08" in plan.flags()


def test_deepspeed_018_clipped_superoffload_rolls_back_and_steps_again():
    plan = _plan(zero=3, offload=OPT, offload_schedule=OffloadSchedule.SUPEROFFLOAD, grad_clip=True,
                 deepspeed_version="0.18")
    setup = resolve(plan)
    assert setup.speculative and setup.rollback_clip and not setup.grads_on_compute_stream
    assert not resolve(plan.with_(deepspeed_version="0.19")).rollback_clip
    rank = prepare(GQA, QUAD, plan, load_calibration(QUAD.calibration))
    names = [op.name for op in chunk_graph(GQA, plan, rank, GQA.num_layers, (True, True), True).graph.ops]
    assert names.count("cpu_adamw.rollback") == names.count("cpu_adamw.redo") > 0
    assert simulate(GQA, QUAD, plan).step_time_s > simulate(GQA, QUAD, plan.with_(grad_clip=False)).step_time_s


def test_deepspeed_stage3_scales_host_gradients_with_or_without_clipping():
    """stage3.py unscale_and_clip_grads multiplies every fp32 gradient partition each step (loss scale
    x clip factor), clipping or not: with the optimizer offloaded a host pass either way."""
    plan = _plan(zero=3, offload=OPT, offload_schedule=OffloadSchedule.OVERLAPPED)
    assert resolve(plan).host_unscale and not resolve(plan.with_(framework=Framework.FSDP_MIXED)).host_unscale
    for p in (plan, plan.with_(grad_clip=True)):
        rank = prepare(GQA, QUAD, p, load_calibration(QUAD.calibration))
        names = [op.name for op in chunk_graph(GQA, p, rank, GQA.num_layers, (True, True), True).graph.ops]
        assert "grads.clip.cpu" in names
    old_so = _plan(zero=3, offload=OPT, offload_schedule=OffloadSchedule.SUPEROFFLOAD, deepspeed_version="0.18")
    rank = prepare(GQA, QUAD, old_so, load_calibration(QUAD.calibration))
    assert "grads.unscale.cpu" in [op.name for op in chunk_graph(GQA, old_so, rank, GQA.num_layers, (True, True),
                                                                   True).graph.ops]


def _gathers_by_phase(model: ModelSpec, plan: Plan) -> dict[str, int]:
    ops = build_microbatch(model, plan, Layout.of(plan, QUAD), Chunk(model.num_layers, True, True), True).graph.ops
    out: dict[str, int] = {}
    for op in ops:
        if op.name == "zero3.all_gather":
            out[op.phase] = out.get(op.phase, 0) + 1
    return out


def test_zero3_on_several_ranks_keeps_the_prefetch_windows_last_layers_into_backward():
    """DeepSpeed's prefetch window (stage3_max_live_parameters) holds the LM head and the last layers
    that fit beside it at the loss; they are not gathered again in backward (issue 14, session 6: the
    2-GPU 3B trace gathers 28 layers in forward and 22 in backward). FSDP and one rank: unchanged."""
    layer = GQA.layer_params * 2  # bf16
    head = GQA.vocab_size * GQA.hidden_size
    head_only = _gathered_at_loss(GQA, _plan(zero=3, max_live_parameters=head))
    assert head * 2 <= head_only < head * 2 + layer  # the head (and final norm), no layer
    for kept in (0, 2, GQA.num_layers):
        plan = _plan(zero=3, max_live_parameters=head + (kept + 0.5) * GQA.layer_params)
        assert abs(_gathered_at_loss(GQA, plan) - (head_only + kept * layer)) < 1, kept
        by_phase = _gathers_by_phase(GQA, plan)
        assert by_phase["fwd"] == GQA.num_layers and by_phase.get("bwd", 0) == GQA.num_layers - kept
        ops = build_microbatch(GQA, plan, Layout.of(plan, QUAD), Chunk(GQA.num_layers, True, True), True).graph.ops
        assert abs(sum((op.hbm_by_tag or {}).get("gathered_params", 0.0) for op in ops)) < 1  # all released
    fsdp = _plan(zero=3, framework=Framework.FSDP_MIXED)
    assert _gathers_by_phase(GQA, fsdp)["bwd"] == GQA.num_layers
    one = _plan(zero=3, gpus=1, gpus_per_node=1)  # the gather is a view of the GPU partition
    assert not _gathered_at_loss(GQA, one)


def test_the_two_gpu_llama_cases_hold_six_and_two_layers_at_the_loss():
    """Sizes from DeepSpeed's defaults and the models alone: (1e9 - head) // layer elements."""
    from ghsim.graph.zero3_window import layers_kept_for_backward
    llama3b = ModelSpec(name="3b", hidden_size=3072, intermediate_size=8192, num_layers=28, num_attention_heads=24,
                        num_kv_heads=8, head_dim=128, vocab_size=128256, max_seq_len=2048, tie_embeddings=True)
    llama8b = ModelSpec(name="8b", hidden_size=4096, intermediate_size=14336, num_layers=32, num_attention_heads=32,
                        num_kv_heads=8, head_dim=128, vocab_size=128256, max_seq_len=2048)
    for model, kept in ((llama3b, 6), (llama8b, 2)):
        assert layers_kept_for_backward(1e9, model.vocab_size * model.hidden_size, model.layer_params,
                                        model.num_layers) == kept
        plan = _plan(zero=3, gpus=2, gpus_per_node=2, seq=2048, micro_batch=2)
        assert _gathers_by_phase(model, plan)["bwd"] == model.num_layers - kept
