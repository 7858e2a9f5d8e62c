"""Second microbenchmark pass: what the first pass (microbench.py) did not cover.

    python3 validation/harness/microbench2.py --name h100-extra [--budget 240] [--tiny]

Sections (rows in the docs/formats.md schema, plus two new tables):
* launch: the bare eager-op cost of microbench.py, on the same machine, so the
  framework overhead can be expressed as a multiple of it (hosts differ between
  lent machines; the ratio travels, the absolute cost does not).
* framework_overhead: host seconds per launched kernel in a real eager training
  step (nn.Module calls, autocast, autograd recording; the autograd engine in
  backward; the optimizer), measured on a tiny Llama (validation/harness/model.py)
  whose GPU work is negligible, so the host is the bottleneck. Kernels are
  counted with torch.profiler (runtime launch calls inside each phase's range).
* attention: SDPA with the backend PyTorch picks by default (no forcing),
  bf16 and fp32, head_dim 64 and 128, fwd and bwd times.
* memory_bound: the fp8 path's eager pieces (model._quant per-tensor
  quantisation of fp32 and bf16 tensors, fp8 transposes), bf16->fp32 casts.
* unified_memory: CUDA managed memory (CuPy) within the card's capacity:
  first GPU touch after the CPU wrote it (fault-driven migration), a resident
  re-read, and an explicit prefetch.
Timing: bench() of microbench.py (CUDA events, warm-up, median), host
perf_counter for the framework-overhead phases.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import microbench as mb  # noqa: E402
from model import ModelConfig, _quant, build_model  # noqa: E402

REPO = HERE.parent.parent
DEPTHS: list[int] = []  # --depths: the overhead variants at several layer counts instead
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
                "cudaMemcpyAsync", "cudaMemsetAsync", "cudaLaunchCooperativeKernel")


# ----------------------------------------------------------------------------- framework overhead
def overhead_variants(tiny):
    base = dict(hidden_size=128, intermediate_size=256, num_layers=4, num_attention_heads=4, num_kv_heads=2,
                head_dim=32, vocab_size=512, max_seq_len=256)
    if DEPTHS:
        return [(f"bf16-amp-L{n}", dict(base, num_layers=n), dict(), "bf16") for n in DEPTHS] + \
               [(f"lora16-bf16-L{n}", dict(base, num_layers=n), dict(lora_rank=16, base_dtype=torch.bfloat16), "bf16")
                for n in DEPTHS]
    return [
        ("bf16-amp", base, dict(), "bf16"),
        ("fp32", base, dict(), "fp32"),
        ("bf16-amp-full-recompute", base, dict(recompute="full"), "bf16"),
        ("bf16-amp-selective", base, dict(recompute="selective"), "bf16"),
        ("lora16-bf16", base, dict(lora_rank=16, base_dtype=torch.bfloat16), "bf16"),
        ("fp8", base, dict(fp8=True), "fp8"),
    ]


def count_launches(prof, ranges):
    """Launch calls inside each range. The autograd engine launches backward kernels
    from its own thread, whose calls may not be attributed to the "bwd" range, so
    "bwd" is the step's total less the other ranges, and the GPU's kernel count is kept too."""
    counts = {k: 0 for k in ranges}
    spans = {}
    events = list(prof.events())
    for e in events:
        if e.name in ranges:
            spans[e.name] = (e.time_range.start, e.time_range.end)
    total = 0
    for e in events:
        if any(e.name.startswith(c) for c in LAUNCH_CALLS):
            total += 1
            t = e.time_range.start
            for k, (s, en) in spans.items():
                if s <= t <= en:
                    counts[k] += 1
    counts["total"] = total
    counts["gpu_kernels"] = sum(1 for e in events if str(getattr(e, "device_type", "")).endswith("CUDA"))
    if "bwd" in counts:
        counts["bwd"] = total - sum(counts[k] for k in ranges if k != "bwd")
    return counts


def step_phases(opt, forward):
    """One training step (zero_grad, forward() -> loss, backward, optimizer step) in record_function ranges
    "fwd", "bwd", "opt": the host seconds of each."""
    from torch.profiler import record_function
    opt.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    with record_function("fwd"):
        loss = forward()
    t1 = time.perf_counter()
    with record_function("bwd"):
        loss.backward()
    t2 = time.perf_counter()
    with record_function("opt"):
        opt.step()
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2


def run_overhead(res, sec, tiny):
    from torch.profiler import ProfilerActivity, profile
    rows = []
    for name, cfgd, kw, prec in overhead_variants(tiny):
        if not sec.ok():
            continue
        cfg = ModelConfig(name="tiny", **cfgd)
        try:
            model = build_model(cfg, mb.DEV, **kw)
        except Exception as e:  # noqa: BLE001
            rows.append({"variant": name, "error": repr(e)[:200]})
            continue
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-5, foreach=True)
        tok = torch.randint(0, cfg.vocab_size, (1, 128), device=mb.DEV)
        lab = torch.randint(0, cfg.vocab_size, (1, 128), device=mb.DEV)
        autocast = prec in ("bf16", "fp8")

        def forward():
            if autocast:
                with torch.autocast(mb.DEV, dtype=torch.bfloat16):
                    return model(tok, lab)
            return model(tok, lab)

        def phases():
            return step_phases(opt, forward)

        for _ in range(5):
            phases()
        mb.sync()
        samples = []
        for _ in range(15):
            mb.sync()
            samples.append(phases())
        mb.sync()
        # the GPU must not have been the bottleneck: compare with device time of one step
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if mb.CUDA else [])) as prof:
            phases()
            mb.sync()
        counts = count_launches(prof, ("fwd", "bwd", "opt"))
        med = [statistics.median(s[i] for s in samples) for i in range(3)]
        row = {"variant": name, "precision": prec, **{f"{p}_host_s": v for p, v in zip(("fwd", "bwd", "opt"), med)},
               **{f"{p}_launches": counts[p] for p in ("fwd", "bwd", "opt")},
               "step_launches": counts["total"], "step_gpu_events": counts["gpu_kernels"]}
        for p, v in zip(("fwd", "bwd", "opt"), med):
            row[f"{p}_host_us_per_launch"] = v / max(counts[p], 1) * 1e6
        rows.append(row)
        print("overhead", row, flush=True)
        sec.ok(name)
        del model, opt
    res["framework_overhead"] = {"rows": rows, "model": "validation/harness/model.py tiny Llama h=128, 4 layers, "
                                 "seq 128, mb 1", "method": "host perf_counter per phase (median of 15 steps after 5 "
                                 "warm-ups, torch.cuda.synchronize before each step); launches = CUDA runtime launch/"
                                 "memcpy/memset calls inside each phase's record_function range (one profiled step)"}


# ----------------------------------------------------------------------------- attention
def run_attention_default(res, sec, tiny):
    from torch.nn.attention import SDPBackend
    seqs = [1024, 2048, 4096] if not tiny else [32]
    combos = [(16, 16), (32, 4), (32, 8), (32, 32)] if not tiny else [(4, 2)]
    for dtname, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        for hd in ((64, 128) if not tiny else (16,)):
            for s in seqs:
                for h, kv in combos:
                    if not sec.ok():
                        continue
                    tok = (16384 if dt == torch.bfloat16 else 8192) if not tiny else 64
                    b = max(1, tok // s)
                    q = torch.randn(b, h, s, hd, device=mb.DEV, dtype=dt, requires_grad=True)
                    k = torch.randn(b, kv, s, hd, device=mb.DEV, dtype=dt, requires_grad=True)
                    v = torch.randn(b, kv, s, hd, device=mb.DEV, dtype=dt, requires_grad=True)
                    do = torch.randn(b, h, s, hd, device=mb.DEV, dtype=dt)
                    gqa = kv != h
                    try:
                        ch = torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=gqa)
                        backend = str(SDPBackend(ch)) if not isinstance(ch, SDPBackend) else str(ch)
                    except Exception as e:  # noqa: BLE001
                        backend = "unknown: " + repr(e)[:80]

                    def fwd():
                        with torch.no_grad():
                            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

                    def fb():
                        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa).backward(do)
                    try:
                        tf = mb.bench(fwd, reps=5)
                        tfb = mb.bench(fb, reps=5)
                    except Exception as e:  # noqa: BLE001
                        res["attention"].append({"batch": b, "heads": h, "kv_heads": kv, "seq": s, "head_dim": hd,
                                                 "dtype": dtname, "backend": backend, "error": repr(e)[:200]})
                        continue
                    fl = 4.0 * b * h * s * s * hd * 0.5
                    res["attention"].append({
                        "batch": b, "heads": h, "kv_heads": kv, "seq": s, "head_dim": hd, "dtype": dtname,
                        "causal": True, "backend": backend, "default_backend": True, "fwd_time_s": tf,
                        "bwd_time_s": max(tfb - tf, 1e-9), "fwd_tflops": fl / tf / 1e12,
                        "bwd_tflops": 2.5 * fl / max(tfb - tf, 1e-9) / 1e12})
                    q.grad = k.grad = v.grad = None
                    del q, k, v, do
            if mb.CUDA:
                torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- fp8 pieces and casts
def run_fp8_membound(res, sec, tiny):
    sizes = [1 << 20, 4 << 20, 16 << 20, 64 << 20] if not tiny else [1 << 12]

    def rec(op, numel, dtype, nbytes, t):
        res["memory_bound"].append({"op": op, "numel": int(numel), "dtype": dtype, "bytes_moved": int(nbytes),
                                    "time_s": t, "gbps": nbytes / t / 1e9})
    for n in sizes:
        for dname, dt, es in (("fp32", torch.float32, 4), ("bf16", torch.bfloat16, 2)):
            if not sec.ok():
                continue
            x = torch.randn(n // 1024, 1024, device=mb.DEV, dtype=dt)
            fmt = torch.float8_e4m3fn if dname == "fp32" else torch.float8_e5m2
            t = mb.bench(lambda: _quant(x, fmt, 448.0 if dname == "fp32" else 57344.0))
            rec("fp8_quant", n, dname, n * (es + 1), t)  # minimal: read source once, write fp8 once
            del x
        if sec.ok():
            y = torch.randn(n // 1024, 1024, device=mb.DEV).to(torch.float8_e4m3fn)
            t = mb.bench(lambda: y.t().contiguous())
            rec("fp8_transpose", n, "fp8", 2 * n, t)
            del y
        if sec.ok():
            z = torch.randn(n, device=mb.DEV, dtype=torch.bfloat16)
            t = mb.bench(lambda: z.float())
            rec("cast_bf16_to_fp32", n, "bf16->fp32", 6 * n, t)
            del z
        if mb.CUDA:
            torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- unified memory
def run_unified_memory(res, sec, tiny):
    out = {"rows": [], "method": "CuPy managed allocations (cudaMallocManaged) within the card's capacity; the "
           "CPU writes every page (numpy view), then a GPU reduction reads it (first touch: fault-driven "
           "migration), again (resident), then after the CPU wrote it again an explicit cudaMemPrefetchAsync "
           "to the GPU; wall time around synchronized calls"}
    try:
        import cupy as cp
        import numpy as np
    except Exception as e:  # noqa: BLE001
        out["error"] = "cupy unavailable: " + repr(e)[:100]
        res["unified_memory"] = out
        return
    sizes = [256 << 20, 1 << 30, 4 << 30] if not tiny else [1 << 20]
    for nbytes in sizes:
        if not sec.ok():
            continue
        try:
            mem = cp.cuda.malloc_managed(nbytes)
            arr = cp.ndarray((nbytes // 4,), dtype=cp.float32, memptr=mem)
            host = np.ctypeslib.as_array(
                (np.ctypeslib.ctypes.c_float * (nbytes // 4)).from_address(mem.ptr))
            host[:] = 1.0
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            float(arr.sum())
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            float(arr.sum())
            resident = time.perf_counter() - t0
            host[:] = 2.0
            t0 = time.perf_counter()
            cp.cuda.runtime.memPrefetchAsync(mem.ptr, nbytes, 0, 0)
            cp.cuda.Device().synchronize()
            prefetch = time.perf_counter() - t0
            out["rows"].append({"bytes": nbytes, "first_touch_s": first, "resident_s": resident,
                                "prefetch_s": prefetch, "fault_migration_gbps": nbytes / max(first - resident, 1e-9) / 1e9,
                                "prefetch_gbps": nbytes / prefetch / 1e9})
            print("um", out["rows"][-1], flush=True)
            del arr, host, mem
            cp.get_default_memory_pool().free_all_blocks()
        except Exception as e:  # noqa: BLE001
            out["rows"].append({"bytes": nbytes, "error": repr(e)[:200]})
    res["unified_memory"] = out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--budget", type=float, default=240)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--sections", default="overhead,attention,fp8,um")
    ap.add_argument("--depths", default="", help="e.g. 4,22,32: host cost per kernel vs model depth")
    a = ap.parse_args()
    DEPTHS.extend(int(x) for x in a.depths.split(",") if x)
    mb.CUDA = torch.cuda.is_available() and not a.tiny
    mb.DEV = "cuda" if mb.CUDA else "cpu"
    torch.manual_seed(0)
    res = {"meta": {}, "attention": [], "memory_bound": []}
    mb.gather_meta(res)
    res["meta"]["method"] = __doc__
    B = mb.Budget(a.budget)
    sections = {"launch": (mb.run_launch, 0.05), "overhead": (run_overhead, 0.2), "attention": (run_attention_default, 0.45),
                "fp8": (run_fp8_membound, 0.2), "um": (run_unified_memory, 0.15)}
    plan = [(name, *sections[name]) for name in a.sections.split(",")]
    out = REPO / "validation" / "microbench" / f"{a.name}.json"
    for name, fn, share in plan:
        sec = B.section(name, share)
        try:
            fn(res, sec, a.tiny)
        except Exception as e:  # noqa: BLE001
            import traceback
            res["meta"].setdefault("errors", []).append(f"{name}: {traceback.format_exc()[-800:]}")
            print(f"section {name} failed: {e!r}", flush=True)
        sec.close()
        res["meta"]["skipped"] = B.skipped
        out.write_text(json.dumps(res, indent=1, default=str))
    print("wrote", out)


if __name__ == "__main__":
    main()
