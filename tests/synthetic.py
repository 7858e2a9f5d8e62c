"""A synthetic calibration for unit and property tests.

Its numbers are round values of the right order for an H100 and are NOT used
for any prediction a user sees: real predictions use the measured files in
hardware_profiles/calibration/. Tests that use it check structure and
invariants (monotonicity, conservation), never accuracy.
"""

from __future__ import annotations

from ghsim.cost.calibration import Calibration, calibration_from_dict
from ghsim.hardware import load_hardware

# A small Llama-shaped model file for CLI tests (8 layers, hidden 1024)
TINY_MODEL_TOML = """name = "tiny-llama"
source = "test model: a Llama-shaped 8-layer transformer"
hidden_size = 1024
intermediate_size = 2816
num_layers = 8
num_attention_heads = 8
num_kv_heads = 8
vocab_size = 32000
max_seq_len = 4096
"""


def synthetic_microbench(gemm_eff: float = 0.7, hbm_gbps: float = 2800.0) -> dict:
    peaks = {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12, "fp8": 1978.9e12}
    gemm = []
    for dtype, peak in peaks.items():
        for m in (512, 2048, 8192, 32768):
            for n, k in ((4096, 4096), (11008, 4096), (4096, 11008), (32000, 4096), (16, 4096), (4096, 16)):
                size_factor = min(1.0, (m * n * k) / (2048 * 4096 * 4096)) ** 0.25
                eff = gemm_eff * size_factor
                gemm.append({"m": m, "n": n, "k": k, "dtype": dtype, "tflops": eff * peak / 1e12,
                             "time_s": 2 * m * n * k / (eff * peak)})
    attention = []
    for seq in (1024, 2048, 4096, 8192):
        for heads in (16, 32, 64):
            attention.append({"batch": 1, "heads": heads, "kv_heads": 8, "seq": seq, "head_dim": 128,
                              "dtype": "bf16", "causal": True,
                              "fwd_time_s": 2 * heads * seq * seq * 128 / (0.5 * peaks["bf16"]),
                              "bwd_time_s": 5 * heads * seq * seq * 128 / (0.4 * peaks["bf16"])})
    memory_bound = []
    for op in ("copy", "add", "cast_fp32_to_bf16", "rmsnorm_fwd", "rmsnorm_bwd", "silu_mul", "rope",
               "cross_entropy_fwd", "cross_entropy_bwd"):
        for nbytes in (1e6, 1e8, 1e9):
            t = 3e-6 + nbytes / (hbm_gbps * 1e9)
            memory_bound.append({"op": op, "numel": nbytes / 4, "dtype": "fp32", "bytes_moved": nbytes,
                                 "time_s": t, "gbps": nbytes / t / 1e9})
    optimizer_gpu = [{"impl": impl, "n_params": n, "n_tensors": 100, "time_s": 1e-4 + n / rate,
                      "params_per_s": n / (1e-4 + n / rate)}
                     for impl, rate in (("foreach", 30e9), ("fused", 60e9)) for n in (1e8, 1e9)]
    return {
        "meta": {"gpu": "synthetic", "reference_profile": "h100-sxm"},
        "gemm": gemm,
        "attention": attention,
        "memory_bound": memory_bound,
        "host_copy": [],
        "optimizer_gpu": optimizer_gpu,
        "optimizer_cpu": [{"impl": "fused", "threads": 16, "n_params": 1e8, "time_s": 0.1, "params_per_s": 1e9}],
        "launch": {"empty_kernel_us": 3.0, "eager_small_op_us": 8.0, "cuda_graph_kernel_us": 1.5},
    }


def synthetic_calibration(**kw) -> Calibration:
    return calibration_from_dict(synthetic_microbench(**kw), load_hardware("h100-sxm"), "synthetic")
