"""Write NVIDIA's published NeMo / Megatron-Bridge / MLPerf H100 training throughputs as `ghsim validate` cases.

Sources (each row names its own):
- NeMo 24.07, DGX-H100, FP8 (Transformer Engine delayed scaling, NeMo's default recipe then):
  github.com/NVIDIA/NeMo commit 9c5c5e9709407d3511005fc966e45374998bb478,
  docs/source/performance/performance_summary.md ("Pretraining" and "Finetuning" tables).
- MLPerf Training v4.0, NVIDIA's Llama-2-70B LoRA on one DGX H100: the result log's throughput and the
  submission's config (MLPERF below).
- Megatron-Bridge (NeMo 25.11, 26.04, 26.06 containers), DGX-H100, FP8-CS (per-tensor current
  scaling: Megatron's --fp8-recipe tensorwise): github.com/NVIDIA-NeMo/Megatron-Bridge commit
  067f987df03b8355b03192d88d70f1709fedf51a, docs/performance-summary-archive.md.

Step time = GBS x sequence length / (tokens per second per GPU x GPUs). The tables give throughput
only: the cases state no memory peak. Rows that need context parallelism (CP > 1) or models outside
ghsim's catalog (Nemotron, MoE rows) are listed in README.md and not written.

Run from the repository root: python validation/published/nemo-h100/make_cases.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from write_cases import write_cases  # noqa: E402

NEMO = ("github.com/NVIDIA/NeMo commit 9c5c5e9709407d3511005fc966e45374998bb478 "
        "docs/source/performance/performance_summary.md")
BRIDGE = ("github.com/NVIDIA-NeMo/Megatron-Bridge commit 067f987df03b8355b03192d88d70f1709fedf51a "
          "docs/performance-summary-archive.md")

# (name, source, table, model, gpus, gbs, mbs, seq, tp, pp, vp, zero, recipe, lora rank, tokens/s/GPU)
# zero: 1 = Megatron's distributed optimizer (NeMo's default), 3 = Megatron FSDP (the table's FSDP column)
ROWS = [
    ("nemo2407-llama2-7b-pretrain", NEMO, "NeMo 24.07 Pretraining, LLAMA2-7B", "llama-2-7b",
     8, 128, 1, 4096, 1, 1, 1, 1, "delayed", 0, 16934),
    ("nemo2407-llama2-13b-pretrain", NEMO, "NeMo 24.07 Pretraining, LLAMA2-13B", "llama-2-13b",
     16, 128, 1, 4096, 1, 4, 10, 1, "delayed", 0, 8715),
    ("nemo2407-llama2-70b-pretrain", NEMO, "NeMo 24.07 Pretraining, LLAMA2-70B", "llama-2-70b",
     64, 128, 1, 4096, 4, 4, 20, 1, "delayed", 0, 1728),
    ("nemo2407-gpt3-175b-pretrain-128gpu", NEMO, "NeMo 24.07 Pretraining, GPT3-175B, 128 GPUs", "gpt3-175b",
     128, 256, 1, 2048, 4, 8, 6, 1, "delayed", 0, 716),
    ("nemo2407-gpt3-175b-pretrain-512gpu", NEMO, "NeMo 24.07 Pretraining, GPT3-175B, 512 GPUs", "gpt3-175b",
     512, 2048, 2, 2048, 4, 8, 6, 1, "delayed", 0, 825),
    ("nemo2407-llama2-7b-sft", NEMO, "NeMo 24.07 Finetuning, LLAMA2-7B SFT", "llama-2-7b",
     8, 32, 1, 4096, 1, 1, 1, 1, "delayed", 0, 16891),
    ("nemo2407-llama2-13b-sft", NEMO, "NeMo 24.07 Finetuning, LLAMA2-13B SFT", "llama-2-13b",
     8, 32, 1, 4096, 1, 4, 1, 1, "delayed", 0, 10176),
    ("nemo2407-llama2-70b-sft", NEMO, "NeMo 24.07 Finetuning, LLAMA2-70B SFT", "llama-2-70b",
     16, 32, 1, 4096, 4, 4, 1, 1, "delayed", 0, 1816),
    ("nemo2407-llama2-7b-lora", NEMO, "NeMo 24.07 Finetuning, LLAMA2-7B LoRA", "llama-2-7b",
     8, 32, 1, 4096, 1, 1, 1, 1, "delayed", 32, 24824),
    ("nemo2407-llama2-13b-lora", NEMO, "NeMo 24.07 Finetuning, LLAMA2-13B LoRA", "llama-2-13b",
     8, 32, 1, 4096, 1, 1, 1, 1, "delayed", 32, 14629),
    ("nemo2407-llama2-70b-lora", NEMO, "NeMo 24.07 Finetuning, LLAMA2-70B LoRA", "llama-2-70b",
     8, 32, 1, 4096, 2, 4, 1, 1, "delayed", 32, 2621),
    ("bridge2511-llama3-8b-pretrain", BRIDGE, "25.11 NeMo Container, DGX-H100, LLAMA3_8B FP8-CS", "llama-3-8b",
     8, 128, 1, 8192, 1, 1, 1, 3, "tensorwise", 0, 14451),
    ("bridge2511-llama3-70b-pretrain", BRIDGE, "25.11 NeMo Container, DGX-H100, LLAMA3_70B FP8-CS", "llama-3-70b",
     64, 128, 1, 8192, 4, 8, 5, 1, "tensorwise", 0, 1602),
    ("bridge2604-llama3-70b-pretrain", BRIDGE, "26.04 NeMo Container, Model LLAMA3_70B, DGX-H100 FP8", "llama-3-70b",
     64, 256, 1, 8192, 4, 8, 5, 1, "tensorwise", 0, 1633),
    ("bridge2606-llama3-70b-sft", BRIDGE, "26.06 NeMo Container, SFT, LLAMA3_70B, DGX-H100 FP8", "llama-3-70b",
     32, 32, 1, 4096, 4, 4, 5, 1, "tensorwise", 0, 1638),
    ("bridge2606-llama3-70b-lora", BRIDGE, "26.06 NeMo Container, LoRA, LLAMA3_70B, DGX-H100 FP8", "llama-3-70b",
     8, 32, 1, 4096, 2, 4, 20, 1, "tensorwise", 32, 2643),
    # the only H100 BF16 rows of these tables: GPT-OSS 120B (MoE, 128 experts top-4, EP 8)
    ("bridge2511-gpt-oss-120b-bf16", BRIDGE, "25.11 NeMo Container, DGX-H100, GPT OSS 120B BF16", "gpt-oss-120b",
     64, 512, 4, 4096, 1, 4, 1, 1, "", 0, 5630),
    ("bridge260401-gpt-oss-120b-bf16", BRIDGE, "26.04.01 NeMo Container, Model GPT OSS 120B, DGX-H100 BF16",
     "gpt-oss-120b", 64, 1280, 1, 4096, 1, 4, 1, 1, "", 0, 5824),
]
EP = {"gpt-oss-120b": 8}  # the tables' EP column

MLPERF = ("github.com/mlcommons/training_results_v4.0 commit 62f111b7690f163b269f32e4f93dcaaa13717c9c "
          "NVIDIA/results/eos_ngc24.04_nemo/llama2_70b_lora/result_0.txt (tracked_stats throughput of the four "
          "steady blocks after the first: 2.1572, 2.1554, 2.1550, 2.1552 samples/s, median 2.1553; the first block "
          "includes warm-up) and NVIDIA/benchmarks/llama2_70b_lora/implementations/nemo/config_DGXH100_1x8x4xtp4pp1cp1.sh, "
          "configs/config_common.sh, conf/megatron_gpt_peft_tuning_config.yaml")
MLPERF_CASE = f'''[case]
name = "mlperf40-llama2-70b-lora-1node"
description = "MLPerf Training v4.0, NVIDIA Llama-2-70B LoRA on one DGX H100 (8 GPUs), TP 4 + SP, DP 2, GBS 8, MBS 1, seq 8192, FP8 (delayed, amax history 32), LoRA rank 16 on attention"
hardware = "h100-sxm"
published = true
source = "{MLPERF}"
method = "step time = GBS / samples per second = 8 / 2.1553; fp8 parameters (fp8_params: --fp8-params); the config also runs FP8 attention (FP8_DPA=1), no weight-transpose cache (disable_parameter_transpose_cache) and userbuffer TP-communication overlap, which ghsim does not model (it prices bf16 attention, TE's cached transposes, and unoverlapped TP collectives); LoRA target 'attention' = the fused QKV and output projections; adapter dropout 0.1 not priced"

[model]
name = "llama-2-70b"

[plan]
gpus = 8
global_batch = 8
micro_batch = 1
seq = 8192
tp = 4
sequence_parallel = true
zero = 1
precision = "fp8"
fp8_recipe = "delayed"
fp8_params = true
recompute = "none"
framework = "megatron"
optimizer_impl = "fused"
lora_rank = 16
lora_targets = ["q_proj", "k_proj", "v_proj", "o_proj"]

[measured]
step_time_s = {8 / 2.1553:.6f}
samples_per_s = 2.1553
'''

FINETUNE_NOTE = ("fine-tuning on SQuAD v1.1 packed to 4096 tokens (the table's note): priced as one causal "
                 "sequence of 4096 tokens (packed-sequence attention not modeled)")
# the launcher's own H100 FP8 script for the 8-GPU Llama-2 7B row (the table does not link its configs)
CONFIG_NOTES = {
    "nemo2407-llama2-7b-pretrain": (
        "config: github.com/NVIDIA/NeMo-Framework-Launcher examples/training/llama/h100/llama2_7b_fp8.sh "
        "(commit 7d6e2df9d9e495b0e803da4dbbb4d4f6fc86d643: 1 node, GBS 128, fp8 hybrid) over "
        "launcher_scripts/conf/training/llama/llama2_7b.yaml (commit 064e676963bd7632cb57f1abf575e1205dfcc390: "
        "TP 1, PP 1, MBS 1, no activation checkpointing, distributed_fused_adam with overlapped grad and param "
        "sync, fp8_amax_history_len 1024, max); grad_sync_dtype bf16 (ghsim reduces fp32 gradients)"),
}
LORA_NOTES = {  # the tables do not state the LoRA configuration: each library's default
    NEMO: ("LoRA rank 32 on the fused QKV projection: assumed, NeMo 1.x's default peft.lora_tuning "
           "(adapter_dim 32, target_modules attention_qkv)"),
    BRIDGE: ("LoRA rank 32 on linear_qkv, linear_proj, linear_fc1, linear_fc2: Megatron-Bridge's default "
             "(src/megatron/bridge/peft/lora.py at the commit above: target_modules, dim 32)"),
}
LORA_TARGETS = {NEMO: '["q_proj", "k_proj", "v_proj"]', BRIDGE: '"all"'}


def case_toml(name, source, table, model, gpus, gbs, mbs, seq, tp, pp, vp, zero, recipe, lora, tps) -> str:
    step = gbs * seq / (tps * gpus)
    notes = [n for n, on in ((FINETUNE_NOTE, "sft" in name or "lora" in name), (LORA_NOTES[source], lora > 0),
                             (CONFIG_NOTES.get(name, ""), name in CONFIG_NOTES)) if on]
    lora_lines = f'lora_rank = {lora}\nlora_targets = {LORA_TARGETS[source]}\n' if lora else ""
    precision = f'precision = "fp8"\nfp8_recipe = "{recipe}"' if recipe else 'precision = "bf16"'
    ep = f"ep = {EP[model]}\n" if model in EP else ""
    return f'''[case]
name = "{name}"
description = "{table}: {gpus} x H100 SXM, TP {tp} PP {pp} VP {vp}, GBS {gbs}, MBS {mbs}, seq {seq}, {f'FP8 ({recipe})' if recipe else 'BF16'}"
hardware = "h100-sxm"
published = true
source = "{source}, table '{table}': {tps} tokens/s/GPU"
method = "published throughput; step time = GBS x seq / (tokens/s/GPU x GPUs) = {gbs} x {seq} / ({tps} x {gpus}){'; ' + '; '.join(notes) if notes else ''}"

[model]
name = "{model}"

[plan]
gpus = {gpus}
global_batch = {gbs}
micro_batch = {mbs}
seq = {seq}
tp = {tp}
pp = {pp}
pp_interleave = {vp}
sequence_parallel = {'true' if tp > 1 else 'false'}
{ep}zero = {zero}
{precision}
recompute = "none"
framework = "megatron"
optimizer_impl = "fused"
{lora_lines}
[measured]
step_time_s = {step:.6f}
tokens_per_s_per_gpu = {tps}
'''


def main() -> None:
    write_cases(Path(__file__).parent,
                {**{row[0]: case_toml(*row) for row in ROWS}, "mlperf40-llama2-70b-lora-1node": MLPERF_CASE})


if __name__ == "__main__":
    main()
