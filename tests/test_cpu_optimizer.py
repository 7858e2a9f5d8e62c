"""The host AdamW as the libraries run it: implementation, threads, cores (issue 14).

The curves come from the microbenchmark in validation/measured_libraries (hardware_profiles/
calibration/cpu_optimizers.toml); these tests check that the roofline reproduces those
measurements on the host they were taken on, that it only ever slows with less host, and that
each library's launcher gives its optimizer the threads it really gets.
"""

import json
from collections import Counter
from pathlib import Path

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
        if threads == 16 or impl == CpuOptimizer.TORCH_FORLOOP:  # its bytes are where the roof binds first
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


# --- torch's for-loop on FSDP2's DTensor shards (session 6: _raw/adamw_shapes/) ------------------

ADAMW_SHAPES = Path(__file__).resolve().parent.parent / "validation" / "measured_libraries" / "_raw" / "adamw_shapes"


def _llama_1b_rank_shards(ws: int) -> tuple[int, ...]:
    """One rank's Shard(0) tensor sizes of the Llama-3.2-1B shape, as (elements, count) pairs."""
    h, i, kv, layers, vocab = 2048, 8192, 512, 16, 128256
    sizes = Counter([vocab * h // ws] + [h * h // ws, kv * h // ws, kv * h // ws, h * h // ws, i * h // ws,
                                          i * h // ws, i * h // ws, h // ws, h // ws] * layers + [h // ws])
    return tuple(v for n, c in sorted(sizes.items()) for v in (n, c))


def test_forloop_size_profile_follows_the_thread_count():
    """Each measured thread count prices a tensor size at its own row; between them the factor is
    interpolated, so it never leaves the range the two rows give."""
    curve = curve_of(CpuOptimizer.TORCH_FORLOOP)
    one, sixteen = curve.size_rows[0], curve.size_rows[-1]
    assert (one.threads, sixteen.threads) == (1, 16)
    tensors = (1048576, 4)
    for row in (one, sixteen):
        assert curve.size_factor(tensors, row.threads) == pytest.approx(row.at(1048576) / row.at(curve.curve_elements))
    lo, hi = sorted(curve.size_factor(tensors, t) for t in (1, 16))
    assert lo - 1e-12 <= curve.size_factor(tensors, 4) <= hi + 1e-12


def test_single_row_implementations_keep_one_profile_at_any_thread_count():
    curve = curve_of(CpuOptimizer.TORCH_FUSED)
    tensors = (1048576, 8, 67108864, 2)
    assert len(curve.size_rows) == 1
    assert curve.size_factor(tensors, 1) == curve.size_factor(tensors, 16) == curve.size_factor(tensors)


def test_fsdp2_pays_dtensor_dispatch_per_tensor():
    """FSDP2's shards are DTensors: the step costs the measured dispatch per tensor on top of the
    plain for-loop, and a plan without fully_shard does not pay it."""
    tensors = _llama_1b_rank_shards(2)
    plain = HostSide.of(lent_host(), Plan(cpu_threads=1))
    fsdp2 = HostSide.of(lent_host(), Plan(cpu_threads=1, fsdp2=True))
    impl = CpuOptimizer.TORCH_FORLOOP
    params = sum(n * c for n, c in zip(tensors[::2], tensors[1::2]))
    extra = fsdp2.cpu_optimizer_time(params, impl, tensors) - plain.cpu_optimizer_time(params, impl, tensors)
    assert extra == pytest.approx(146 * curve_of(impl).dtensor_s_per_tensor[0][1])
    assert not plain.dtensor and fsdp2.dtensor


def test_prices_a_rank_of_the_two_gpu_fsdp2_step_as_the_microbenchmark_measured_it():
    """Held-out check inside the microbenchmark: one rank's whole 1B DTensor list at world size 2,
    one thread, both ranks stepping at once, against what the per-shape rows and the dispatch price
    (the rows come from lists of one shape each, not from this list)."""
    rows = [json.loads(line) for rank in (0, 1)
            for line in (ADAMW_SHAPES / f"call2_adamw_shapes_ws2_rank{rank}.jsonl").read_text().splitlines()]
    measured = [r["adamw_s"] for r in rows if r["what"] == "whole_1b"]
    assert len(measured) == 2
    tensors = _llama_1b_rank_shards(2)
    side = HostSide.of(lent_host(32), Plan(gpus=2, gpus_per_node=2, fsdp2=True))
    assert side.adam_threads == 1  # torchrun's OMP_NUM_THREADS=1 per rank
    params = sum(n * c for n, c in zip(tensors[::2], tensors[1::2]))
    predicted = side.cpu_optimizer_time(params, CpuOptimizer.TORCH_FORLOOP, tensors)
    for m in measured:
        assert predicted == pytest.approx(m, rel=0.10)


@pytest.mark.parametrize("value", [[[1, []]], [[0, [[1024, 1e6]]]], [[1, [[1024, -1.0]]]], [[1, 5]], [5]])
def test_malformed_size_rows_are_refused(value):
    from ghsim.cost.cpu_optimizer import _size_rows
    from ghsim.errors import GhsimError
    with pytest.raises(GhsimError, match="tensor-size rates"):
        _size_rows({"params_per_s_by_tensor_elements_by_threads": {"value": value, "source": "test"}}, "t")
