"""Save what ghsim answers to a fixed set of questions, and compare two saved answers.

A refactor must not change behaviour: save a snapshot before it, one after, and
compare. Every question goes through the CLI (`ghsim.cli.main`, in process), so
the snapshot does not depend on the package's internal layout.

    python benchmarks/behaviour_snapshot.py save before.json
    python benchmarks/behaviour_snapshot.py save after.json
    python benchmarks/behaviour_snapshot.py compare before.json after.json

The questions: `ghsim validate validation --json`, simulate calls covering one GPU
(precisions, recompute, LoRA, data loader), TP/PP/ZeRO-3, offload of each schedule,
unified memory, MoE and multi-node layouts, and the exhaustive plan of the README story.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]

SIMULATE = {
    "1gpu-bf16-full": "--model llama-2-7b --hardware gh200-96gb --precision bf16 --recompute full --seq 4096",
    "1gpu-fp8-sel-mb2": "--model llama-3-8b --hardware h100-sxm --precision fp8 --recompute selective --micro-batch 2",
    "1gpu-fp32": "--model gpt3-1.7b --hardware h100-sxm --precision fp32 --seq 2048",
    "1gpu-lora": "--model llama-2-7b --hardware h100-pcie --lora-rank 16 --seq 2048",
    "1gpu-accum": "--model llama-3-8b --hardware h200-sxm --micro-batch 1 --global-batch 4 --recompute full",
    "1gpu-graphs": "--model gpt3-1.7b --hardware h100-sxm --cuda-graphs --micro-batch 4 --seq 2048",
    "1gpu-loader": "--model gpt3-1.7b --hardware h100-sxm --batch-prep-ms 40 --dataloader-workers 2 --seq 2048",
    "1gpu-megatron": "--model llama-2-7b --hardware h100-sxm --framework megatron --recompute full",
    "1gpu-um": "--model llama-2-13b --hardware gh200-96gb --unified-memory --recompute full",
    "1gpu-um-pcie": "--model llama-2-7b --hardware h100-pcie --unified-memory --recompute none --seq 2048",
    "1gpu-zero2": "--model llama-2-7b --hardware gh200-96gb --zero 2 --recompute full",
    "off-sync-all": ("--model llama-2-7b --hardware h100-pcie --offload optimizer,grads,params,activations "
                     "--offload-schedule sync --recompute full"),
    "off-opt-sync": "--model llama-2-7b --hardware h100-pcie --offload optimizer --offload-schedule sync",
    "off-opt-overlapped": ("--model llama-2-13b --hardware gh200-96gb --framework deepspeed --zero 2 "
                           "--offload optimizer,grads --offload-schedule overlapped --recompute full"),
    "off-superoffload": ("--model llama-2-13b --hardware gh200-96gb --framework deepspeed --zero 3 "
                         "--offload optimizer,grads --offload-schedule superoffload --recompute full"),
    "off-ratio": ("--model llama-2-7b --hardware gh200-96gb --framework deepspeed --zero 3 --offload optimizer,grads "
                  "--offload-schedule superoffload --offload-ratio 0.8"),
    "off-act": "--model llama-3-8b --hardware h100-sxm --offload activations --micro-batch 2",
    "off-pageable": "--model llama-2-7b --hardware h100-pcie --offload optimizer --offload-pageable",
    "tp2": "--model llama-2-13b --hardware h100-sxm --gpus 2 --tp 2",
    "tp4-sp": "--model llama-2-70b --hardware h100-sxm --gpus 8 --tp 4 --pp 2 --sequence-parallel --global-batch 16",
    "pp4-interleave": ("--model llama-2-70b --hardware h200-sxm --gpus 8 --pp 4 --tp 2 --pp-interleave 2 "
                       "--global-batch 16 --recompute full"),
    "zero3-dp4": "--model llama-2-13b --hardware gh200-96gb-quad --gpus 4 --zero 3 --framework deepspeed",
    "zero3-offload": ("--model llama-2-13b --hardware gh200-96gb-quad --gpus 4 --zero 3 --framework deepspeed "
                      "--offload optimizer,grads,params --recompute full"),
    "zero1-ddp": "--model llama-3-8b --hardware h100-sxm --gpus 8 --zero 1 --framework deepspeed --global-batch 32",
    "ddp-torch": "--model gpt3-1.7b --hardware h100-sxm --gpus 4 --seq 2048",
    "moe-ep": "--model mixtral-8x7b --hardware h100-sxm --gpus 8 --ep 8 --zero 1 --framework deepspeed --recompute full",
    "moe-1gpu-gptoss": "--model gpt-oss-20b --hardware h200-sxm --recompute full",
    "multinode": ("--model llama-3-70b --hardware h100-sxm --gpus 64 --tp 8 --pp 4 --global-batch 128 "
                  "--framework megatron --recompute selective"),
    "multinode-gh200": "--model llama-2-13b --hardware gh200-96gb --gpus 8 --zero 3 --framework deepspeed",
    "deepspeed-config": "--model llama-2-7b --hardware h100-pcie --deepspeed examples/ds_config_zero2_offload.json",
    "fsdp-mixed-4": "--model llama-2-7b --hardware h100-sxm --gpus 4 --zero 3 --framework fsdp-mixed",
    "too-big": "--model llama-2-70b --hardware gh200-96gb-quad --gpus 4 --zero 3 --framework deepspeed --offload optimizer,grads,params",
    "pp-offload-act": ("--model llama-2-13b --hardware h100-sxm --gpus 4 --pp 2 --offload activations,optimizer "
                       "--framework deepspeed --global-batch 8"),
}

PLAN = "--model llama-70b --gpus 4 --time-limit 0 --jobs 1"


def _cli(args: list[str]) -> tuple[int, str]:
    from ghsim.cli import main

    result = CliRunner().invoke(main, args, catch_exceptions=False)
    return result.exit_code, result.stdout if result.exit_code == 0 else result.output  # stderr notes are not the answer


def _json_or_text(code: int, out: str) -> dict:
    try:
        return {"exit": code, "json": json.loads(out)}
    except json.JSONDecodeError:
        return {"exit": code, "text": out.strip().splitlines()[-3:]}


def save(path: str) -> None:
    snap: dict = {"simulate": {}, "seconds": {}}
    for name, flags in SIMULATE.items():
        t0 = time.perf_counter()
        snap["simulate"][name] = _json_or_text(*_cli(["simulate", *flags.split(), "--json"]))
        snap["seconds"][name] = time.perf_counter() - t0
    t0 = time.perf_counter()
    snap["validate"] = _json_or_text(*_cli(["validate", str(ROOT / "validation"), "--json"]))
    snap["seconds"]["validate"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan = _json_or_text(*_cli(["plan", *PLAN.split(), "--json"]))
    snap["seconds"]["plan"] = time.perf_counter() - t0
    if "json" in plan:  # timings of the search itself are not behaviour
        plan["json"].pop("seconds", None)
        plan["json"].pop("elapsed_s", None)
    snap["plan"] = plan
    Path(path).write_text(json.dumps(snap, indent=1, sort_keys=True, default=str))
    print(f"saved {path}: {len(SIMULATE)} simulate calls, validate, plan; "
          f"{sum(snap['seconds'].values()):.1f} s")


def _diff(a, b, where: str, out: list[str], rel: float) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: {'only after' if k not in a else 'only before'}")
            else:
                _diff(a[k], b[k], f"{where}.{k}", out, rel)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{where}: length {len(a)} -> {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{where}[{i}]", out, rel)
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if not (a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= rel * max(abs(a), abs(b)))):
            out.append(f"{where}: {a!r} -> {b!r}")
    elif a != b:
        out.append(f"{where}: {a!r} -> {b!r}")


def compare(before: str, after: str, rel: float = 1e-9) -> int:
    a, b = (json.loads(Path(p).read_text()) for p in (before, after))
    for part in ("seconds",):
        a.pop(part, None), b.pop(part, None)
    out: list[str] = []
    _diff(a, b, "", out, rel)
    for line in out:
        print(line)
    print(f"{len(out)} difference(s) beyond a relative {rel:g}")
    return 1 if out else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "save":
        save(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 1e-9))
    else:
        sys.exit(__doc__)
