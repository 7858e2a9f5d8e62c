#!/usr/bin/env bash
# Story 3: "what would my existing DeepSpeed config do on GH200?"
# Simulates the config as is, then searches for a better plan on the same GPUs and batch.
set -euo pipefail
cd "$(dirname "$0")"
ghsim simulate --model llama-2-13b --hardware gh200-96gb --gpus 4 --deepspeed ds_config_zero2_offload.json
ghsim plan --model llama-2-13b --hardware gh200-96gb --gpus 4 --deepspeed ds_config_zero2_offload.json --top 3
