"""NCCL collective bus bandwidth and GPU-to-GPU copy bandwidth.

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node 2 validation/harness/nccl_bench.py \
        --name h200-x2-nccl --budget 90

Writes validation/microbench/<name>.json:
  {"meta": {...}, "collectives": [{"op", "world_size", "bytes", "dtype", "time_s",
   "algbw_gbps", "busbw_gbps"}], "p2p": [{"src", "dst", "bytes", "time_s", "gbps", "how"}]}
bytes is the per-rank buffer size (all_reduce: the tensor; all_gather: the
gathered output; reduce_scatter: the input; all_to_all: the input (=output) of
all_to_all_single with equal splits; sendrecv: the tensor each rank sends to
rank+1 while receiving one from rank-1, one batch_isend_irecv, i.e. both
directions of every link at once).  algbw = bytes/time; busbw as in
nccl-tests: all_reduce algbw*2(n-1)/n, all_gather, reduce_scatter and
all_to_all algbw*(n-1)/n, sendrecv algbw.  Times: CUDA events around `iters`
back-to-back collectives after warm-up, maximum over ranks of the per-rank median.

--ops picks the collectives (default all_reduce,all_gather,reduce_scatter,peer_copy,
as the first 2-GPU sweep); peer_copy is the single-process tensor.copy_ between
devices 0 and 1 (rank 0 alone).  E.g. for 4 or 8 GPUs:
    torchrun --standalone --nproc_per_node 8 validation/harness/nccl_bench.py --name h200-x8-nccl \
        --ops all_reduce,all_gather,reduce_scatter,all_to_all,sendrecv,peer_copy --budget 150
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="h200-x2-nccl")
    ap.add_argument("--budget", type=float, default=90)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default=str(REPO / "validation" / "microbench"))
    ap.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter,peer_copy")
    a = ap.parse_args()
    ops = set(a.ops.split(","))
    cuda = torch.cuda.is_available() and not a.tiny
    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=dev if cuda else None)
    ws = dist.get_world_size()
    t_end = time.time() + a.budget
    sizes = [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30, 4 << 30] if not a.tiny else [1 << 12, 1 << 16]
    res = {"meta": {"gpu": torch.cuda.get_device_name(dev) if cuda else "cpu", "world_size": ws,
                    "torch": torch.__version__, "cuda": str(torch.version.cuda),
                    "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else "",
                    "date": _dt.date.today().isoformat(),
                    "ops": sorted(ops),
                    "env": {k: os.environ.get(k, "") for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")},
                    "method": "torch.distributed (NCCL) bf16 collectives, CUDA events around back-to-back calls after warm-up, "
                              "median of reps per rank, max over ranks; busbw factors as in nccl-tests"},
           "collectives": [], "p2p": []}
    if cuda and rank == 0:
        import subprocess
        res["meta"]["topo"] = subprocess.run("nvidia-smi topo -m", shell=True, capture_output=True, text=True).stdout
    dt = torch.bfloat16
    es = 2

    def timeit(fn, nbytes):
        iters = 20 if nbytes <= (64 << 20) else (5 if nbytes <= (1 << 30) else 3)
        for _ in range(3):
            fn()
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        ts = []
        for _ in range(5):
            if cuda:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(iters):
                    fn()
                e1.record()
                e1.synchronize()
                ts.append(e0.elapsed_time(e1) * 1e-3 / iters)
            else:
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                ts.append((time.perf_counter() - t0) / iters)
        t = torch.tensor([statistics.median(ts)], device=dev, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    for nb in sizes:
        stop = torch.tensor([1.0 if time.time() > t_end else 0.0], device=dev)
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if float(stop) > 0:
            res["meta"].setdefault("skipped", []).append(nb)
            continue
        n = nb // es
        x = torch.randn(n, device=dev, dtype=dt)
        out = torch.empty(n, device=dev, dtype=dt)
        shard = torch.randn(n // ws, device=dev, dtype=dt)

        def rec(op, t, factor):
            res["collectives"].append({"op": op, "world_size": ws, "bytes": nb, "dtype": "bf16", "time_s": t,
                                       "algbw_gbps": nb / t / 1e9, "busbw_gbps": nb / t / 1e9 * factor})
        if "all_reduce" in ops:
            rec("all_reduce", timeit(lambda: dist.all_reduce(x), nb), 2 * (ws - 1) / ws)
        if "all_gather" in ops:
            rec("all_gather", timeit(lambda: dist.all_gather_into_tensor(out, shard), nb), (ws - 1) / ws)
        if "reduce_scatter" in ops:
            rec("reduce_scatter", timeit(lambda: dist.reduce_scatter_tensor(shard, x), nb), (ws - 1) / ws)
        if "all_to_all" in ops:
            rec("all_to_all", timeit(lambda: dist.all_to_all_single(out, x), nb), (ws - 1) / ws)
        if "sendrecv" in ops and ws > 1:
            nxt, prv = (rank + 1) % ws, (rank - 1) % ws

            def sr():
                for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, out, prv)]):
                    w.wait()
            rec("sendrecv", timeit(sr, nb), 1.0)
        del x, out, shard
        if cuda:
            torch.cuda.empty_cache()
    dist.barrier()
    # P2P: rank 0 alone copies between the two devices (direct cudaMemcpyPeer via tensor.copy_)
    if cuda and rank == 0 and torch.cuda.device_count() >= 2 and "peer_copy" in ops:
        res["meta"]["can_access_peer_0_1"] = torch.cuda.can_device_access_peer(0, 1)
        for nb in [1 << 20, 16 << 20, 256 << 20, 1 << 30]:
            for src, dst in ((0, 1), (1, 0)):
                a_ = torch.empty(nb, dtype=torch.uint8, device=f"cuda:{src}").random_(0, 255)
                b_ = torch.empty(nb, dtype=torch.uint8, device=f"cuda:{dst}")
                torch.cuda.synchronize(src)
                torch.cuda.synchronize(dst)
                with torch.cuda.device(src):
                    for _ in range(3):
                        b_.copy_(a_, non_blocking=True)
                    torch.cuda.synchronize(src)
                    ts = []
                    for _ in range(7):
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record()
                        for _ in range(5):
                            b_.copy_(a_, non_blocking=True)
                        e1.record()
                        e1.synchronize()
                        ts.append(e0.elapsed_time(e1) * 1e-3 / 5)
                t = statistics.median(ts)
                res["p2p"].append({"src": src, "dst": dst, "bytes": nb, "time_s": t, "gbps": nb / t / 1e9,
                                   "how": "tensor.copy_ across devices from one process (peer copy), CUDA events on src stream"})
                del a_, b_
    dist.barrier()
    if rank == 0:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / f"{a.name}.json").write_text(json.dumps(res, indent=1))
        for c in res["collectives"]:
            print(f"NCCL {c['op']:15s} {c['bytes']/2**20:8.0f} MiB  {c['time_s']*1e3:8.3f} ms  busbw {c['busbw_gbps']:7.1f} GB/s")
        for p in res["p2p"]:
            print(f"P2P {p['src']}->{p['dst']} {p['bytes']/2**20:6.0f} MiB {p['gbps']:7.1f} GB/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
