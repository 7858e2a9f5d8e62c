"""Interval arithmetic, categories and the summary, including the simulator's entry point."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghsim.errors import GhsimError
from ghsim.traces import (CATEGORIES, CopyInterval, KernelInterval, categorize, load_trace, summarize,
                          summarize_intervals)
from ghsim.traces import intervals as iv
from ghsim.traces.summary import parse_steps
from synthetic_traces import KERNELS, write_kineto

# -- interval arithmetic against a brute-force reference --------------------------------------

spans = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)), max_size=30)
windows = st.lists(st.tuples(st.integers(0, 250), st.integers(1, 60)), min_size=1, max_size=4)


def _cells(pairs) -> set[int]:
    """Unit cells [t, t+1) covered by the intervals: a slow but obvious reference."""
    return {t for s, d in pairs for t in range(s, s + d)}


@settings(max_examples=150, deadline=None)
@given(spans, windows)
def test_union_coverage_and_gaps_match_brute_force(intervals, wins):
    starts = np.array([s for s, _ in intervals], np.int64)
    ends = np.array([s + d for s, d in intervals], np.int64)
    bs, be = iv.merge(starts, ends)
    assert np.all(bs[1:] > be[:-1]) and np.all(be >= bs)
    busy = _cells(intervals)
    assert int((be - bs).sum()) == len(busy)
    w = iv.as_windows([a for a, _ in wins], [a + d for a, d in wins])
    inside = _cells([(a, b - a) for a, b in w])
    assert iv.covered(bs, be, w) == len(busy & inside)
    g = iv.gaps(bs, be, w)
    assert int(g.sum()) == len(inside - busy) and np.all(g > 0)
    points = np.arange(0, 320, dtype=np.int64)
    assert iv.in_windows(points, w).tolist() == [int(p) in inside for p in points]


# -- categories -------------------------------------------------------------------------------

def test_categories_of_common_llm_kernels():
    cases = {
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT": "gemm",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cublas": "gemm",
        "ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_tn": "gemm",
        "void cutlass::Kernel2<cutlass3x_sm90_tensorop_gemm_bf16>(Params)": "gemm",
        "cublasLt::splitKreduce_kernel<32, 16, int, float>": "gemm",
        "triton_tem_fused_mm_0": "gemm",
        "flash_fwd_kernel": "attention",
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>": "attention",
        "fmha_cutlassF_bf16_aligned_64x128_rf_sm80": "attention",
        "cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0": "attention",
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>": "elementwise",
        "void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda>": "elementwise",
        "triton_poi_fused__to_copy_mul_0": "elementwise",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float>": "elementwise",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>": "norm_reduction",
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>": "norm_reduction",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>": "norm_reduction",
        "void at::native::nll_loss_forward_reduce_cuda_kernel_2d<float>": "norm_reduction",
        "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1": "norm_reduction",
        "rms_norm_kernel": "norm_reduction",
        "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>": "optimizer",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer",
        "_fused_adamw_kernel": "optimizer",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "communication",
        "ncclKernel_AllGather_RING_LL_Sum_int8_t": "communication",
        "void at::native::sbtopk::gatherTopK<float>": "other",
        "hadamard_transform_kernel": "other",
        "saxpy": "other",
    }
    for name, category in cases.items():
        assert categorize(name) == category, name
    for name, category in KERNELS:
        assert categorize(name) == category, name


@given(st.text(max_size=200))
def test_categorize_is_total(name):
    assert categorize(name) in CATEGORIES


# -- summarize_intervals (the simulator's side) -------------------------------------------------

def test_summarize_intervals_basic():
    kernels = [KernelInterval("gemm", 0.0, 0.004, "matmul"), KernelInterval("attention", 0.004, 0.002),
               KernelInterval("elementwise", 0.007, 0.001), KernelInterval("optimizer", 0.009, 0.001),
               KernelInterval("gemm", 0.010, 0.002, "matmul")]
    copies = [CopyInterval("HtoD", 1_000_000, 0.0, 0.001), CopyInterval("DtoH", 500, 0.011, 0.0005),
              CopyInterval("UM_HtoD", 2_000_000, 0.002, 0.003)]
    s = summarize_intervals(kernels, copies, steps_s=[(0.0, 0.006), (0.006, 0.012)])
    assert s.format == "intervals" and s.window == "2 steps"
    assert s.step_times_s == pytest.approx((0.006, 0.006))
    assert s.gpu_busy_fraction == pytest.approx(0.010 / 0.012)
    assert s.kernel_share_by_category["gemm"] == pytest.approx(0.6)
    assert s.kernel_share_by_category["attention"] == pytest.approx(0.2)
    assert math.isclose(sum(s.kernel_share_by_category.values()), 1.0)
    assert s.top_kernels[0].name == "matmul" and s.top_kernels[0].count == 2
    assert s.top_kernels[1].name == "attention"  # unnamed ops are named by category
    assert s.memcpy["HtoD"].bytes == 1_000_000 and s.memcpy["HtoD"].time_s == pytest.approx(0.001)
    assert s.memcpy["PtoP"].count == 0
    assert s.um_migration_share == pytest.approx(0.003 / 0.012)
    assert s.idle_gaps.count == 2 and s.idle_gaps.total_s == pytest.approx(0.002)
    d = s.to_dict()
    assert list(d)[:7] == ["gpu_busy_fraction", "idle_gaps", "kernel_share_by_category", "top_kernels", "memcpy",
                           "um_migration_share", "step_times_s"]


def test_summarize_intervals_dataframe_and_window():
    df = pd.DataFrame({"category": ["gemm", "communication"], "start_s": [0.0, 0.5], "dur_s": [1.0, 1.0]})
    s = summarize_intervals(df, window_s=(0.0, 2.0))
    assert s.gpu_busy_fraction == pytest.approx(0.75)
    assert s.kernel_share_by_category["communication"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown kernel categories"):
        summarize_intervals([KernelInterval("matmul", 0, 1)])
    with pytest.raises(ValueError, match="unknown copy directions"):
        summarize_intervals([], [CopyInterval("H2D", 1, 0, 1)])


def test_summarize_intervals_empty_timeline():
    s = summarize_intervals([], [])
    assert s.kernel_time_s == 0 and set(s.kernel_share_by_category.values()) == {0.0}
    assert s.gpu_busy_fraction is not None or s.device is None


def test_same_numbers_from_trace_and_from_intervals(tmp_path):
    """A measured trace and the same timeline given as intervals summarize identically."""
    path = tmp_path / "t.json"
    write_kineto(path, steps=3, kernels_per_step=40, seed=7)
    t = load_trace(path)
    measured = summarize(t, steps="2-3")
    k = t.kernels
    t0 = int(t.steps["start_ns"].min())  # seconds since the trace start: epoch ns do not fit a float
    kernels = pd.DataFrame({"category": [categorize(str(n)) for n in k["name"]], "name": k["name"].astype(str),
                            "start_s": (k["start_ns"] - t0) / 1e9, "dur_s": k["dur_ns"] / 1e9})
    c = t.memcpys
    copies = pd.DataFrame({"direction": c["kind"].astype(str), "bytes": c["bytes"],
                           "start_s": (c["start_ns"] - t0) / 1e9, "dur_s": c["dur_ns"] / 1e9})
    steps = t.steps[t.steps["step"].between(2, 3)]
    predicted = summarize_intervals(kernels, copies,
                                    steps_s=list(zip((steps["start_ns"] - t0) / 1e9, (steps["end_ns"] - t0) / 1e9)))
    assert predicted.gpu_busy_fraction == pytest.approx(measured.gpu_busy_fraction, abs=1e-9)
    for cat in CATEGORIES:
        assert predicted.kernel_share_by_category[cat] == pytest.approx(measured.kernel_share_by_category[cat],
                                                                         abs=1e-9)
    assert predicted.memcpy["HtoD"].bytes == measured.memcpy["HtoD"].bytes


# -- windows --------------------------------------------------------------------------------------

def test_parse_steps():
    assert parse_steps("3-5") == (3, 5) and parse_steps(" 4 ") == (4, 4) and parse_steps("2:3") == (2, 3)
    for bad in ("", "a-b", "5-3", "-1", "1-2-3"):
        with pytest.raises(GhsimError):
            parse_steps(bad)


def test_step_and_nvtx_windows(tmp_path):
    path = tmp_path / "t.json"
    exp = write_kineto(path, steps=5, kernels_per_step=20, first_step=10, seed=2)
    t = load_trace(path)
    s = summarize(t, steps="11-12")
    assert s.step_times_s == pytest.approx((exp["steps"][11] / 1e9, exp["steps"][12] / 1e9))
    assert sum(s.step_times_s) < s.window_s < sum(s.step_times_s) + 1e-4  # the span, gap between steps included
    one = summarize(t, steps="13")
    assert one.window == "step 13" and len(one.step_times_s) == 1
    glob = summarize(t, nvtx="ProfilerStep#1[12]")  # NVTX windows are the union of the ranges
    assert glob.step_times_s == pytest.approx(s.step_times_s)
    assert glob.window_s == pytest.approx(sum(s.step_times_s))
    assert glob.kernel_time_s == pytest.approx(s.kernel_time_s)
    assert summarize(t).kernel_count == exp["kernels"]
    with pytest.raises(GhsimError, match=r"missing 15-16.*ProfilerStep#10-14"):
        summarize(t, steps="14-16")
    with pytest.raises(GhsimError, match="no NVTX range named 'nope'"):
        summarize(t, nvtx="nope")
    with pytest.raises(GhsimError, match="not both"):
        summarize(t, steps="11", nvtx="x")


def test_to_table_renders_every_section(tmp_path):
    path = tmp_path / "t.json"
    write_kineto(path, steps=3, kernels_per_step=30, seed=4)
    text = summarize(load_trace(path), steps="1-2").to_table()
    for heading in ("GPU busy (kernels)", "Idle gaps", "Kernel time by category", "Top kernels",
                    "Memory operations", "Unified memory", "Allocator peak", "step times (ms)"):
        assert heading in text
    lines = text.splitlines()
    header = next(i for i, l in enumerate(lines) if l.strip().startswith("Category"))
    assert len(lines[header]) == len(lines[header + 1])  # dashes as wide as the header
