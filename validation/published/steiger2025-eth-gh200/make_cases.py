"""Write the ETH quad-GH200 DeepSpeed cases (Steiger, Zuidema, Dionysiou 2025) as `ghsim validate` cases.

Sources: the blog's Table 2 and text (https://rahulsteiger.github.io/notes/2025/lsaie-project/; peak
VRAM per ZeRO stage, and the offload rows' peaks) and the authors' logs and configs in
github.com/ImaGoodFella/lsaie_project at commit 0202e4161e63ad9c6f8cfd063c1101681dc17c57
(logs/stage_*_latest.out: "Tokens per second" of all 4 GPUs, averaged here over the logged steps >= 6
as the blog does; configs/deepspeed/stage_*.json; src/train.py and src/model.py for the model).
Step time = 4 GPUs x 2048 tokens / tokens per second. ../steiger2025-eth-gh200-deepspeed.toml has the
published table itself; this folder makes its rows runnable cases.

The model is torchtitan's Llama code (src/model.py: repeat_kv copies k and v to every head before SDPA),
hence `modeling = "torchtitan"`; the runs' DeepSpeed is the pip release of the image build (the logs of
2025-12-17 print DeepSpeed 0.18 behaviour: SuperOffload's whole-sub-group reduction), `deepspeed_version = "0.18"`.

Run from the repository root: python validation/published/steiger2025-eth-gh200/make_cases.py
"""

from __future__ import annotations

from pathlib import Path

COMMIT = "0202e4161e63ad9c6f8cfd063c1101681dc17c57"
TOKENS_PER_STEP = 4 * 2048

# configs/deepspeed/stage_zerooffload.json / stage_superoffload.json: reduce_bucket_size and sub_group_size 4e8
# (stage_1/2/3.json leave both at DeepSpeed's defaults); SuperOffload's cpuadam_cores_perc 0.90
BUCKETS = "reduce_bucket_size = 4e8\nsub_group_size = 4e8\n"
ZERO_OFFLOAD = 'offload = ["optimizer"]\noffload_schedule = "overlapped"\n' + BUCKETS
SUPER_OFFLOAD = ('offload = ["optimizer"]\noffload_schedule = "superoffload"\noffload_ratio = 0.8\n'
                 'cpu_cores_share = 0.9\n' + BUCKETS)
CLIP = "grad_clip = true\n"  # the config's "gradient_clipping": 1.0 (0.0 in the plain offload configs)

# (name, log, zero, plan lines, mean tokens/s over steps >= 6 from the log, peak VRAM GB, where the peak is from)
# The first five peaks are the blog's; the blog has no row for the two _grad_clip runs, so theirs is the
# largest "Max Mem Allocated" their log prints (over the 4 ranks; for the rows above the log's largest is
# within 0.4 GB of the blog's except ZeRO-1/2, 61.5 vs 58.8). stage_3_no_grad_clip's config at this commit
# still says gradient_clipping 1.0 although its log is 4.5% faster than stage_3's: not a case (what ran is unclear).
BLOG = "blog https://rahulsteiger.github.io/notes/2025/lsaie-project/ (Table 2 / VRAM text, torch max allocated, one rank)"
ROWS = [
    ("zero1", "stage_1", 1, CLIP, 19737, 58.8, BLOG),
    ("zero2", "stage_2", 2, CLIP, 19600, 58.6, BLOG),
    ("zero3", "stage_3", 3, CLIP, 14569, 52.6, BLOG),
    ("zero3-zerooffload", "stage_zerooffload", 3, ZERO_OFFLOAD, 8289, 24.2, BLOG),
    ("zero3-superoffload-r0.8", "stage_superoffload", 3, SUPER_OFFLOAD, 11757, 30.5, BLOG),
    ("zero3-zerooffload-clip", "stage_zerooffload_grad_clip", 3, ZERO_OFFLOAD + CLIP, 8329, 24.21,
     "the log's largest Max Mem Allocated over the 4 ranks (torch max allocated)"),
    ("zero3-superoffload-r0.8-clip", "stage_superoffload_grad_clip", 3, SUPER_OFFLOAD + CLIP, 5651, 29.27,
     "the log's largest Max Mem Allocated over the 4 ranks (torch max allocated)"),
]

MODEL = '''[model]
name = "eth-llama3-shape-8b"
source = "ImaGoodFella/lsaie_project src/train.py TransformerModelArgs(dim 4096, n_layers 32, n_heads 32, n_kv_heads 8, ffn_dim_multiplier 1.3, multiple_of 1024 -> FFN 14336, rope_theta 500000) and src/model.py (RMSNorm, SwiGLU, SDPA causal attention, untied output); vocab = the Mistral-Nemo tokenizer's 131072 (log: tokenizer unsloth/Mistral-Nemo-Base-2407-bnb-4bit)"
hidden_size = 4096
intermediate_size = 14336
num_layers = 32
num_attention_heads = 32
num_kv_heads = 8
head_dim = 128
vocab_size = 131072
tie_embeddings = false
max_seq_len = 2048
'''


def case_toml(name: str, log: str, zero: int, plan_lines: str, tokens_per_s: float, peak_gb: float,
              peak_source: str) -> str:
    offload = "offload" in plan_lines
    clip = " with gradient clipping" if "grad_clip" in plan_lines else ""
    return f'''[case]
name = "eth-gh200x4-8b-{name}-mb1-s2048"
description = "Steiger et al. 2025 (ETH): Llama-3-8B shape, DeepSpeed bf16 ZeRO-{zero}{' + optimizer offload' if offload else ''}{clip}, one quad-GH200 node (CSCS Alps), micro-batch 1, seq 2048"
hardware = "gh200-96gb-quad"
published = true
source = "step: github.com/ImaGoodFella/lsaie_project commit {COMMIT} logs/{log}_latest.out ({tokens_per_s} tokens/s, 4 GPUs, mean over steps >= 6); config: configs/deepspeed/{log}.json; peak: {peak_source}"
method = "DeepSpeed engine forward/backward/step per step, tokens per second logged every 5 steps; PyTorch 2.6 (NGC 25.01), DeepSpeed 0.18, NCCL 2.25.1, NVLS off; each rank numactl-bound to its own Grace"

{MODEL}
[plan]
gpus = 4
gpus_per_node = 4
zero = {zero}
precision = "bf16"
recompute = "none"
micro_batch = 1
global_batch = 4
seq = 2048
{plan_lines}optimizer_impl = "fused"
framework = "deepspeed"
deepspeed_version = "0.18"
modeling = "torchtitan"

[measured]
step_time_s = {TOKENS_PER_STEP / tokens_per_s:.6f}
peak_allocated_bytes = {peak_gb * 1e9:.0f}
tokens_per_s = {tokens_per_s}
'''


def main() -> None:
    root = Path(__file__).parent / "cases"
    for row in ROWS:
        folder = root / f"eth-gh200x4-8b-{row[0]}-mb1-s2048"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "case.toml").write_text(case_toml(*row))


if __name__ == "__main__":
    main()
