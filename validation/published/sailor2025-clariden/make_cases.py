"""Write the Sailor (SOSP'25) GH200 validation cases: OPT-350M on 1-32 quad-GH200 nodes (CSCS Clariden).

Source: github.com/eth-easl/sailor at commit cf2c8e3cc53ce178fe58a4003f46b4b6b848fc33,
sailor/Planner/simulations/validation/clariden/OPT-350/N*/plan_config_*.json ("real" = measured
iteration time in s, "max_mem" = measured GPU memory in bytes), the paper's Fig. 5b data
(ae_scripts/validation/run_gh200_time.sh, run_gh200_mem.sh read these files). How they were measured:
ae_scripts/clariden_scripts/run_opt.slurm (Megatron-DeepSpeed pretrain_gpt.py: 24 layers, hidden 1024,
16 heads, seq 2048, no --fp16/--bf16 flag, so fp32 tensors, with TF32 GEMMs: the image, nvcr.io/nvidia/pytorch:24.10-py3
(Dockerfile line 1), sets TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 and nothing in the repository turns TF32 off; DeepSpeed AdamW, zero_optimization {} = stage 0;
torchrun --nproc_per_node 4 = TP 4 inside each quad node) and process_results.py ("real": mean of
the 'Iteration' times in sailor_log_worker_rank_0 after the first 3; "max_mem": the largest, over
ranks, last nvidia-smi memory.used reading of the run, deepspeed/pipe_engine.py get_total_used_mem).

Run from the repository root: python validation/published/sailor2025-clariden/make_cases.py
"""

from __future__ import annotations

from pathlib import Path

REPO = "eth-easl/sailor"
COMMIT = "cf2c8e3cc53ce178fe58a4003f46b4b6b848fc33"
WHERE = "sailor/Planner/simulations/validation/clariden/OPT-350"

# Decoder blocks per pipeline stage as the runs split them. run_opt.slurm passes no --layers-per-stage, so
# the fork's OPTModelPipe (third_party/Megatron-DeepSpeed/megatron/model/opt_model.py, lines 627-658: specs
# _to_float16, OPTEmbeddingPipe, transpose, 24 blocks, OPTLMHeadPipe; no fp32 cast spec without --fp16/--bf16)
# hands its 28 specs to DeepSpeed's PipelineModule with partition_method='uniform' (line 717), which the
# repository's deepspeed/module.py (lines 410-412, copied over DeepSpeed's by the Dockerfile, line 49)
# cuts with partition_uniform (deepspeed/utils.py, lines 562-580) into equal counts of specs: 14+14 at
# PP 2 (embedding + blocks 0-10, then blocks 11-23 + head) and 7+7+7+7 at PP 4 (embedding + blocks 0-3,
# 4-10, 11-17, 18-23 + head). The plan files' layers_per_stage (26 'layers': embedding, 24 blocks,
# head) say the same split: 12+14 and 5+7+7+7.
PP_LAYERS = {1: None, 2: [11, 13], 4: [4, 7, 7, 6]}

# (file under WHERE, nodes, pp, dp, micro-batch, global batch, real s, max_mem bytes): copied from the files
ROWS = [
    ("N1/plan_config_N1_D1_M4_G1.json", 1, 1, 1, 1, 1, 0.07359, 9551478784),
    ("N1/plan_config_N1_D1_M4_G32.json", 1, 1, 1, 1, 32, 2.28123, 9805234176),
    ("N2/plan_config_N2_D1.json", 2, 2, 1, 8, 32, 0.65705, 26942111744),
    ("N2/plan_config_N2_D2.json", 2, 1, 2, 2, 32, 0.8048, 12540968960),
    ("N4/plan_config_N4_D1.json", 4, 4, 1, 1, 64, 1.60196, 7358906368),
    ("N4/plan_config_N4_D2.json", 4, 2, 2, 1, 64, 1.44523, 7976517632),
    ("N4/plan_config_N4_D4.json", 4, 1, 4, 4, 128, 1.23516, 19244515328),
    ("N8/plan_config_N8_D2.json", 8, 4, 2, 8, 512, 2.69795, 25248661504),
    ("N8/plan_config_N8_D4.json", 8, 2, 4, 8, 512, 2.2988, 26850885632),
    ("N16/plan_config_N16_D4.json", 16, 4, 4, 8, 1024, 2.72578, 25140658176),
    ("N16/plan_config_N16_D8.json", 16, 2, 8, 8, 1024, 2.31116, 26941063168),
    ("N16/plan_config_N16_D16.json", 16, 1, 16, 8, 1024, 1.92557, 32560381952),
    ("N32/plan_config_N32_D8.json", 32, 4, 8, 8, 1024, 1.47485, 25218252800),
    ("N32/plan_config_N32_D16.json", 32, 2, 16, 8, 1024, 1.22476, 26960986112),
    ("N32/plan_config_N32_D32.json", 32, 1, 32, 8, 1024, 1.02594, 32996589568),
]

MODEL = '''[model]
name = "opt-350m-megatron-gpt"
source = "ae_scripts/clariden_scripts/run_opt.slurm GPT_ARGS (24 layers, hidden 1024, 16 heads, seq 2048, --model-name OPT) and third_party/Megatron-DeepSpeed/megatron/model/opt_model.py (pre-LayerNorm blocks, fc1/fc2 4h MLP with ReLU, no dropout in the blocks (commented out), softmax attention between batched GEMMs, learned positions, separate untied lm_head); GPT-2 tokenizer (gpt2-vocab.json, 50257) padded by Megatron to a multiple of 128 x TP 4 = 50688"
hidden_size = 1024
intermediate_size = 4096
num_layers = 24
num_attention_heads = 16
num_kv_heads = 16
head_dim = 64
vocab_size = 50688
tie_embeddings = false
max_seq_len = 2048
mlp = "gelu"  # the code's ReLU: ghsim's 2-matrix MLP with one elementwise activation (it has no relu kind)
norm = "layernorm"
position = "learned"
dropout = 0.0
'''


def case_toml(path: str, nodes: int, pp: int, dp: int, mb: int, gb: int, real: float, mem: int) -> str:
    gpus = 4 * nodes
    return f'''[case]
name = "{case_name(nodes, pp, dp, mb, gb)}"
description = "Sailor (SOSP'25) Fig. 5b: OPT-350M fp32 with TF32 GEMMs, Megatron-DeepSpeed, TP 4 in each quad-GH200 node x PP {pp} x DP {dp} on {nodes} node(s), micro-batch {mb}, global batch {gb}"
hardware = "gh200-96gb-quad"
published = true
source = "github.com/{REPO} commit {COMMIT}, {WHERE}/{path} (real, max_mem)"
system = "CSCS Clariden (Alps): quad GH200 nodes, Slingshot-11, one NIC per GH200"
method = "Megatron-DeepSpeed pretrain_gpt.py via DeepSpeed's PipelineEngine (also for PP 1), 10 iterations; step time = mean of the iteration times after the first 3 (process_results.py); memory = nvidia-smi memory.used (device total: CUDA context, NCCL buffers and the caching allocator's reserve included), largest over ranks"
peak_memory_kind = "nvidia-smi"  # memory.used, the device total; compared with the predicted device total (ghsim/cost/device_memory.py)

{MODEL}
[plan]
gpus = {gpus}
gpus_per_node = 4
tp = 4
pp = {pp}
{pp_layers(pp)}precision = "tf32"  # fp32 tensors, TF32 GEMMs (NGC PyTorch 24.10 sets TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1)
recompute = "none"
micro_batch = {mb}
global_batch = {gb}
seq = 2048
zero = 0
optimizer_impl = "fused"
framework = "megatron-legacy"

[measured]
step_time_s = {real}
peak_allocated_bytes = {mem}
'''


def pp_layers(pp: int) -> str:
    """The plan's split line (make_cases.PP_LAYERS says where it comes from); none at PP 1."""
    split = PP_LAYERS[pp]
    if split is None:
        return ""
    return (f"pp_layers = {split}  # DeepSpeed partition_method='uniform' over OPTModelPipe's 28 specs: "
            "embedding on the first stage, LM head on the last (make_cases.py PP_LAYERS)\n")


def case_name(nodes: int, pp: int, dp: int, mb: int, gb: int) -> str:
    return f"sailor-gh200x{4 * nodes}-opt350m-tp4-pp{pp}-dp{dp}-mb{mb}-gb{gb}"


def main() -> None:
    root = Path(__file__).parent / "cases"
    for path, nodes, pp, dp, mb, gb, real, mem in ROWS:
        assert gb % (mb * dp) == 0, path
        folder = root / case_name(nodes, pp, dp, mb, gb)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "case.toml").write_text(case_toml(path, nodes, pp, dp, mb, gb, real, mem))


if __name__ == "__main__":
    main()
