"""The host AdamW as the libraries run it: implementation, threads, cores (issue 14).

The curves come from the microbenchmark in validation/measured_libraries (hardware_profiles/
calibration/cpu_optimizers.toml); these tests check that the roofline reproduces those
measurements on the host they were taken on, that it only ever slows with less host, and that
each library's launcher gives its optimizer the threads it really gets.
"""

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from ghsim.cli import main
from ghsim.cost.cpu_optimizer import ADAMW_STREAM_BYTES, cpu_optimizer_table, curve_of
from ghsim.cost.hostlink import HostSide
from ghsim.graph.optimizer import resolve_cpu_optimizer
from ghsim.hardware import load_hardware
from ghsim.plan import CpuOptimizer, Framework, OffloadSchedule, Plan

IMPLS = [c for c in CpuOptimizer if c != CpuOptimizer.AUTO]
REF_HOST, _ = cpu_optimizer_table()


def lent_host(cores: int = 16):
    """The 16-vCPU machine the curves were measured on: its cores and measured streaming bandwidth."""
    return load_hardware("h100-sxm", {
        "cpu.cores": {"value": cores, "source": "test"},
        "cpu.adamw_params_per_s": {"value": REF_HOST.stream_bandwidth / ADAMW_STREAM_BYTES, "source": "test"}})


@pytest.mark.parametrize("impl", IMPLS)
def test_reproduces_the_microbenchmark_on_its_host(impl):
    """On the measuring host, at 16 threads, the model gives the measured rate (within 1%);
    at fewer threads never more than measured (the bandwidth roof may bind earlier)."""
    curve = curve_of(impl)
    for threads, measured in zip(curve.threads, curve.params_per_s):
        side = HostSide.of(lent_host(), Plan(cpu_optimizer=impl, cpu_threads=threads))
        rate = side.cpu_adamw_rate(impl)
        assert rate <= measured * 1.01
        if threads == 16:
            assert rate == pytest.approx(measured, rel=0.01)


def test_implementations_differ_as_measured():
    side = HostSide.of(lent_host(), Plan())
    rates = {impl: side.cpu_adamw_rate(impl) for impl in IMPLS}
    assert rates[CpuOptimizer.TORCH_FUSED] > rates[CpuOptimizer.DEEPSPEED] > 4 * rates[CpuOptimizer.TORCH_FOREACH]
    # the for-loop's curve is taken on LLM-sized (16M-element) tensors, where each of its passes
    # goes to DRAM: over six times slower than the single-pass implementations
    assert rates[CpuOptimizer.TORCH_FUSED] > 6 * rates[CpuOptimizer.TORCH_FORLOOP]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(IMPLS), st.integers(1, 256), st.integers(1, 256))
def test_more_cores_never_slow_the_optimizer(impl, cores, more):
    few = HostSide.of(lent_host(cores), Plan(cpu_optimizer=impl)).cpu_adamw_rate(impl)
    many = HostSide.of(lent_host(cores + more), Plan(cpu_optimizer=impl)).cpu_adamw_rate(impl)
    assert many >= few > 0


def test_each_library_runs_its_own_optimizer():
    assert resolve_cpu_optimizer(Plan(framework=Framework.DEEPSPEED)) == CpuOptimizer.DEEPSPEED
    assert resolve_cpu_optimizer(Plan(offload_schedule=OffloadSchedule.SUPEROFFLOAD)) == CpuOptimizer.DEEPSPEED
    assert resolve_cpu_optimizer(Plan(framework=Framework.FSDP_MIXED)) == CpuOptimizer.TORCH_FORLOOP
    assert resolve_cpu_optimizer(Plan(cpu_optimizer=CpuOptimizer.TORCH_FUSED)) == CpuOptimizer.TORCH_FUSED


def test_threads_as_the_launchers_give_them():
    hw = lent_host(16)
    # torchrun, several ranks per node: OMP_NUM_THREADS=1, torch's CPU AdamW on one thread per rank
    torchrun = HostSide.of(hw, Plan(gpus=2, gpus_per_node=2, framework=Framework.FSDP_MIXED))
    assert torchrun.optimizer_threads == 1
    # DeepSpeed's ranks share the cores
    ds = HostSide.of(hw, Plan(gpus=2, gpus_per_node=2, framework=Framework.DEEPSPEED))
    assert ds.optimizer_threads == 8
    # SuperOffload pins its CPU-Adam worker to all but int((1 - perc) x 16) cores (3 at 0.8, 1 at 0.9, as
    # DeepSpeed's _set_cpu_affinity splits them); the training process's OpenMP threads keep every core
    so = HostSide.of(hw, Plan(offload_schedule=OffloadSchedule.SUPEROFFLOAD, offload=frozenset({"optimizer"})))
    assert (so.optimizer_threads, so.main_threads) == (13, 16)
    so9 = HostSide.of(hw, Plan(offload_schedule=OffloadSchedule.SUPEROFFLOAD, cpu_cores_share=0.9))
    assert (so9.optimizer_threads, so9.main_threads) == (15, 16)
    # a stated thread count wins, capped at the cores one GPU has
    assert HostSide.of(hw, Plan(cpu_threads=64)).optimizer_threads == 16


def _simulate(*flags):
    res = CliRunner().invoke(main, ["simulate", "--model", "llama-2-7b", "--hardware", "h100-sxm", "--seq", "1024",
                                    "--offload", "optimizer", "--json", *flags])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_the_user_states_their_host_and_the_report_says_which():
    big = _simulate("--cpu-optimizer", "deepspeed-cpuadam")
    vm = _simulate("--cpu-optimizer", "deepspeed-cpuadam", "--host-cores", "16")
    assert vm["step_time_s"] > big["step_time_s"]
    note = next(n for n in vm["notes"] if n.startswith("host:"))
    assert "16 cores" in note and "deepspeed-cpuadam on 16 thread(s)" in note
    slow = _simulate("--cpu-optimizer", "torch-foreach", "--host-cores", "16")
    assert slow["step_time_s"] > vm["step_time_s"]


@pytest.mark.parametrize("flags, message", [
    (["--cpu-optimizer", "banana"], "Invalid value for '--cpu-optimizer'"),
    (["--host-cores", "0"], "--host-cores must be at least 1"),
    (["--cpu-threads", "-1"], "--cpu-threads must not be negative"),
    (["--cpu-cores-share", "1.5"], "share of the cores must lie in [0, 1]"),
])
def test_bad_host_input_is_one_line(flags, message):
    res = CliRunner().invoke(main, ["simulate", "--model", "llama-2-7b", "--offload", "optimizer", *flags])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output


def test_deepspeed_config_says_what_it_read_otherwise(tmp_path):
    from ghsim.deepspeed import read_ds_config

    cfg = {"bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": "auto", "optimizer": {"type": "AdamW"},
           "zero_optimization": {"stage": 3, "overlap_comm": True, "reduce_bucket_size": 5e7,
                                 "offload_optimizer": {"device": "cpu", "super_offload": True,
                                                       "cpuadam_cores_perc": 0.9}}}
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(cfg))
    fields, notes = read_ds_config(p)
    assert fields["offload_pinned"] is True and fields["cpu_cores_share"] == 0.9
    assert any("bf16.enabled" in n for n in notes) and any("train_micro_batch_size_per_gpu" in n for n in notes)
    assert any("overlap_comm" in n for n in notes) and fields["reduce_bucket_size"] == 5e7  # read, not noted
    for bad, message in ((dict(cfg, optimizer={"type": "Lion"}), "not modeled"),
                         ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "super_offload": True}}},
                          "needs zero_optimization.stage 3")):
        p.write_text(json.dumps(bad))
        res = CliRunner().invoke(main, ["simulate", "--model", "llama-2-7b", "--deepspeed", str(p)])
        assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output
