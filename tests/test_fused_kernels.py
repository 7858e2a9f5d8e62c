"""The fused-kernel (Megatron) execution mode: --framework megatron and megatron-legacy.

Fused mode runs one kernel per norm, activation, rotary, residual and loss step
(graph/fused_layer.py), so it launches fewer kernels than the
eager PyTorch step and is never slower in forward and backward; its forward
keeps what Megatron keeps (Korthikanti et al. 2022, Table 2).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghsim.cost.calibration import load_calibration
from ghsim.cost.compute import CostModel
from ghsim.graph import ops as K
from ghsim.graph.step import _layer_templates
from ghsim.graph.layer_ops import LayerSplit
from ghsim.graph.transformer import LayerBuilder
from ghsim.hardware import load_hardware
from ghsim.model import ModelSpec, load_model
from ghsim.plan import Framework, Plan, Precision, Recompute
from ghsim.simulate import simulate
from step_graphs import step_graph

HW = load_hardware("h100-sxm")
CAL = load_calibration("h100")  # the measured curves: fused kernels are priced from "copy" and "add"
EAGER = (Framework.TORCH_AMP, Framework.FSDP_MIXED, Framework.DEEPSPEED)


@st.composite
def models(draw):
    heads = draw(st.sampled_from([8, 16, 32]))
    head_dim = draw(st.sampled_from([64, 128]))
    kv = draw(st.sampled_from([h for h in (1, 2, 8, heads) if heads % h == 0]))
    gpt = draw(st.booleans())
    hidden = heads * head_dim
    return ModelSpec(name="random", hidden_size=hidden, intermediate_size=draw(st.sampled_from([2, 3, 4])) * hidden,
                     num_layers=draw(st.integers(1, 4)), num_attention_heads=heads, num_kv_heads=kv,
                     head_dim=head_dim, vocab_size=draw(st.sampled_from([1000, 32000, 51200])),
                     mlp="gelu" if gpt else "swiglu", norm="layernorm" if gpt else "rmsnorm",
                     position="learned" if gpt else "rope", dropout=draw(st.sampled_from([0.0, 0.1])))


@st.composite
def plans(draw):
    return Plan(seq=draw(st.sampled_from([256, 1024, 2048])), micro_batch=draw(st.integers(1, 4)),
                precision=draw(st.sampled_from([Precision.BF16, Precision.FP16, Precision.FP32, Precision.FP8])),
                recompute=draw(st.sampled_from(list(Recompute))), lora_rank=draw(st.sampled_from([0, 0, 8])),
                cuda_graphs=draw(st.booleans()), optimizer_impl=draw(st.sampled_from(["foreach", "fused"])))


def valid(plan: Plan) -> bool:
    return not (plan.lora_rank and plan.precision == Precision.FP8)


def kernels(model: ModelSpec, plan: Plan) -> int:
    return sum(op.kernels for op in step_graph(model, HW, plan, CAL).ops
               if op.resource == "gpu" and op.category in K.KERNEL_CATEGORIES)


def forward_backward_s(model: ModelSpec, plan: Plan) -> float:
    """Time from the start of the step until the optimizer starts (the whole step if none)."""
    r = simulate(model, HW, plan, CAL, keep_timeline=True)
    tl = r.timeline
    opt = [tl.schedule.start[i] for i, op in enumerate(tl.ops) if op.phase == "opt"]
    return min(opt) if opt else r.step_time_s


@settings(max_examples=30, deadline=None)
@given(models(), plans())
def test_fused_mode_launches_fewer_kernels_than_eager(model, plan):
    if not valid(plan):
        return
    fused = kernels(model, plan.with_(framework=Framework.MEGATRON))
    legacy = kernels(model, plan.with_(framework=Framework.MEGATRON_LEGACY))
    for fw in EAGER:
        eager = kernels(model, plan.with_(framework=fw))
        assert fused < eager and legacy < eager, (fw, fused, legacy, eager)


@settings(max_examples=30, deadline=None)
@given(models(), plans())
def test_fused_mode_is_never_slower_than_eager_in_forward_and_backward(model, plan):
    """For the same plan, the fused kernels never make forward and backward slower.

    The optimizer is left out: megatron's optimizer step also prices the gradient-norm pass
    and the master-to-working-weight copy, which ghsim's eager modes do not model."""
    if not valid(plan):
        return
    fused = forward_backward_s(model, plan.with_(framework=Framework.MEGATRON))
    for fw in EAGER:
        eager = forward_backward_s(model, plan.with_(framework=fw))
        assert fused <= eager * (1 + 1e-9), (fw, fused, eager)


def test_fused_mode_beats_eager_on_a_whole_megatron_step():
    model = load_model("gpt3-1.7b")
    plan = Plan(seq=2048, micro_batch=4, precision=Precision.BF16, recompute=Recompute.FULL)
    eager = simulate(model, HW, plan.with_(framework=Framework.DEEPSPEED), CAL, keep_timeline=False)
    fused = simulate(model, HW, plan.with_(framework=Framework.MEGATRON), CAL, keep_timeline=False)
    assert fused.step_time_s < eager.step_time_s
    assert fused.time_breakdown_s["norm_reduction"] < eager.time_breakdown_s["norm_reduction"] / 2
    assert kernels(model, plan.with_(framework=Framework.MEGATRON)) < kernels(
        model, plan.with_(framework=Framework.DEEPSPEED)) / 2


def test_each_fused_elementwise_op_is_one_kernel_priced_on_the_streaming_curves():
    model = load_model("llama-3-8b")
    plan = Plan(seq=2048, micro_batch=1, framework=Framework.MEGATRON)
    fwd, bwd, _, _ = _layer_templates(model, plan)
    cost = CostModel(HW, CAL)
    for op in fwd + bwd:
        if op.kind != K.MEMBOUND:
            continue
        assert op.variant.split(":")[0] in ("copy", "add"), op.name
        assert op.kernels == (2 if op.name.startswith("rope") else 1), op.name  # rotary: one for q, one for k
        fit = CAL.membound.get(op.variant) or CAL.membound[op.variant.split(":")[0]]
        assert cost.duration(op) == pytest.approx(fit.fixed_s + op.bytes / fit.rate)
    names = {op.name for op in fwd}
    assert {"input_norm", "qkv_proj", "rope", "flash_attn", "o_proj", "attn_residual", "post_attn_norm", "fc1",
            "swiglu", "down_proj", "mlp_residual"} == names


def test_eager_frameworks_build_the_same_layer_as_before():
    """The eager builder is untouched by fused mode: torch-amp still runs the eager composites."""
    model = load_model("llama-3-8b")
    fwd, _, _, _ = _layer_templates(model, Plan(seq=2048, micro_batch=1))
    by_name = {op.name: op for op in fwd}
    assert by_name["input_norm"].kernels == 6 and by_name["input_norm"].variant == "rmsnorm_fwd:fp32"
    # HF's rotation in fp32 under autocast (graph/eager_layer.py): five kernels per tensor, then
    # autocast's casts of q and k back to bf16 for SDPA
    assert by_name["rope"].kernels + by_name["rope.cast"].kernels == 12
    assert {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"} <= set(by_name)


# --- activation memory: Korthikanti et al. 2022, Table 2 ---------------------------------------
#
# Per layer and micro-batch, 16-bit activations, s = seq, b = micro-batch, h = hidden, a = heads,
# t = tensor-parallel size (no pipeline parallelism):
#   no parallelism                      sbh (34 + 5as/h)
#   tensor parallel                     sbh (10 + 24/t + 5as/(ht))
#   tensor + sequence parallel          sbh/t (34 + 5as/h)
#   tensor parallel, selective          sbh (10 + 24/t)
#   tensor + sequence, selective        sbh 34/t
# 34sbh: the two norms' inputs (4), the QKV input (2), Q and K (4), V (2), the attention output (2),
# the MLP input (2), the fc1 output (8) and the GeLU output (8), and two 1-byte dropout masks (2);
# 5as^2b: the softmax output (2), its dropout mask (1) and the dropout output (2). ghsim adds only
# the fp32 norm statistics (mean and 1/std: 16 bytes per token per layer) and, with flash attention,
# the log-sum-exp (4 bytes per head and token): a margin of 1% covers them.
MARGIN = 0.01
KORTHIKANTI = {
    (False, False, Recompute.NONE): lambda s, b, h, a, t: s * b * h * (34 + 5 * a * s / h),
    (True, False, Recompute.NONE): lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
    (True, True, Recompute.NONE): lambda s, b, h, a, t: s * b * h / t * (34 + 5 * a * s / h),
    (True, False, Recompute.SELECTIVE): lambda s, b, h, a, t: s * b * h * (10 + 24 / t),
    (True, True, Recompute.SELECTIVE): lambda s, b, h, a, t: s * b * h * 34 / t,
}


def layer_activation_bytes(model: ModelSpec, plan: Plan, tp: int, sp: bool) -> float:
    """What one layer's forward leaves for its backward, its input included, on one rank."""
    local = replace(model, num_attention_heads=model.num_attention_heads // tp,
                    num_kv_heads=model.num_kv_heads // tp, intermediate_size=model.intermediate_size // tp)
    _, _, _, saved = _layer_templates(local, plan, LayerSplit(tp, sp and tp > 1, 1))
    tokens = plan.micro_batch * plan.seq // (tp if sp and tp > 1 else 1)
    return saved + tokens * model.hidden_size * LayerBuilder(local, plan).dt.residual


@pytest.mark.parametrize("name,b", [("gpt3-22b", 4), ("gpt3-175b", 1), ("gpt3-1.7b", 2)])
@pytest.mark.parametrize("key", list(KORTHIKANTI), ids=lambda k: f"tp{int(k[0])}-sp{int(k[1])}-{k[2].value}")
def test_megatron_legacy_keeps_korthikanti_activation_bytes(name, b, key):
    tensor, seqpar, recompute = key
    model = load_model(name)
    s, h, a = 2048, model.hidden_size, model.num_attention_heads
    t = 8 if tensor else 1
    plan = Plan(seq=s, micro_batch=b, precision=Precision.FP16, recompute=recompute,
                framework=Framework.MEGATRON_LEGACY)
    ghsim = layer_activation_bytes(model, plan, t, seqpar)
    paper = KORTHIKANTI[key](s, b, h, a, t)
    assert ghsim == pytest.approx(paper, rel=MARGIN)


@pytest.mark.parametrize("key", list(KORTHIKANTI), ids=lambda k: f"tp{int(k[0])}-sp{int(k[1])}-{k[2].value}")
def test_megatron_with_flash_attention_keeps_no_s2_term(key):
    """Flash attention stores no s x s tensor: every configuration keeps the selective-recompute
    bytes (the formula without its 5as^2b term)."""
    tensor, seqpar, recompute = key
    model = load_model("gpt3-22b")
    s, b, h, a = 2048, 2, model.hidden_size, model.num_attention_heads
    t = 8 if tensor else 1
    plan = Plan(seq=s, micro_batch=b, precision=Precision.BF16, recompute=recompute, framework=Framework.MEGATRON)
    ghsim = layer_activation_bytes(model, plan, t, seqpar)
    paper = KORTHIKANTI[key](s, b, h, 0, t)  # a = 0: no attention-score term
    assert ghsim == pytest.approx(paper, rel=MARGIN)


def test_without_dropout_the_masks_are_not_kept():
    model = replace(load_model("gpt3-22b"), dropout=0.0)
    s, b, h, a = 2048, 1, model.hidden_size, model.num_attention_heads
    plan = Plan(seq=s, micro_batch=b, precision=Precision.FP16, framework=Framework.MEGATRON_LEGACY)
    # 34sbh less the two hidden-dropout masks; 5as^2b less the attention dropout mask and output
    expected = s * b * h * 32 + 2 * a * s * s * b
    assert layer_activation_bytes(model, plan, 1, False) == pytest.approx(expected, rel=MARGIN)


def test_fused_mode_keeps_less_than_eager():
    model = load_model("llama-3-8b")
    plan = Plan(seq=4096, micro_batch=1, precision=Precision.BF16)
    fused = layer_activation_bytes(model, plan.with_(framework=Framework.MEGATRON), 1, False)
    for fw in EAGER:
        assert fused < layer_activation_bytes(model, plan.with_(framework=fw), 1, False), fw


def test_megatron_plans_run_end_to_end_on_many_gpus():
    model = load_model("gpt3-22b")
    for fw in (Framework.MEGATRON, Framework.MEGATRON_LEGACY):
        plan = Plan(gpus=16, tp=8, pp=2, global_batch=8, micro_batch=1, seq=2048, precision=Precision.BF16,
                    recompute=Recompute.SELECTIVE, sequence_parallel=True, framework=fw)
        r = simulate(model, HW, plan, CAL, keep_timeline=False)
        assert r.step_time_s > 0 and r.fits
        assert "precision semantics: " + fw.value in r.notes
