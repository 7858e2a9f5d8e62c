"""FP8 training as torchao runs it in eager frameworks (--fp8-recipe tensorwise|rowwise, issue 15):
eager casts are chains of PyTorch ops and make FP8 slower than bf16; compiled, they fuse and FP8
GEMMs pay off on large layers; plans the recipes do not apply to are refused in one line."""

import pytest
from click.testing import CliRunner

from ghsim.cli import main
from ghsim.errors import GhsimError
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Framework, Plan, Precision
from ghsim.simulate import simulate

MODEL, H100 = load_model("llama-3-8b"), load_hardware("h100-sxm")
BF16 = Plan(seq=4096)
FP8 = BF16.with_(precision=Precision.FP8, fp8_recipe="tensorwise")


def _step(plan):
    return simulate(MODEL, H100, plan).step_time_s


def test_eager_float8_is_slower_than_bf16_and_compiled_float8_faster():
    assert _step(FP8) > _step(BF16)
    assert _step(FP8.with_(compile=True)) < _step(BF16.with_(compile=True))


def test_eager_casts_launch_many_kernels_and_compiled_ones_few():
    def cast_kernels(plan):
        return sum(op.kernels for op in simulate(MODEL, H100, plan).timeline.ops if "fp8_cast" in op.name)
    eager, compiled = cast_kernels(FP8), cast_kernels(FP8.with_(compile=True))
    assert eager > 2.5 * compiled > 0
    rowwise = cast_kernels(FP8.with_(compile=True, fp8_recipe="rowwise"))
    assert rowwise < compiled  # one Inductor kernel per rowwise cast, three per tensorwise


def test_lm_head_and_attention_stay_bf16():
    ops = simulate(MODEL, H100, FP8).timeline.ops
    assert {op.dtype for op in ops if op.name.startswith("lm_head")} <= {"bf16", ""}
    assert all(op.dtype == "bf16" for op in ops if op.category == "attention")
    assert any(op.dtype == "fp8" for op in ops if op.name == "q_proj")


@pytest.mark.parametrize("plan, words", [
    (BF16.with_(fp8_recipe="tensorwise"), "needs --precision fp8"),
    (FP8.with_(fp8_recipe="delayed"), "--framework megatron"),
    (FP8.with_(fp8_recipe="rowwise", framework=Framework.MEGATRON), "torchao"),
])
def test_recipes_that_do_not_apply_are_refused(plan, words):
    with pytest.raises(GhsimError, match=words):
        simulate(MODEL, H100, plan)


@pytest.mark.parametrize("command", [["simulate", "--precision", "fp8"], ["plan", "--gpus", "1", "--time-limit", "1"]])
def test_fp8_on_a100_is_refused_with_exit_2(command):
    r = CliRunner().invoke(main, [*command, "--model", "llama-3-8b", "--hardware", "a100-sxm-80gb",
                                  "--fp8-recipe", "tensorwise"])
    assert r.exit_code == 2 and "FP8" in r.output and "Traceback" not in r.output


def _cast_bytes(plan):
    return {op.name: op.bytes for op in simulate(MODEL, H100, plan).timeline.ops if "fp8_cast" in op.name}


def test_compiled_rowwise_casts_the_weight_gradient_operands_again():
    """Rowwise scales each GEMM's operands along its own contraction axis: under compile the output
    gradient is cast twice (per row, per column) and the saved input once more in backward, where
    tensorwise writes both layouts from one scale (microbench15b f8lin kernel lists)."""
    tensorwise, rowwise = (_cast_bytes(FP8.with_(compile=True, fp8_recipe=r)) for r in ("tensorwise", "rowwise"))
    assert "q_proj.fp8_cast_x.bwd" in rowwise and "q_proj.fp8_cast_x.bwd" not in tensorwise
    assert "q_proj.fp8_cast_grad.t" in rowwise and sum(rowwise.values()) > sum(tensorwise.values())
    rw = FP8.with_(compile=True, fp8_recipe="rowwise")
    assert not any("fp8_layouts" in op.name for op in simulate(MODEL, H100, rw).timeline.ops)


def test_rowwise_eager_casts_launch_the_scale_rounding_kernels():
    """torchao's rowwise recipe rounds scales to powers of 2: log2, floor, exp2 per eager cast."""
    def kernels(plan):
        return sum(op.kernels for op in simulate(MODEL, H100, plan).timeline.ops if op.name.startswith("L0.q_proj")
                   or op.name.startswith("q_proj"))
    assert kernels(FP8.with_(fp8_recipe="rowwise")) > kernels(FP8)


def test_compiled_float8_keeps_no_fp8_input_and_tensorwise_recreates_it_in_backward():
    """Inductor's partitioner recomputes the fp8 inputs from tensors backward keeps anyway, so compiled
    float8 holds less than compiled bf16 by the normalised outputs it no longer keeps (1B case: 4.8 GiB)."""
    small = load_model("gpt3-1.7b")
    plan = FP8.with_(compile=True, micro_batch=4)
    ops = {op.name for op in simulate(small, H100, plan).timeline.ops}
    assert "q_proj.fp8_recast_x" in ops and "k_proj.fp8_recast_x" not in ops  # q, k, v share one input
    rowwise = {op.name for op in simulate(small, H100, plan.with_(fp8_recipe="rowwise")).timeline.ops}
    assert not any("recast" in n for n in rowwise)  # rowwise casts the saved input per column instead
    m, T = small, plan.micro_batch * plan.seq
    bf16 = simulate(small, H100, BF16.with_(compile=True, micro_batch=4)).hbm.peak_bytes
    assert simulate(small, H100, plan).hbm.peak_bytes < bf16 - m.num_layers * T * m.hidden_size * 2


def test_eager_torchao_launches_cost_the_plain_path_times_the_measured_ratio():
    """torchao's eager float8 layers launch many more kernels at about the plain eager path's host cost
    per launch (hostclean15: x1.08-1.09 on one host), not at our harness's per-op quantisation's; a rowwise
    step costs the host more than a tensorwise one (it runs tensorwise's casts and more)."""
    from ghsim.cost.calibration import load_calibration
    from ghsim.cost.compute import LaunchCosts
    from ghsim.cost.library_overheads import torchao_eager_launch_ratio

    cal = load_calibration(H100.calibration)
    plain = LaunchCosts.of(H100, cal, BF16)
    host = {}
    for recipe in ("tensorwise", "rowwise"):
        plan = FP8.with_(fp8_recipe=recipe)
        ao = LaunchCosts.of(H100, cal, plan)
        fwd, bwd = torchao_eager_launch_ratio(recipe)
        assert (ao.fwd_s, ao.bwd_s, ao.opt_s) == pytest.approx((plain.fwd_s * fwd, plain.bwd_s * bwd, plain.opt_s))
        assert ao.fwd_s > plain.fwd_s and ao.bwd_s > plain.bwd_s
        host[recipe] = sum(op.kernels * ao.per_kernel(op.phase) for op in simulate(MODEL, H100, plan).timeline.ops
                           if op.resource == "gpu" and op.phase in ("fwd", "bwd"))
    assert host["rowwise"] > host["tensorwise"]
    harness = LaunchCosts.of(H100, cal, BF16.with_(precision=Precision.FP8))  # no recipe: our harness's fp8
    assert harness.bwd_s == pytest.approx(cal.framework_overhead[LaunchCosts.FP8][1] * H100.host_path_factor)
    compiled = LaunchCosts.of(H100, cal, FP8.with_(compile=True))
    assert compiled.fwd_s == compiled.bwd_s == cal.eager_op_s  # Inductor's wrapper launches, not Float8Linear


def test_eager_ratios_are_the_clean_microbenchmarks_minimum():
    """The calibration's torchao host ratios are what report15c.py reads from hostclean15's rounds without the
    profiler (the minimum over the rounds), so a re-measurement or a changed statistic shows up here."""
    import importlib.util
    import json
    from pathlib import Path

    from ghsim.cost.library_overheads import torchao_eager_launch_ratio

    root = Path(__file__).resolve().parents[1] / "validation"
    spec = importlib.util.spec_from_file_location("report15c", root / "harness/fp8_compile/report15c.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    d = json.loads((root / "microbench/issue15/h100-hostclean15.json").read_text())
    measured = report.ratios(report.step_rows(d["launches"], d["clean"]["rounds"], min))
    for recipe in ("tensorwise", "rowwise"):
        assert torchao_eager_launch_ratio(recipe) == pytest.approx(
            (measured[recipe]["fwd"], measured[recipe]["bwd"]), abs=5e-4)
