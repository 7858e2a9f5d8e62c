"""ZeRO-3's host cost per module (issue 14 microbenchmark), on one GPU.

    python3 validation/harness/libraries/zero3_hooks.py OUT.json

A stack of N nn.Linear(W, W, bias=False) modules (bf16, W x W above DeepSpeed's
param_persistence_threshold of 1e5 so every weight is partitioned and fetched), batch of
T tokens so small that the GEMMs cost next to nothing: the step is the engine's host work.
The same model runs under ZeRO-2 (no per-module hooks) and ZeRO-3 (fetch/release hooks on
every module, forward and backward), with and without offload_param; forward, backward
and step are timed separately (torch.cuda.synchronize between them; median of 10 after 3
warm-ups). Per-module cost = (ZeRO-3 - ZeRO-2) / N for each phase. N is varied to check
the cost is per module, not per step.

Each configuration runs in its own process (deepspeed.initialize holds global state).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = [
    # (modules, width, stage, offload_param)
    (64, 1024, 2, False), (64, 1024, 3, False), (256, 1024, 2, False), (256, 1024, 3, False),
    (256, 1024, 3, True), (256, 2048, 3, False), (256, 2048, 2, False),
]
TOKENS = 8


def one(n: int, width: int, stage: int, offload_param: bool) -> dict:
    import deepspeed
    import torch

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 1000))
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(n)]).to(torch.bfloat16)
    zero = {"stage": stage}
    if offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": zero,
           "zero_force_ds_cpu_optimizer": False, "steps_per_print": 10 ** 9}
    # torch's AdamW as the client optimizer: no JIT build needed, and the step is not what is timed
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    x = torch.randn(TOKENS, width, device="cuda", dtype=torch.bfloat16)
    times = {"fwd": [], "bwd": [], "step": []}
    for i in range(13):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = engine(x).float().pow(2).mean()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        engine.backward(loss)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        if i >= 3:
            times["fwd"].append(t1 - t0)
            times["bwd"].append(t2 - t1)
            times["step"].append(t3 - t2)
    return {"modules": n, "width": width, "stage": stage, "offload_param": offload_param, "tokens": TOKENS,
            "deepspeed": deepspeed.__version__, "torch": torch.__version__,
            **{f"{k}_s": statistics.median(v) for k, v in times.items()}, "runs": times}


def main() -> None:
    if len(sys.argv) == 6:  # child: one configuration
        n, width, stage, off = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
        print("RESULT " + json.dumps(one(n, width, stage, off)), flush=True)
        return
    rows = []
    for n, width, stage, off in CONFIGS:
        p = subprocess.run([sys.executable, __file__, "child", str(n), str(width), str(stage), "1" if off else "0"],
                           capture_output=True, text=True, timeout=240)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        rows.append(json.loads(line[7:]) if line else {"modules": n, "width": width, "stage": stage,
                                                        "offload_param": off, "error": p.stderr[-800:]})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "runs"}), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump({"method": __doc__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
