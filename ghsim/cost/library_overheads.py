"""Host time and kernel choices of the training libraries, measured
(hardware_profiles/calibration/library_overheads.toml, each figure sourced)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ghsim.tomlio import read_toml, repo_root, sourced

TABLE = repo_root() / "hardware_profiles" / "calibration" / "library_overheads.toml"


@lru_cache(maxsize=8)
def _figure(section: str, key: str) -> float:
    return sourced(read_toml(TABLE).get(section, {}), key, f"{TABLE} [{section}]")


def sdpa_fallback_rate() -> float:
    """PyTorch SDPA's rate at a head dimension its cuDNN kernels do not take, relative to theirs."""
    return _figure("pytorch_sdpa", "fallback_rate")


def sdpa_mask_over_causal_time() -> float:
    """PyTorch SDPA with a boolean attention mask (every pair computed) over the same call with is_causal."""
    return _figure("pytorch_sdpa", "mask_over_causal_time")


@lru_cache(maxsize=64)
def sdpa_bool_mask_slowdown(head_dim: int, backward: bool) -> float:
    """PyTorch SDPA's time with a boolean causal mask and expanded k/v (Hugging Face under
    torch.compile) over is_causal with enable_gqa, by head dimension (measured at a few)."""
    prefix = "bwd_" if backward else "fwd_"
    dims = sorted(int(k[len(prefix):]) for k in read_toml(TABLE).get("pytorch_sdpa_bool_mask", {}) if k.startswith(prefix))
    ratios = [_figure("pytorch_sdpa_bool_mask", f"{prefix}{d}") for d in dims]
    return float(np.interp(head_dim, dims, ratios))


def torchao_eager_launch_ratio(recipe: str) -> tuple[float, float]:
    """Host seconds per launch of a decoder layer under torchao's eager float8 `recipe` over the same
    layer in bf16, measured on one host: (forward, backward)."""
    return _figure("torchao_float8_eager", f"{recipe}_fwd"), _figure("torchao_float8_eager", f"{recipe}_bwd")


def zero3_hook_seconds() -> tuple[float, float]:
    """DeepSpeed ZeRO-3's host seconds per module with parameters: (forward, backward)."""
    return _figure("deepspeed_zero3", "hook_fwd_s"), _figure("deepspeed_zero3", "hook_bwd_s")


def blocking_cast_seconds_per_param(page_size_kb: float = 4.0) -> float:
    """Host seconds per parameter torch spends casting fp32 host memory to 16 bits into a fresh
    pageable tensor before a blocking copy up (the cast, not the copy). Measured on 4 KiB pages; the
    page faults' fixed part scales with the number of pages the fresh tensor spans (Grace: 64 KiB)."""
    fault_share = _figure("torch_copy", "first_touch_fault_share")
    pages = 4.0 / page_size_kb  # 4 KiB: the measuring host's pages (library_overheads.toml first_touch_fault_share)
    return _figure("torch_copy", "blocking_cast_s_per_param") * (1.0 - fault_share + fault_share * pages)


def superoffload_worker_pace() -> tuple[float, float]:
    """DeepSpeed SuperOffload's CPU-Adam worker process: its pace per parameter as a share of
    DeepSpeedCPUAdam's measured rate on the worker's cores, and its seconds per sub-group handed
    over (queue, the copy of the gradient into its pinned buffer's first use, the result back)."""
    return (_figure("deepspeed_superoffload", "worker_rate_share"),
            _figure("deepspeed_superoffload", "handoff_s_per_sub_group"))


def training_process_host_bytes(deepspeed: bool = False) -> float:
    """Host memory the training process holds of its own (torch, the CUDA context, cuBLAS and
    cuDNN, transformers; `deepspeed`: and DeepSpeed's engine), measured on an x86 host; assumed
    the same elsewhere."""
    return _figure("training_process", "deepspeed_host_bytes" if deepspeed else "host_bytes")


def superoffload_worker_host_bytes() -> float:
    """Host memory DeepSpeed SuperOffload's spawned CPU-Adam worker holds of its own (its torch,
    DeepSpeed and CUDA context), besides its moments and gradient buffer (graph/states.py)."""
    return _figure("deepspeed_superoffload", "worker_process_host_bytes")
