"""How much a running NCCL collective slows compute on the same GPU, and the reverse.

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node 2 validation/harness/overlap_bench.py \
        --name h200-x2-overlap --budget 120

For each (buffer size, GEMM shape, collective), every rank times with CUDA events:
  - the GEMM loop alone on the default stream;
  - the collective loop alone on a side stream;
  - the GEMM loop while collectives run: the collectives are queued first on the side
    stream, enough of them to outlast the GEMMs, then the GEMM loop;
  - the collective loop while GEMMs run: the GEMMs queued first, enough to outlast it.
(`covered`: in both, the other loop started before and ended after the timed one.)
compute_slowdown = 1 - gemm_alone / gemm_with_comm is the fraction of its rate a GEMM
loses while a collective runs (what ghsim's engine calls a resource's slowdown, see
ghsim/sim/engine.py); comm_slowdown = 1 - comm_alone / comm_with_gemm the same for the
collective. Each figure is the median over ranks of the median of `reps` repetitions.

Writes validation/microbench/<name>.json:
  {"meta": {...}, "overlap": [{"gemm": [m, n, k], "dtype", "collective", "bytes",
   "gemm_alone_s", "gemm_with_comm_s", "compute_slowdown", "comm_alone_s",
   "comm_with_gemm_s", "comm_slowdown", "covered"}]}
"""
from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]

GEMMS = [(8192, 8192, 8192), (4096, 14336, 4096), (16384, 4096, 4096)]  # square; Llama-3-8B MLP up; tall
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter"]
SIZES = [256 << 20, 32 << 20]  # per-rank buffers: bus-bandwidth-bound, and a ZeRO-bucket-sized one


def timed(stream: torch.cuda.Stream, fn, n: int) -> tuple[torch.cuda.Event, torch.cuda.Event]:
    """Queue n calls of fn on `stream` between two events (not synchronized)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        a.record()
        for _ in range(n):
            fn()
        b.record()
    return a, b


def collective(name: str, nbytes: int, ws: int, dev: torch.device):
    elems = nbytes // 2
    x = torch.ones(elems, dtype=torch.bfloat16, device=dev)
    if name == "all_reduce":
        return lambda: dist.all_reduce(x)
    if name == "all_gather":
        out = torch.empty(elems * ws, dtype=torch.bfloat16, device=dev)
        return lambda: dist.all_gather_into_tensor(out, x)
    out = torch.empty(elems // ws, dtype=torch.bfloat16, device=dev)
    return lambda: dist.reduce_scatter_tensor(out, x)


def agree(n: int, dev: torch.device) -> int:
    """The largest of every rank's count: all ranks must issue the same number of collectives."""
    t = torch.tensor([n], device=dev, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def measure(shape, coll_name: str, nbytes: int, ws: int, dev: torch.device, reps: int) -> dict:
    m, n, k = shape
    a = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
    b = torch.randn(k, n, dtype=torch.bfloat16, device=dev)
    c = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    gemm = lambda: torch.matmul(a, b, out=c)  # noqa: E731
    comm = collective(coll_name, nbytes, ws, dev)
    compute, side = torch.cuda.current_stream(dev), torch.cuda.Stream(dev)
    for _ in range(3):  # warm-up: cuBLAS heuristics, NCCL channels
        gemm(), comm()
    torch.cuda.synchronize(dev)

    # loop lengths of ~50 ms each
    e0, e1 = timed(compute, gemm, 5)
    torch.cuda.synchronize(dev)
    n_gemm = max(5, int(0.05 / (e0.elapsed_time(e1) / 5e3)))
    dist.barrier()
    e0, e1 = timed(side, comm, 3)
    torch.cuda.synchronize(dev)
    n_comm_alone = agree(max(3, int(0.05 / (e0.elapsed_time(e1) / 3e3))), dev)

    rows = {"gemm_alone": [], "gemm_with": [], "comm_alone": [], "comm_with": [], "covered": []}
    for _ in range(reps):
        g0, g1 = timed(compute, gemm, n_gemm)
        torch.cuda.synchronize(dev)
        rows["gemm_alone"].append(g0.elapsed_time(g1) / 1e3 / n_gemm)
        dist.barrier()
        c0, c1 = timed(side, comm, n_comm_alone)
        torch.cuda.synchronize(dev)
        rows["comm_alone"].append(c0.elapsed_time(c1) / 1e3 / n_comm_alone)
        # both: enough collectives to outlast the GEMM loop even if comm runs 2x slower
        n_both = agree(max(4, int(2.5 * n_gemm * rows["gemm_alone"][-1] / rows["comm_alone"][-1]) + 2), dev)
        dist.barrier()
        c0, c1 = timed(side, comm, n_both)
        g0, g1 = timed(compute, gemm, n_gemm)
        torch.cuda.synchronize(dev)
        gemm_with = g0.elapsed_time(g1) / 1e3
        covered = c0.elapsed_time(g0) >= -0.05 and c0.elapsed_time(c1) >= c0.elapsed_time(g1)
        rows["gemm_with"].append(gemm_with / n_gemm)
        # the reverse: GEMMs queued first, enough to outlast the collectives, which are timed
        n_long = max(4, int(2.5 * n_comm_alone * rows["comm_alone"][-1] / rows["gemm_alone"][-1]) + 2)
        dist.barrier()
        g0, g1 = timed(compute, gemm, n_long)
        c0, c1 = timed(side, comm, n_comm_alone)
        torch.cuda.synchronize(dev)
        rows["comm_with"].append(c0.elapsed_time(c1) / 1e3 / n_comm_alone)
        covered = covered and g0.elapsed_time(c0) >= -0.05 and g0.elapsed_time(g1) >= g0.elapsed_time(c1)
        rows["covered"].append(bool(covered))
    med = {k: statistics.median(v) for k, v in rows.items() if k != "covered"}
    return {"gemm": [m, n, k], "dtype": "bf16", "collective": coll_name, "bytes": nbytes,
            "gemm_alone_s": med["gemm_alone"], "gemm_with_comm_s": med["gemm_with"],
            "compute_slowdown": 1 - med["gemm_alone"] / med["gemm_with"],
            "comm_alone_s": med["comm_alone"], "comm_with_gemm_s": med["comm_with"],
            "comm_slowdown": 1 - med["comm_alone"] / med["comm_with"],
            "covered": all(rows["covered"]), "gemm_tflops_alone": 2 * m * n * k / med["gemm_alone"] / 1e12}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="h200-x2-overlap")
    ap.add_argument("--budget", type=float, default=120)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "validation" / "microbench"))
    a = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", 0))
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    ws, rank = dist.get_world_size(), dist.get_rank()
    t_end = time.time() + a.budget
    out = {"meta": {"gpu": torch.cuda.get_device_name(dev), "world_size": ws, "torch": torch.__version__,
                    "cuda": str(torch.version.cuda), "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                    "sm_count": torch.cuda.get_device_properties(dev).multi_processor_count,
                    "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
                    "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "how": "validation/harness/overlap_bench.py (module docstring)"},
           "overlap": []}
    for nbytes, shape, coll in itertools.product(SIZES, GEMMS, COLLECTIVES):
        go = torch.tensor([time.time() < t_end], device=dev, dtype=torch.int32)
        dist.all_reduce(go, op=dist.ReduceOp.MIN)  # all ranks stop together
        if not go.item():
            break
        row = measure(shape, coll, nbytes, ws, dev, a.reps)
        rows = [None] * ws
        dist.all_gather_object(rows, row)
        if rank == 0:
            merged = dict(row)
            for key in ("gemm_alone_s", "gemm_with_comm_s", "compute_slowdown", "comm_alone_s",
                        "comm_with_gemm_s", "comm_slowdown", "gemm_tflops_alone"):
                merged[key] = statistics.median(r[key] for r in rows)
            merged["covered"] = all(r["covered"] for r in rows)
            out["overlap"].append(merged)
            print(f"{nbytes >> 20:>4} MB {str(shape):>22} {coll:>15}: GEMM {merged['gemm_tflops_alone']:.0f} TF/s alone, "
                  f"slowed {merged['compute_slowdown']:.3f}; comm slowed {merged['comm_slowdown']:.3f}"
                  f"{'' if merged['covered'] else ' (NOT covered)'}", flush=True)
    if rank == 0:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / f"{a.name}.json").write_text(json.dumps(out, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
