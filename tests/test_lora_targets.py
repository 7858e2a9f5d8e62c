"""LoRA adapters on the projections the user's library puts them on (issue 15): peft's Llama
default is q_proj and v_proj, many pick q,k,v,o, ghsim's default is all seven."""

import pytest
from click.testing import CliRunner

from ghsim.cli import main
from ghsim.graph.step import param_counts
from ghsim.model import load_model
from ghsim.plan import LORA_TARGETS, Framework, Plan, parse_lora_targets
from ghsim.simulate import simulate
from ghsim.hardware import load_hardware

MODEL = load_model("llama-2-7b")
H100 = load_hardware("h100-sxm")


def run(targets):
    return simulate(MODEL, H100, Plan(lora_rank=16, lora_targets=parse_lora_targets(targets), seq=1024))


def test_adapters_count_as_peft_counts_them():
    """peft's print_trainable_parameters for Llama-2-7B at r=16: 8,388,608 on q_proj, v_proj
    (32 layers x 2 targets x 16 x (4096 + 4096)), 39,976,960 on all linear layers."""
    qv = param_counts(MODEL, Plan(lora_rank=16, lora_targets=parse_lora_targets("peft")))
    assert qv.trainable == 8_388_608 and qv.n_tensors == 32 * 2 * 2
    every = param_counts(MODEL, Plan(lora_rank=16))
    assert every.trainable == 32 * 16 * (4 * 8192 + 3 * (4096 + 11008))  # 39,976,960 (peft, all linear)


def test_fewer_adapters_less_time_and_memory():
    qv, qkvo, every = run("q,v"), run("q,k,v,o"), run("all")
    assert qv.step_time_s < qkvo.step_time_s < every.step_time_s
    assert qv.hbm.peak_bytes <= qkvo.hbm.peak_bytes <= every.hbm.peak_bytes
    assert tuple(every.to_dict()["plan"]["lora_targets"]) == LORA_TARGETS


@pytest.mark.parametrize("value", ["qkvo", "banana", ",", "q,x"])
def test_unknown_targets_are_one_line(value):
    res = CliRunner().invoke(main, ["simulate", "--model", "llama-2-7b", "--lora-rank", "16", "--lora-targets", value])
    assert res.exit_code == 2 and "unknown LoRA target" in res.output and "Traceback" not in res.output


def _lora_cast_ops(plan):
    return [op for op in simulate(MODEL, H100, plan).timeline.ops if ".lora_x_" in op.name or ".lora_dx_" in op.name]


def test_peft_casts_each_adapters_input_and_keeps_its_own_copy():
    """peft keeps adapters in fp32 and casts each adapter's input to it; autocast casts it back for
    lora_A, which saves that bf16 copy (microbench15b peft): 2 casts forward and 2 backward per
    adapter, more activation memory than adapters reading the shared input (our harness's LoRALinear)."""
    peft = Plan(lora_rank=16, lora_targets=parse_lora_targets("q_proj,v_proj"), seq=1024)
    plain = peft.with_(peft_input_cast=False)
    assert len(_lora_cast_ops(peft)) == 4 * 2 * MODEL.num_layers and not _lora_cast_ops(plain)
    a, b = simulate(MODEL, H100, peft), simulate(MODEL, H100, plain)
    assert a.hbm.peak_bytes > b.hbm.peak_bytes and a.step_time_s > b.step_time_s


def test_megatron_lora_has_no_peft_casts():
    assert not _lora_cast_ops(Plan(lora_rank=16, seq=1024, framework=Framework.MEGATRON))
