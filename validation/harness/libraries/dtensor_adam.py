"""torch.optim.AdamW on CPU DTensors, as FSDP2's CPUOffloadPolicy steps it (issue 14 microbenchmark).

    python3 validation/harness/libraries/dtensor_adam.py OUT.json

FSDP2 keeps each offloaded parameter as a DTensor sharded over the mesh (one rank here: a
gloo process group of size 1, Shard(0)), and torch.optim.AdamW() with default flags steps
them with the single-tensor for-loop. The same parameters as plain tensors are the
comparison. Parameter count is held near 256M while the tensor count varies, so the
difference (DTensor - plain) / tensors is the per-tensor cost of the DTensor dispatch.
Median of 3 steps after 1 warm-up, fp32, torch's default threads.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

SHAPES = [(16, 16 << 20), (64, 4 << 20), (256, 1 << 20), (1024, 256 << 10)]  # (tensors, elements each)


def timed(opt, params) -> float:
    for p in params:
        p.grad = p.detach().clone().mul_(1e-3)
    runs = []
    for i in range(4):
        t0 = time.perf_counter()
        opt.step()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs[1:])


def one_rank_cpu_mesh(port: int):
    """A one-rank gloo process group and its CPU device mesh: what FSDP2's offloaded DTensors live on
    (shared with dtensor_step.py, which imports it from this folder)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    return init_device_mesh("cpu", (1,))


def main() -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = one_rank_cpu_mesh(29711)
    rows = []
    for n, numel in SHAPES:
        for kind in ("plain", "dtensor"):
            torch.manual_seed(0)
            base = [torch.randn(numel) for _ in range(n)]
            if kind == "dtensor":
                params = [torch.nn.Parameter(distribute_tensor(t, mesh, [Shard(0)])) for t in base]
            else:
                params = [torch.nn.Parameter(t) for t in base]
            opt = torch.optim.AdamW(params, lr=1e-5)
            s = timed(opt, params)
            rows.append({"kind": kind, "tensors": n, "elements_each": numel, "params": n * numel, "step_s": s,
                         "params_per_s": n * numel / s, "threads": torch.get_num_threads()})
            print(json.dumps(rows[-1]), flush=True)
            del opt, params, base
    with open(sys.argv[1], "w") as f:
        json.dump({"method": __doc__, "torch": torch.__version__, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
