"""torch.compile (plan.compile, --compile) as Inductor runs a Hugging Face Llama (issue 15): fused
regions, fewer kernels and saved activations, the boolean-mask SDPA, and the plans it is refused for."""

import pytest
from click.testing import CliRunner

from ghsim.cli import main
from ghsim.errors import GhsimError
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Framework, Plan
from ghsim.simulate import simulate

MODEL, H100 = load_model("llama-2-7b"), load_hardware("h100-sxm")
PLAN = Plan(seq=1024)


def _kernels(report) -> int:
    return sum(op.kernels for op in report.timeline.ops if op.resource == "gpu")


@pytest.mark.parametrize("plan", [PLAN, PLAN.with_(lora_rank=16, lora_targets=("q_proj", "v_proj")),
                                  PLAN.with_(framework=Framework.FSDP_MIXED)])
def test_compiled_step_is_faster_with_fewer_kernels_and_less_memory(plan):
    eager, compiled = simulate(MODEL, H100, plan), simulate(MODEL, H100, plan.with_(compile=True))
    assert compiled.step_time_s < eager.step_time_s
    assert _kernels(compiled) < 0.75 * _kernels(eager)
    assert compiled.hbm.peak_bytes <= eager.hbm.peak_bytes  # full fine-tuning: the optimizer step may set both
    if plan.lora_rank:  # activations set the peak: no fp32 norm copies, per-projection casts or fp32 logits kept
        assert compiled.hbm.peak_bytes < 0.9 * eager.hbm.peak_bytes
    assert compiled.plan["compile"] is True


def test_compiled_attention_pays_for_the_mask_hf_passes():
    eager, compiled = simulate(MODEL, H100, PLAN), simulate(MODEL, H100, PLAN.with_(compile=True))
    attention = lambda r: r.time_breakdown_s["attention"]
    assert attention(compiled) > 1.5 * attention(eager)


@pytest.mark.parametrize("plan", [PLAN.with_(compile=True, framework=Framework.MEGATRON),
                                  PLAN.with_(compile=True, gpus=2, tp=2)])
def test_plans_compile_is_not_modeled_for_are_refused(plan):
    with pytest.raises(GhsimError, match="--compile"):
        simulate(MODEL, H100, plan)


def test_the_flag_reaches_the_plan_and_its_refusal_is_one_line():
    runner = CliRunner()
    ok = runner.invoke(main, ["simulate", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--seq", "1024",
                              "--compile", "--json"])
    assert ok.exit_code == 0 and '"compile": true' in ok.output
    refused = runner.invoke(main, ["simulate", "--model", "llama-2-7b", "--compile", "--framework", "megatron"])
    assert refused.exit_code == 2 and "--compile" in refused.output and "Traceback" not in refused.output


def test_torchtitan_modeling_compiles_without_hf_mask():
    """torchtitan's Llama calls SDPA with is_causal: under compile no boolean mask, k/v not expanded."""
    hf, titan = simulate(MODEL, H100, PLAN.with_(compile=True)), simulate(MODEL, H100, PLAN.with_(compile=True, modeling="torchtitan"))
    variants = lambda r: {op.variant for op in r.timeline.ops if op.category == "attention"}
    assert "bool_mask" in variants(hf) and "bool_mask" not in variants(titan)
    assert not any(op.name.startswith("repeat_kv") for op in titan.timeline.ops)
    assert titan.time_breakdown_s["attention"] < hf.time_breakdown_s["attention"]
    eager = simulate(MODEL, H100, PLAN)
    assert simulate(MODEL, H100, PLAN.with_(modeling="torchtitan")).step_time_s == eager.step_time_s  # eager: same


def test_unknown_modeling_is_one_line_exit_2():
    r = CliRunner().invoke(main, ["simulate", "--model", "llama-2-7b", "--modeling", "jax"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    with pytest.raises(GhsimError, match="modeling"):
        simulate(MODEL, H100, PLAN.with_(modeling="jax"))


def test_cuda_graph_plans_say_which_measured_peak_their_hbm_is():
    """Replayed CUDA graphs allocate nothing through torch's allocator, so a replayed step's
    max_memory_allocated misses their pool (1B reduce-overhead: 18.4 GiB replayed, 35.1 recording)."""
    graphs = simulate(MODEL, H100, PLAN.with_(compile=True, cuda_graphs=True))
    assert any("recording" in n and "max_memory_allocated" in n for n in graphs.notes)
    assert not any("recording" in n for n in simulate(MODEL, H100, PLAN.with_(compile=True)).notes)


def test_reduce_overhead_copies_the_logits_zero_gradient_into_its_pool():
    """cudagraph trees copy the backward's one non-static input, the zero gradient autograd materialises
    for the logits output, into their pool: recording holds it twice (HBM), every replay copies it (time)."""
    lora = PLAN.with_(lora_rank=16, lora_targets=("q_proj", "v_proj"), micro_batch=2)  # activations set the peak
    compiled = simulate(MODEL, H100, lora.with_(compile=True))
    graphs = simulate(MODEL, H100, lora.with_(compile=True, cuda_graphs=True))
    logits = lora.micro_batch * lora.seq * MODEL.vocab_size * 2
    copies = [op for op in graphs.timeline.ops if op.name == "cudagraph.input_copy"]
    assert [op.bytes for op in copies] == [2 * logits]
    assert not any(op.name == "cudagraph.input_copy" for op in compiled.timeline.ops)
    assert graphs.hbm.peak_bytes == pytest.approx(compiled.hbm.peak_bytes + logits, rel=1e-6)
