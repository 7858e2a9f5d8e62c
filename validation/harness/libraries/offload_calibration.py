"""Offload microbenchmarks for session 4 of issue 14 (no training process, nothing from the cases):

* adam_by_size: CPU AdamW throughput per implementation (torch fused / foreach / for-loop,
  DeepSpeedCPUAdam) on 16 threads, fp32, as a function of the elements per tensor (the same
  ~268M parameters split into tensors of 1M .. 64M elements).
* adam_llama: the same implementations on the parameter tensors of the Llama-3.2-1B and -3B shapes
  (embedding, q/k/v/o, gate/up/down, norms), as a check of pricing a model tensor by tensor.
* superoffload_worker: DeepSpeed 0.19.8's own SuperOffloadCPUOptimizer (the spawned CPU-Adam worker
  process, cpuadam_cores_perc 0.8) stepping one flat fp32 sub-group of 1e9 / 2.5e8 parameters the
  way _step_with_clipping does (async_step, then poll for the result, then the copy of the returned
  partition into the optimizer's fp32 flat), timed from the training process.
* stage3_copies: DeepSpeed ZeRO-3's blocking copies of one flat sub-group (1e9 / 2.5e8 elements):
  the updated fp32 partition (pinned, or pageable as SuperOffload leaves it) copied into the bf16
  GPU partition with a blocking copy_ (stage3.py _reassign_or_swap_out_partitioned_parameters), and
  a bf16 GPU gradient widened and copied into pageable fp32 host memory (superoffload_stage3.py
  partition_grads).
* cast_copies: per-tensor copy_ of bf16 GPU tensors into fp32 pinned CPU tensors and back (the plain
  offload loop's gradient and parameter paths) on the 3B tensor list: bytes and time per direction.

    python3 validation/harness/libraries/offload_calibration.py --out $OUT/offload_calibration.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from microbench_host import med as timed  # the same folder: median of timed runs after warm-up

LLAMA = {"1b": dict(h=2048, i=8192, layers=16, heads=32, kv=8, vocab=128256),
         "3b": dict(h=3072, i=8192, layers=28, heads=24, kv=8, vocab=128256)}


def llama_shapes(name):
    c = LLAMA[name]
    h, i, hd = c["h"], c["i"], 128
    per_layer = [h * c["heads"] * hd, h * c["kv"] * hd, h * c["kv"] * hd, c["heads"] * hd * h, i * h, i * h, i * h, h, h]
    return [c["vocab"] * h] + per_layer * c["layers"] + [h]


def make_opt(impl, params):
    if impl == "ds_cpuadam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        return DeepSpeedCPUAdam(params, lr=1e-5, weight_decay=0.1, adamw_mode=True)
    kw = {"torch_fused": {"fused": True}, "torch_foreach": {"foreach": True}, "torch_forloop": {"foreach": False}}[impl]
    return torch.optim.AdamW(params, lr=1e-5, weight_decay=0.1, **kw)


def adam_rate(impl, sizes, reps=3):
    params = []
    for n in sizes:
        p = torch.nn.Parameter(torch.empty(n).uniform_(-1, 1))
        p.grad = torch.empty(n).uniform_(-1e-3, 1e-3)
        params.append(p)
    opt = make_opt(impl, params)
    t, ts = timed(opt.step, reps=reps)
    numel = sum(sizes)
    del opt, params
    return {"impl": impl, "tensors": len(sizes), "numel": numel, "step_s": t, "params_per_s": numel / t, "runs_s": ts,
            "threads": torch.get_num_threads()}


def _adam_rows(out, part, cases, reps=3):
    """One adam_rate row per (label fields, impl, tensor sizes) in `cases`, printed as it comes."""
    rows = out[part] = []
    for fields, impl, sizes in cases:
        rows.append({**adam_rate(impl, sizes, reps), **fields})
        print(part, json.dumps(rows[-1]), flush=True)


def adam_by_size(out, total=2**28):
    _adam_rows(out, "adam_by_size", [({"elements_per_tensor": per}, impl, [per] * (total // per))
                                     for per in (2**20, 2**22, 2**24, 2**26)
                                     for impl in ("torch_fused", "ds_cpuadam", "torch_foreach", "torch_forloop")])


def adam_llama(out):
    _adam_rows(out, "adam_llama", [({"model": name}, impl, llama_shapes(name))
                                   for name, impls in (("1b", ("torch_fused", "ds_cpuadam", "torch_foreach",
                                                               "torch_forloop")),
                                                       ("3b", ("torch_fused", "ds_cpuadam", "torch_foreach")))
                                   for impl in impls], reps=2)


def superoffload_worker(out):
    from deepspeed.runtime.superoffload.superoffload_utils import SuperOffloadCPUOptimizer
    rows = []
    for numel in (10**9, 2.5e8):
        numel = int(numel)
        cfg = [{"lr": 1e-5, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "amsgrad": False}]
        affinity_before = sorted(os.sched_getaffinity(0))
        so = SuperOffloadCPUOptimizer(cfg, cpuadam_cores_perc=0.8, max_grad_numel=numel)
        main_cores = len(os.sched_getaffinity(0))
        # the optimizer's fp32 partition and its gradient, pinned as DeepSpeed allocates them
        flat = torch.empty(numel).uniform_(-1, 1).pin_memory()
        grad = torch.empty(numel).uniform_(-1e-3, 1e-3).pin_memory()
        pinned_before = flat.is_pinned()

        def one_step():
            t0 = time.perf_counter()
            so.async_step(0, 0, flat.data, grad.data, lr=1e-5)
            t1 = time.perf_counter()
            while True:
                res = so.get_result(expected_event_type="adam_step")
                if res is not None:
                    break
                time.sleep(0.001)
            t2 = time.perf_counter()
            flat.data.copy_(res["updated_param"], non_blocking=True)
            t3 = time.perf_counter()
            return t1 - t0, t2 - t1, t3 - t2

        parts = [one_step() for _ in range(4)][1:]
        try:
            with open(f"/proc/{so.cpuadam_process.pid}/status") as f:
                worker_threads = int([ln for ln in f if ln.startswith("Threads:")][0].split()[1])
            worker_cores = len(os.sched_getaffinity(so.cpuadam_process.pid))
        except OSError:
            worker_threads = worker_cores = None
        row = {"numel": numel, "put_s": [p[0] for p in parts], "wait_s": [p[1] for p in parts],
               "copy_back_s": [p[2] for p in parts], "step_s_median": statistics.median(sum(p) for p in parts),
               "main_cores": main_cores, "worker_cores": worker_cores, "worker_threads": worker_threads,
               "main_torch_threads": torch.get_num_threads(), "flat_pinned_before": pinned_before,
               "flat_pinned_after": flat.is_pinned(), "grad_pinned_after": grad.is_pinned()}
        row["params_per_s"] = numel / row["step_s_median"]
        print("superoffload_worker", json.dumps(row), flush=True)
        rows.append(row)
        so.close()
        os.sched_setaffinity(0, affinity_before)
        del flat, grad
    out["superoffload_worker"] = rows


def stage3_copies(out):
    dev = torch.device("cuda")
    rows = []
    for numel in (10**9, 2.5e8):
        numel = int(numel)
        gpu16 = torch.empty(numel, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
        row = {"numel": numel}
        for kind in ("pinned", "pageable"):
            host = torch.empty(numel).uniform_(-1, 1)
            if kind == "pinned":
                host = host.pin_memory()

            def up():
                gpu16.copy_(host)
                torch.cuda.synchronize()

            def down():
                host.copy_(gpu16.to(torch.float32), non_blocking=True)
                torch.cuda.synchronize()

            for label, fn in ((f"fp32_{kind}_to_bf16_gpu_blocking", up), (f"bf16_gpu_to_fp32_{kind}", down)):
                t, ts = timed(fn)
                row[label] = {"s": t, "runs_s": ts, "ns_per_param": t / numel * 1e9}
            del host
        print("stage3_copies", json.dumps(row), flush=True)
        rows.append(row)
        del gpu16
    out["stage3_copies"] = rows


def cast_copies(out):
    dev = torch.device("cuda")
    sizes = llama_shapes("3b")
    gpu = [torch.empty(n, dtype=torch.bfloat16, device=dev).uniform_(-1, 1) for n in sizes]
    host = [torch.empty(n, dtype=torch.float32, pin_memory=True) for n in sizes]

    def down():
        for h, g in zip(host, gpu):
            h.copy_(g, non_blocking=True)
        torch.cuda.synchronize()

    def up():
        for h, g in zip(host, gpu):
            g.copy_(h, non_blocking=True)
        torch.cuda.synchronize()

    numel = sum(sizes)
    row = {"numel": numel, "tensors": len(sizes)}
    for label, fn in (("bf16_gpu_to_fp32_pinned", down), ("fp32_pinned_to_bf16_gpu", up)):
        t, ts = timed(fn)
        row[label] = {"s": t, "runs_s": ts, "fp32_GBps": 4 * numel / t / 1e9}
    print("cast_copies", json.dumps(row), flush=True)
    out["cast_copies"] = row
    del gpu, host


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    # SuperOffload re-pins this process's threads to a few cores: run it last, or in its own process
    ap.add_argument("--only", default="cast_copies,stage3_copies,adam_by_size,adam_llama,superoffload_worker")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count())
    out = {"torch": torch.__version__, "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    try:
        import deepspeed
        out["deepspeed"] = deepspeed.__version__
    except ImportError:
        pass
    for part in args.only.split(","):
        t = time.perf_counter()
        try:
            globals()[part](out)
        except Exception as e:  # noqa: BLE001 - record and go on to the next part
            out[part + "_error"] = repr(e)
            print(part, "failed:", repr(e), flush=True)
        out[part + "_wall_s"] = time.perf_counter() - t
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
