"""FSDP2 CPUOffloadPolicy's host step, piece by piece, on CPU DTensors (issue 14 microbenchmark).

    python3 validation/harness/libraries/dtensor_step.py OUT.json

After backward, FSDP2 with CPUOffloadPolicy leaves every sharded parameter and its gradient as
a CPU DTensor (one rank: a gloo group of size 1, Shard(0)). The training loop then runs
clip_grad_norm_ (torch._foreach_norm over the gradients, then torch._foreach_mul_ by the clip
coefficient) and torch.optim.AdamW() with default flags, which on CPU is the single-tensor
for-loop. This times each of the three passes, on DTensors and on the same tensors as plain
tensors, for lists of uniform tensors from 2048 elements (a norm weight) to 256M (an
embedding), so that each pass is known per tensor size. The Llama-3.2-1B and -3B-shape
tensor lists (DTensors) are timed last, as a check of a per-size model, not for calibration.
fp32, torch's default threads; median of 3 after 1 warm-up.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

from dtensor_adam import one_rank_cpu_mesh  # this folder is the script's sys.path[0]

UNIFORM = [(2048, 256), (1 << 20, 64), (4 << 20, 32), (16 << 20, 16), (64 << 20, 4), (256 << 20, 1)]


def llama(hidden, inter, layers, heads, kv_heads, vocab):
    """A HF Llama's parameter sizes in model.parameters() order (tied embeddings)."""
    hd = hidden // heads
    per_layer = [hidden * hidden, hidden * kv_heads * hd, hidden * kv_heads * hd, hidden * hidden,
                 hidden * inter, hidden * inter, inter * hidden, hidden, hidden]
    return [vocab * hidden] + per_layer * layers + [hidden]


LISTS = {"llama-3.2-1b-shape": llama(2048, 8192, 16, 32, 8, 128256),
         "llama-3.2-3b-shape": llama(3072, 8192, 28, 24, 8, 128256)}


def median_time(fn, repeats=3) -> float:
    fn()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def measure(sizes, kind, mesh):
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor

    def make(n, v):
        t = torch.full((n,), v)
        return distribute_tensor(t, mesh, [Shard(0)]) if kind == "dtensor" else t

    params = [torch.nn.Parameter(make(n, 0.01)) for n in sizes]
    for p in params:
        p.grad = make(p.numel(), 1e-3)
    grads = [p.grad for p in params]
    opt = torch.optim.AdamW(params, lr=1e-5)
    norm_s = median_time(lambda: torch.nn.utils.get_total_norm(grads, 2.0))
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    # the clip coefficient < 1, as when clipping bites: the in-place scale always runs anyway
    mul_s = median_time(lambda: torch.nn.utils.clip_grads_with_norm_(params, 1e-6, total))
    adam_s = median_time(opt.step)
    row = {"kind": kind, "tensors": len(sizes), "params": sum(sizes), "norm_s": norm_s, "clip_mul_s": mul_s,
           "adam_s": adam_s, "threads": torch.get_num_threads()}
    del opt, params, grads
    return row


def guarded(head, sizes, kind, mesh) -> dict:
    """One row; a failure is recorded, not fatal (one device call measures everything)."""
    try:
        row = {**head, **measure(sizes, kind, mesh)}
    except Exception as e:  # noqa: BLE001 - recorded in the results
        row = {**head, "kind": kind, "error": repr(e)}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    import torch
    import torch.distributed as dist

    mesh = one_rank_cpu_mesh(29712)
    rows = []
    for numel, count in UNIFORM:
        for kind in ("plain", "dtensor"):
            rows.append(guarded({"elements_each": numel}, [numel] * count, kind, mesh))
    for name, sizes in LISTS.items():
        rows.append(guarded({"list": name}, sizes, "dtensor", mesh))
    with open(sys.argv[1], "w") as f:
        json.dump({"method": __doc__, "torch": torch.__version__, "cpus": os.cpu_count(), "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
