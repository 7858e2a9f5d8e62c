"""Host-side microbenchmarks for offload (issue 14): CPU AdamW throughput per implementation x threads x
dtype, host memory bandwidth x threads, pinned/pageable H2D/D2H copies alone and under a 16-thread CPU Adam.

    python3 validation/harness/libraries/microbench_host.py --out $OUT/microbench.json [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import torch


def med(fn, reps=3, warm=1):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), ts


def make_params(n_total, dtype, n_tensors=64):
    per = n_total // n_tensors
    ps = [torch.randn(per, dtype=torch.float32).to(dtype) for _ in range(n_tensors)]
    gs = [torch.randn(per, dtype=torch.float32).to(dtype) * 1e-3 for _ in range(n_tensors)]
    return ps, gs, per * n_tensors


def adam_bench(impl, dtype, n, threads):
    torch.set_num_threads(threads)
    ps, gs, numel = make_params(n, dtype)
    params = [torch.nn.Parameter(p) for p in ps]
    for p, g in zip(params, gs):
        p.grad = g
    if impl == "ds_cpuadam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        opt = DeepSpeedCPUAdam(params, lr=1e-5, weight_decay=0.1, adamw_mode=True)
    elif impl == "torch_fused":
        opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.1, fused=True)
    elif impl == "torch_foreach":
        opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.1, foreach=True)
    else:
        opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.1, foreach=False)
    t, ts = med(opt.step, reps=3, warm=1)
    del opt, params, gs
    return {"impl": impl, "dtype": str(dtype).replace("torch.", ""), "threads": threads, "numel": numel,
            "step_s": t, "params_per_s": numel / t, "runs_s": ts}


def bandwidth(threads, gb=2.0):
    torch.set_num_threads(threads)
    n = int(gb * 2**30 / 4)
    a = torch.ones(n)
    b = torch.empty(n)
    t, _ = med(lambda: b.copy_(a), reps=5)
    t2, _ = med(lambda: torch.add(a, b, out=b), reps=5)
    return {"threads": threads, "bytes": n * 4, "copy_s": t, "copy_GBps_rw": 2 * n * 4 / t / 1e9,
            "add_GBps_rw": 3 * n * 4 / t2 / 1e9}


def copies(label):
    n = 2**30 // 4  # 1 GiB fp32
    dev = torch.device("cuda")
    g = torch.empty(n, device=dev)
    out = {}
    for kind in ("pinned", "pageable"):
        h = torch.empty(n, pin_memory=(kind == "pinned"))
        h.fill_(1.0)

        def h2d():
            g.copy_(h, non_blocking=True)
            torch.cuda.synchronize()

        def d2h():
            h.copy_(g, non_blocking=True)
            torch.cuda.synchronize()
        th, _ = med(h2d, reps=5)
        td, _ = med(d2h, reps=5)
        out[f"{kind}_h2d_GBps"] = n * 4 / th / 1e9
        out[f"{kind}_d2h_GBps"] = n * 4 / td / 1e9
    return {"condition": label, **out}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget-s", type=float, default=400)
    a = ap.parse_args()
    t0 = time.time()
    res = {"torch": torch.__version__, "cpu_count": os.cpu_count(), "default_threads": torch.get_num_threads(),
           "adam": [], "bandwidth": [], "copies": []}
    try:
        import deepspeed
        res["deepspeed"] = deepspeed.__version__
    except Exception as e:  # noqa: BLE001
        res["deepspeed"] = repr(e)

    def save():
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    n = 2**25 if a.quick else 2**28  # 268M params
    for th in (1, 2, 4, 8, 16):
        res["bandwidth"].append(bandwidth(th))
        print(res["bandwidth"][-1], flush=True)
    save()
    res["copies"].append(copies("idle"))
    print(res["copies"][-1], flush=True)
    # copies while DeepSpeedCPUAdam runs on 16 threads in another thread (the GIL is released in the op)
    stop = threading.Event()

    def adam_loop():
        torch.set_num_threads(16)
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        ps, gs, _ = make_params(2**27, torch.float32)
        params = [torch.nn.Parameter(p) for p in ps]
        for p, g in zip(params, gs):
            p.grad = g
        opt = DeepSpeedCPUAdam(params, lr=1e-5)
        while not stop.is_set():
            opt.step()
    th = threading.Thread(target=adam_loop, daemon=True)
    th.start()
    time.sleep(8)
    res["copies"].append(copies("during DeepSpeedCPUAdam on 16 threads (same process, other thread)"))
    print(res["copies"][-1], flush=True)
    stop.set()
    th.join()
    save()
    # Adam: 16 threads first (what a user gets by default), then fewer
    for threads in (16, 8, 4, 2, 1):
        for impl, dtype in (("ds_cpuadam", torch.float32), ("torch_fused", torch.float32),
                            ("torch_foreach", torch.float32), ("torch_fused", torch.bfloat16),
                            ("torch_foreach", torch.bfloat16), ("torch_forloop", torch.float32)):
            if time.time() - t0 > a.budget_s:
                res.setdefault("skipped", []).append(f"{impl} {dtype} t{threads}: budget")
                continue
            nn = n if threads >= 4 else n // 4
            if impl == "torch_forloop" and threads not in (16, 1):
                continue
            try:
                r = adam_bench(impl, dtype, nn, threads)
            except Exception as e:  # noqa: BLE001
                r = {"impl": impl, "dtype": str(dtype), "threads": threads, "error": repr(e)[:300]}
            res["adam"].append(r)
            print(r, flush=True)
            save()
    save()


if __name__ == "__main__":
    main()
