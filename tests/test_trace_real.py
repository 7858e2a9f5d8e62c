"""The importers against real traces written by other people (tests/trace_inputs.py finds them).

Every expected number comes from shared/traces/README.md and is asserted exactly.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ghsim.traces import CATEGORIES, categorize, load_trace, summarize
from trace_inputs import trace_path

SAXPY = "pipit_saxpy-mpi-cuda_nsys_perlmutter0_a100.sqlite"
CLOVER = "pipit_perlmutter-cloverleaf-cuda_a100.sqlite"
RANK16 = "hta_a100_16rank_training_rank0.pt.trace.json.gz"
DDP = "hta_a100_ddp_nccl_rank0.pt.trace.json.gz"
SWITCH = "switchtransformer_a100_inference_profile_memory.pt.trace.json"


def _path(name: str) -> Path:
    return trace_path(name)


_cache: dict[str, object] = {}


def trace(name: str):
    if name not in _cache:
        _cache[name] = load_trace(_path(name))
    return _cache[name]


def copies(t, kind: str) -> tuple[int, int, int]:
    rows = t.memcpys[t.memcpys["kind"] == kind]
    return len(rows), int(rows["bytes"].sum()), int(rows["dur_ns"].sum())


def nvtx_counts(t, on_gpu: bool | None = None) -> dict[str, int]:
    rows = t.nvtx if on_gpu is None else t.nvtx[t.nvtx["on_gpu"] == on_gpu]
    return rows.groupby("name").size().to_dict()


# -- nsys SQLite -------------------------------------------------------------------


def test_saxpy_kernels_copies_gpu():
    t = trace(SAXPY)
    assert t.format == "nsys-sqlite" and t.meta["EXPORT_PRODUCT_VERSION"] == "2022.2.1.31"
    k = t.kernels
    assert len(k) == 5 and int(k["dur_ns"].sum()) == 88_573_480
    assert set(k["short_name"]) == {"saxpy"}
    assert set(k["name"]) == {"saxpy(double *, double *, double *, double, int)"}
    assert set(k["device"]) == {0} and set(k["stream"]) == {7}
    assert copies(t, "HtoD") == (10, 2_621_440_000, 186_001_123)
    assert copies(t, "DtoH") == (5, 1_310_720_000, 98_698_477)
    assert set(t.memcpys["memory"]) == {"pageable"}
    assert t.memsets.empty and t.um_faults.empty
    (gpu,) = t.gpus
    assert (gpu.name, gpu.sm_count, gpu.memory_bandwidth_bytes_per_s, gpu.clock_hz) == (
        "NVIDIA A100-SXM4-40GB", 108, 1_555_200_000_000, 1_410_000_000)


def test_saxpy_nvtx_ranges():
    t = trace(SAXPY)
    assert nvtx_counts(t) == {"MPI_Init": 1, "MPI_Send": 10, "MPI_Recv": 5, "MPI_Finalize": 1, "saxpy": 5}
    mpi = t.nvtx[t.nvtx["name"].str.startswith("MPI_")]
    assert set(mpi["domain"]) == {"MPI"}
    saxpy = t.nvtx[t.nvtx["name"] == "saxpy"]
    assert set(saxpy["domain"]) == {""}
    assert int((saxpy["end_ns"] - saxpy["start_ns"]).sum()) == 231_248
    assert t.steps.empty


def test_cloverleaf_kernels_and_copies():
    t = trace(CLOVER)
    assert t.meta["EXPORT_PRODUCT_VERSION"] == "2024.5.1.113"
    k = t.kernels
    assert len(k) == 1312 and int(k["dur_ns"].sum()) == 294_404_540
    by_short = k.groupby("short_name", observed=True)["dur_ns"].agg(["size", "sum"]).to_dict("index")
    assert by_short == {
        "par_ranged2d_kernel": {"size": 331, "sum": 267_056_876},
        "par_reduce_kernel": {"size": 13, "sum": 22_654_310},
        "par_ranged1d_kernel": {"size": 968, "sum": 4_693_354},
    }
    assert set(k["device"]) == {0} and k["stream"].nunique() == 1
    assert copies(t, "HtoD") == (254, 225_065_752, 9_346_285)
    assert copies(t, "DtoH") == (25, 51_200, 44_638)
    assert t.nvtx.empty and t.memsets.empty
    assert len(t.gpus) == 4
    assert {(g.name, g.sm_count, g.memory_bandwidth_bytes_per_s, g.total_memory_bytes) for g in t.gpus} == {
        ("NVIDIA A100-SXM4-80GB", 108, 2_039_040_000_000, 84_990_623_744)}


# -- Kineto ------------------------------------------------------------------------------


def test_16rank_steps_kernels_copies():
    t = trace(RANK16)
    assert t.format == "kineto-json"
    steps = dict(zip(t.steps["step"], t.steps["end_ns"] - t.steps["start_ns"]))
    assert steps == {550: 209_748_000, 551: 216_483_000, 552: 216_119_000, 553: 215_467_000, 554: 216_216_000}
    k = t.kernels
    assert len(k) == 6080 and int(k["dur_ns"].sum()) == 401_445_000
    assert set(k["stream"]) == {7, 27, 84, 285, 363}
    assert int(t.memcpys["bytes"].sum()) == 16_890_869_512 and len(t.memcpys) == 1390
    assert copies(t, "DtoD")[0] == 1280
    htod = t.memcpys[t.memcpys["kind"] == "HtoD"]
    assert htod["memory"].value_counts().to_dict() == {"pageable": 45, "pinned": 35, "device": 0, "managed": 0,
                                                       "unknown": 0}
    dtoh = t.memcpys[t.memcpys["kind"] == "DtoH"]
    assert len(dtoh) == 30 and set(dtoh["memory"]) == {"pageable"}
    assert len(t.memsets) == 277 and int(t.memsets["bytes"].sum()) == 333_352
    assert t.memory.empty and t.memory_peaks() == {}
    assert t.gpus[0].name == "NVIDIA A100-SXM4-80GB"


def test_ddp_new_format_steps_kernels_annotations():
    t = trace(DDP)
    steps = dict(zip(t.steps["step"], t.steps["end_ns"] - t.steps["start_ns"]))
    assert steps == {4: 222_442_191, 5: 219_726_905, 6: 224_936_243}
    # Relative float microseconds + baseTimeNanoseconds -> absolute epoch ns (captured 2024-05-22).
    assert 1_716_336_000_000_000_000 < int(t.steps["start_ns"].min()) < 1_716_508_800_000_000_000
    k = t.kernels
    assert len(k) == 2700 and int(k["dur_ns"].sum()) == 162_532_340
    assert set(k["stream"]) == {7, 40}
    assert copies(t, "DtoD")[:2] == (960, 307_323_096) and len(t.memcpys) == 960
    assert len(t.memsets) == 114 and int(t.memsets["bytes"].sum()) == 409_141_005
    assert nvtx_counts(t, on_gpu=True) == {"nccl:all_reduce": 15, "nccl:broadcast": 6, "## backward ##": 3,
                                           "DistributedDataParallel.forward": 3, "Optimizer.step#SGD.step": 3}


def test_switch_transformer_memory_and_copies():
    t = trace(SWITCH)
    k = t.kernels
    assert len(k) == 484 and int(k["dur_ns"].sum()) == 559_309_000
    assert copies(t, "DtoD")[0] == 10 and copies(t, "DtoH")[0] == 20
    assert set(t.memcpys.loc[t.memcpys["kind"] == "DtoH", "memory"]) == {"pinned"}
    assert int(t.memcpys["bytes"].sum()) == 2_684_354_580
    assert len(t.memsets) == 10
    assert t.steps.empty
    assert len(t.memory) == 1030  # CUDA allocator events; the 40 CPU ones are dropped
    assert t.memory_peaks() == {0: (23_111_038_976, 23_616_028_672)}


# -- categories on real kernel names -------------------------------------------------------


def _category_time(t) -> dict[str, int]:
    cats = t.kernels["name"].astype(str).map(categorize)
    return t.kernels.groupby(cats)["dur_ns"].sum().to_dict()


def test_categorize_real_kernel_names():
    names = set()
    for name in (RANK16, DDP, SWITCH):
        names |= set(trace(name).kernels["name"].astype(str))
    expect = {
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)": "communication",
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)": "communication",
        "ampere_sgemm_128x64_tn": "gemm",
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1>(cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1::Params)": "gemm",
        "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_infer": "gemm",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)": "elementwise",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*, float const*, float const*, float*, float*, float*)": "norm_reduction",
        "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*, float const*, int, int, int, bool const*, int, bool)": "norm_reduction",
    }
    for name, category in expect.items():
        assert name in names, name
        assert categorize(name) == category, name
    adam = [n for n in names if "AdamFunctor" in n]
    sgd_foreach = [n for n in names if "multi_tensor_apply" in n and "BinaryOpListAlphaFunctor" in n]
    bn = [n for n in names if "cudnn::bn_fw" in n or "cudnn::bn_bw" in n]
    assert adam and sgd_foreach and bn
    assert {categorize(n) for n in adam + sgd_foreach} == {"optimizer"}
    assert {categorize(n) for n in bn} == {"norm_reduction"}
    assert all(categorize(n) in CATEGORIES for n in names)


def test_category_mix_of_real_traces():
    switch = _category_time(trace(SWITCH))
    assert switch["gemm"] / sum(switch.values()) > 0.9  # ampere_sgemm dominates the MoE inference
    rank16 = _category_time(trace(RANK16))
    assert rank16["communication"] == 190_345_000  # the NCCL SendRecv kernels, 47% of kernel time
    ddp = _category_time(trace(DDP))
    assert ddp.get("other", 0) / sum(ddp.values()) < 0.05


# -- summaries of real traces -------------------------------------------------------------


@pytest.mark.parametrize("name", [SAXPY, CLOVER, RANK16, DDP, SWITCH])
def test_summary_invariants(name):
    s = summarize(trace(name))
    assert math.isclose(sum(s.kernel_share_by_category.values()), 1.0, rel_tol=1e-12)
    assert 0 < s.gpu_busy_fraction <= 1
    assert s.idle_gaps.total_s <= s.window_s
    assert math.isclose(s.gpu_busy_fraction * s.window_s + s.idle_gaps.total_s, s.window_s, rel_tol=1e-9)
    assert s.kernel_count == len(trace(name).kernels)
    assert sum(b.count for b in s.idle_gaps.histogram) == s.idle_gaps.count
    assert s.um_migration_share == 0.0


def test_summary_steps_window_16rank():
    s = summarize(trace(RANK16), steps="551-553")
    assert s.step_times_s == (0.216483, 0.216119, 0.215467)
    steps = trace(RANK16).steps.set_index("step")
    assert s.window_s * 1e9 == pytest.approx(steps.loc[553, "end_ns"] - steps.loc[551, "start_ns"])
    assert summarize(trace(RANK16), steps="all").step_times_s == (0.209748, 0.216483, 0.216119, 0.215467, 0.216216)
    assert s.kernel_share_by_category["communication"] > 0.3
    assert s.memory_peak is None


def test_summary_nvtx_window_saxpy():
    s = summarize(trace(SAXPY), nvtx="saxpy")
    assert s.window == "nvtx 'saxpy' (5 ranges)" and len(s.step_times_s) == 5
    assert sum(s.step_times_s) == pytest.approx(231_248e-9)


def test_summary_memory_peak_switch():
    s = summarize(trace(SWITCH))
    assert s.memory_peak == {"allocated_bytes": 23_111_038_976, "reserved_bytes": 23_616_028_672}
    assert s.memcpy["DtoD"].count == 10 and s.memcpy["DtoH"].count == 20
    assert s.memcpy["DtoD"].bytes + s.memcpy["DtoH"].bytes == 2_684_354_580
