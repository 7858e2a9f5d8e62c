"""Write torchtitan's published Llama 3.1 8B FSDP2 rows (H100) as `ghsim validate` cases.

Source: github.com/pytorch/torchtitan commit 820504e20d1149fbf0b98c567af24c4b0433b22d,
benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3 (torch 1963fc8, torchao eab345c, torchtitan
9dec370, Dec 2024; Grand Teton hosts: 8 x H100 96 GB HBM2e 2.4 TB/s per host at the default 500 W power
limit, 400 Gb/s RDMA per GPU; TPS/GPU read at step 90). Model and run settings: torchtitan 9dec370
train_configs/llama3_8b.toml (seq_len 8192, AdamW, activation_checkpoint selective 'op').

Rows: "FSDP" (eager, bf16), "FSDP + torch.compile" (--compile --modeling torchtitan: torchtitan's own Llama
calls SDPA with is_causal, so no Hugging Face boolean mask under compile) and "FSDP + torch.compile + Float8"
(torchao's tensorwise recipe; its FSDP2 float8 all-gather is not modeled: ghsim gathers the bf16 working
weights). Step time = global batch x 8192 / (TPS/GPU x GPUs). Memory (GiB, torchtitan's max reserved) is not
allocated memory: not compared.

Run from the repository root: python validation/published/torchtitan-h100/make_cases.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from write_cases import write_cases  # noqa: E402

SOURCE = ("github.com/pytorch/torchtitan commit 820504e20d1149fbf0b98c567af24c4b0433b22d "
          "benchmarks/llama3_h100_202412_torchtitan.md")
# (table, GPUs, global batch, TPS/GPU of the FSDP, FSDP + torch.compile and FSDP + torch.compile + Float8 rows)
ROWS = [("Table 1", 8, 16, (5762, 6667, 8532)), ("Table 3", 128, 256, (5605, 6514, 8380))]
# (case-name suffix, the published row, what it adds to the plan, what it adds to the description)
VARIANTS = [
    ("", "FSDP", "", "eager"),
    ("-compile", "FSDP + torch.compile", 'compile = true\nmodeling = "torchtitan"\n', "torch.compile"),
    ("-compile-float8", "FSDP + torch.compile + Float8",
     'compile = true\nmodeling = "torchtitan"\nfp8_recipe = "tensorwise"\n', "torch.compile, torchao float8 tensorwise"),
]


def case_toml(table: str, gpus: int, gbs: int, tps: int, suffix: str, row: str, plan_extra: str, what: str) -> str:
    precision = "fp8" if "fp8_recipe" in plan_extra else "bf16"
    float8 = (" torchao's FSDP2 float8 all-gather (enable_fsdp_float8_all_gather) is not modeled: ghsim gathers"
              " the bf16 working weights." if precision == "fp8" else "")
    return f'''[case]
name = "torchtitan-llama31-8b-fsdp{suffix}-{gpus}gpu"
description = "torchtitan (Dec 2024) {table}: Llama 3.1 8B, FSDP2 over {gpus} H100 96GB (500 W), local batch 2, seq 8192, bf16, selective activation checkpointing, {what}"
hardware = "h100-sxm"
published = true
source = "{SOURCE}, {table}, row {row}: {tps} TPS/GPU"
method = "published throughput at step 90; step time = {gbs} x 8192 / ({tps} x {gpus}). torchtitan's selective AC is its op-level policy (saves matmul and attention outputs except every second matmul, recomputes the rest), priced as ghsim's selective recompute (attention core only): it recomputes less than torchtitan did. The 500 W power limit (lower sustained clocks than the profile's 700 W part) is not modeled.{float8}"

[model]
name = "llama-3.1-8b"

[plan]
gpus = {gpus}
global_batch = {gbs}
micro_batch = 2
seq = 8192
zero = 3
precision = "{precision}"
recompute = "selective"
framework = "fsdp-mixed"
optimizer_impl = "foreach"
{plan_extra}
[hardware_overrides]
"memory.hbm.capacity_gb" = {{ value = 96, source = "{SOURCE}, Hardware: 96GB HBM2e per H100" }}
"memory.hbm.bandwidth_gbps" = {{ value = 2400, source = "{SOURCE}, Hardware: 2.4 TB/sec peak memory bandwidth" }}

[measured]
step_time_s = {gbs * 8192 / (tps * gpus):.6f}
tokens_per_s_per_gpu = {tps}
'''


def main() -> None:
    write_cases(Path(__file__).parent, {
        f"torchtitan-llama31-8b-fsdp{suffix}-{gpus}gpu": case_toml(table, gpus, gbs, tps, suffix, row, extra, what)
        for table, gpus, gbs, row_tps in ROWS
        for (suffix, row, extra, what), tps in zip(VARIANTS, row_tps)})


if __name__ == "__main__":
    main()
