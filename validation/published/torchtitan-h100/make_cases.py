"""Write torchtitan's published Llama 3.1 8B FSDP2 rows (H100) as `ghsim validate` cases.

Source: github.com/pytorch/torchtitan commit 820504e20d1149fbf0b98c567af24c4b0433b22d,
benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3 (torch 1963fc8, torchao eab345c, torchtitan
9dec370, Dec 2024; Grand Teton hosts: 8 x H100 96 GB HBM2e 2.4 TB/s per host at the default 500 W power
limit, 400 Gb/s RDMA per GPU; TPS/GPU read at step 90). Model and run settings: torchtitan 9dec370
train_configs/llama3_8b.toml (seq_len 8192, AdamW, activation_checkpoint selective 'op').

Only the rows ghsim can state are written: "FSDP" (eager, bf16). The "+ torch.compile" and
"+ torch.compile + Float8" rows need --compile and torchao's float8 recipe (issue 15, another branch);
README.md lists them. Step time = global batch x 8192 / (TPS/GPU x GPUs). Memory (GiB, torchtitan's
max reserved) is not allocated memory: not compared.

Run from the repository root: python validation/published/torchtitan-h100/make_cases.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from write_cases import write_cases  # noqa: E402

SOURCE = ("github.com/pytorch/torchtitan commit 820504e20d1149fbf0b98c567af24c4b0433b22d "
          "benchmarks/llama3_h100_202412_torchtitan.md")
# (table, GPUs, global batch, TPS/GPU of the FSDP row)
ROWS = [("Table 1", 8, 16, 5762), ("Table 3", 128, 256, 5605)]


def case_toml(table: str, gpus: int, gbs: int, tps: int) -> str:
    return f'''[case]
name = "torchtitan-llama31-8b-fsdp-{gpus}gpu"
description = "torchtitan (Dec 2024) {table}: Llama 3.1 8B, FSDP2 over {gpus} H100 96GB (500 W), local batch 2, seq 8192, bf16, selective activation checkpointing, eager"
hardware = "h100-sxm"
published = true
source = "{SOURCE}, {table}, row FSDP: {tps} TPS/GPU"
method = "published throughput at step 90; step time = {gbs} x 8192 / ({tps} x {gpus}). torchtitan's selective AC is its op-level policy (saves matmul and attention outputs except every second matmul, recomputes the rest), priced as ghsim's selective recompute (attention core only): it recomputes less than torchtitan did. The 500 W power limit (lower sustained clocks than the profile's 700 W part) is not modeled"

[model]
name = "llama-3.1-8b"

[plan]
gpus = {gpus}
global_batch = {gbs}
micro_batch = 2
seq = 8192
zero = 3
precision = "bf16"
recompute = "selective"
framework = "fsdp-mixed"
optimizer_impl = "foreach"

[hardware_overrides]
"memory.hbm.capacity_gb" = {{ value = 96, source = "{SOURCE}, Hardware: 96GB HBM2e per H100" }}
"memory.hbm.bandwidth_gbps" = {{ value = 2400, source = "{SOURCE}, Hardware: 2.4 TB/sec peak memory bandwidth" }}

[measured]
step_time_s = {gbs * 8192 / (tps * gpus):.6f}
tokens_per_s_per_gpu = {tps}
'''


def main() -> None:
    write_cases(Path(__file__).parent, {f"torchtitan-llama31-8b-fsdp-{row[1]}gpu": case_toml(*row) for row in ROWS})


if __name__ == "__main__":
    main()
