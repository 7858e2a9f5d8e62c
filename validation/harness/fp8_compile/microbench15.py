"""Microbenchmarks for issue 15 (FP8 GEMMs, fp8 cast/amax kernels, SDPA backends), one device call.

    python3 validation/harness/fp8_compile/microbench15.py --out $OUT/microbench15.json [--quick]

All timings: CUDA events around each repeat, median of `reps` after warm-up, random normal inputs.
* scaled_mm: torch._scaled_mm (e4m3 x e4m3 -> bf16) with tensorwise scales (scalar fp32; with and
  without use_fast_accum) and rowwise scales ((M,1) x (1,N) fp32), against bf16 torch.mm, at the
  Hugging Face Llama projection shapes (q, k/v, o, gate/up, down) of the 1B/3B/8B shapes, for the
  forward (T x out x in), input-gradient (T x in x out) and weight-gradient (out x in x T) GEMMs.
* cast: amax + scale + cast to e4m3 written as plain PyTorch ops, eager (one kernel per op) and
  torch.compile'd (Inductor fuses), tensorwise / rowwise / tensorwise with a transposed copy;
  kernel count from torch.profiler.
* sdpa: F.scaled_dot_product_attention forward and forward+backward, per backend (sdpa_kernel),
  head dim, dtype, GQA (enable_gqa vs kv expanded to all heads, as HF does when a mask is passed),
  causal (is_causal) vs sliding window (boolean attn_mask); plus the backend PyTorch picks by default
  (kernel names from torch.profiler).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback

import torch
import torch.nn.functional as F

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
SHAPES = {  # hidden, intermediate, heads, kv heads, head dim
    "1b": (2048, 8192, 32, 8, 64),
    "3b": (3072, 8192, 24, 8, 128),
    "8b": (4096, 14336, 32, 8, 128),
}


def bench(fn, reps=20, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(ts)


def kernels_of(fn):
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [n for n in names if not n.startswith(("Memcpy", "Memset"))]


def ceilings(res):
    x = torch.empty(2 ** 30 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    t = bench(lambda: y.copy_(x), reps=10)
    res["copy_1GiB_GBps"] = 2 * 2 ** 30 / t / 1e9
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = bench(lambda: a @ b, reps=10)
    res["bf16_mm_8192_TFLOPs"] = 2 * 8192 ** 3 / t / 1e12
    del x, y, a, b


def scaled_mm_bench(quick):
    rows = []
    tokens = [8192] if quick else [4096, 8192]
    for mname, (h, i, nh, kv, hd) in SHAPES.items():
        lin = {"q": (h, nh * hd), "kv": (h, kv * hd), "o": (nh * hd, h), "gate_up": (h, i), "down": (i, h)}
        for T in tokens:
            for lname, (fin, fout) in lin.items():
                for gemm, (M, N, K) in {"fwd": (T, fout, fin), "dgrad": (T, fin, fout), "wgrad": (fout, fin, T)}.items():
                    row = {"model": mname, "tokens": T, "linear": lname, "gemm": gemm, "M": M, "N": N, "K": K}
                    flops = 2 * M * N * K
                    a16 = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                    bt16 = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
                    b16 = bt16.t()
                    row["bf16_s"] = bench(lambda: torch.mm(a16, b16))
                    a8, b8 = a16.to(E4M3), bt16.to(E4M3).t()
                    one = torch.ones((), device="cuda", dtype=torch.float32)
                    for key, kw in {"tw_s": dict(scale_a=one, scale_b=one, use_fast_accum=False),
                                    "tw_fastacc_s": dict(scale_a=one, scale_b=one, use_fast_accum=True),
                                    "rw_s": dict(scale_a=torch.ones(M, 1, device="cuda"),
                                                 scale_b=torch.ones(1, N, device="cuda"), use_fast_accum=False)}.items():
                        try:
                            row[key] = bench(lambda: torch._scaled_mm(a8, b8, out_dtype=torch.bfloat16, **kw))
                        except Exception as e:  # noqa: BLE001
                            row[key] = None
                            row[key + "_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                    for key in ("bf16_s", "tw_s", "tw_fastacc_s", "rw_s"):
                        if row.get(key):
                            row[key.replace("_s", "_TFLOPs")] = flops / row[key] / 1e12
                    rows.append(row)
                    del a16, bt16, b16, a8, b8
    return rows


# ---- cast / amax: the ops torchao's dynamic scaling runs, written as plain PyTorch ----
def cast_tensorwise(x):
    amax = x.abs().amax().float()
    scale = E4M3_MAX / amax.clamp(min=1e-12)
    return (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def cast_tensorwise_t(x):
    y, s = cast_tensorwise(x)
    return y, y.t().contiguous(), s


def cast_rowwise(x):
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    scale = E4M3_MAX / amax.clamp(min=1e-12)
    return (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def cast_colwise(x):
    amax = x.abs().amax(dim=0, keepdim=True).float()
    scale = E4M3_MAX / amax.clamp(min=1e-12)
    return (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def cast_bench(quick):
    rows = []
    tensors = {"act_8192x4096_bf16": (8192, 4096, torch.bfloat16), "act_8192x3072_bf16": (8192, 3072, torch.bfloat16),
               "w_14336x4096_fp32": (14336, 4096, torch.float32), "w_14336x4096_bf16": (14336, 4096, torch.bfloat16)}
    fns = {"tensorwise": (cast_tensorwise, 1), "tensorwise+transpose": (cast_tensorwise_t, 2),
           "rowwise": (cast_rowwise, 1), "colwise": (cast_colwise, 1)}
    for tname, (r, c, dt) in tensors.items():
        x = torch.randn(r, c, device="cuda", dtype=dt)
        for fname, (fn, nout) in fns.items():
            ideal = x.numel() * x.element_size() + nout * x.numel()
            for mode in ("eager", "compiled"):
                row = {"tensor": tname, "cast": fname, "mode": mode, "ideal_bytes": ideal}
                try:
                    torch._dynamo.reset()  # a fresh static-shape compile per tensor (no automatic dynamic shapes)
                    f = fn if mode == "eager" else torch.compile(fn)
                    t0 = time.perf_counter()
                    f(x)
                    torch.cuda.synchronize()
                    row["first_call_s"] = time.perf_counter() - t0
                    row["time_s"] = bench(lambda: f(x))
                    row["GBps_ideal_bytes"] = ideal / row["time_s"] / 1e9
                    ks = kernels_of(lambda: f(x))
                    row["kernels"] = len(ks)
                    row["kernel_names"] = ks[:12]
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(row)
        del x
    return rows


def sdpa_bench(quick):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    B, S, HQ, W = 2, 2048, 32, 512
    HKV = HQ // 4
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH, "default": None}
    i = torch.arange(S, device="cuda")
    win = ((i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < W))[None, None]
    rows = []
    hds = [64, 128] if quick else [64, 80, 96, 100, 128, 256]
    for dt in (torch.bfloat16, torch.float16):
        for hd in hds:
            for kvmode in ("enable_gqa", "expanded"):
                for mask in ("causal", "window512"):
                    q = torch.randn(B, HQ, S, hd, device="cuda", dtype=dt, requires_grad=True)
                    k = torch.randn(B, HKV, S, hd, device="cuda", dtype=dt, requires_grad=True)
                    v = torch.randn(B, HKV, S, hd, device="cuda", dtype=dt, requires_grad=True)
                    go = torch.randn(B, HQ, S, hd, device="cuda", dtype=dt)

                    def call():
                        kk, vv = (k, v) if kvmode == "enable_gqa" else (k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
                        kw = {"enable_gqa": True} if kvmode == "enable_gqa" else {}
                        if mask == "causal":
                            return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, **kw)
                        return F.scaled_dot_product_attention(q, kk, vv, attn_mask=win, **kw)

                    def fb():
                        out = call()
                        out.backward(go)
                        q.grad = k.grad = v.grad = None

                    causal_flops = 4 * B * HQ * S * S * hd / 2
                    win_flops = 4 * B * HQ * hd * float(win.sum())
                    for bname, be in backends.items():
                        if bname == "math" and (hd not in (64, 128) or dt != torch.bfloat16):
                            continue
                        row = {"dtype": str(dt).split(".")[-1], "head_dim": hd, "kv": kvmode, "mask": mask,
                               "backend": bname, "B": B, "S": S, "heads": HQ, "kv_heads": HKV, "window": W,
                               "fwd_flops_nominal": win_flops if mask != "causal" else causal_flops}
                        try:
                            ctx = sdpa_kernel([be]) if be is not None else torch.enable_grad()
                            with ctx:
                                reps = 5 if bname == "math" else 15
                                row["fwd_s"] = bench(lambda: call(), reps=reps, warm=2)
                                row["fwd_bwd_s"] = bench(fb, reps=reps, warm=2)
                                if bname == "default":
                                    ks = kernels_of(fb)
                                    row["kernels_fwd_bwd"] = sorted(set(n[:160] for n in ks))[:12]
                            row["fwd_TFLOPs"] = row["fwd_flops_nominal"] / row["fwd_s"] / 1e12
                            row["fwd_bwd_TFLOPs"] = 3.5 * row["fwd_flops_nominal"] / row["fwd_bwd_s"] / 1e12
                        except Exception as e:  # noqa: BLE001
                            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                        q.grad = k.grad = v.grad = None
                        rows.append(row)
                    del q, k, v, go
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", default="ceil,mm,cast,sdpa")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    res = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
           "gpu": torch.cuda.get_device_name(0), "quick": a.quick,
           "script": "validation/harness/fp8_compile/microbench15.py"}
    for part, fn in (("ceil", ceilings), ("mm", scaled_mm_bench), ("cast", cast_bench), ("sdpa", sdpa_bench)):
        if part not in a.parts.split(","):
            continue
        run_part(res, part, (lambda fn=fn: fn(res)) if part == "ceil" else (lambda fn=fn: fn(a.quick)), a.out)
    summarize(res)


def run_part(res, part, call, out):
    """One part of a microbenchmark run: its rows (or its error) into res[part], its wall time, and the
    JSON written again, so that a later part's failure or timeout loses nothing before it."""
    t0 = time.time()
    try:
        rows = call()
        if rows is not None:
            res[part] = rows
    except Exception:  # noqa: BLE001
        res[part + "_error"] = traceback.format_exc()[-3000:]
        print(res[part + "_error"], flush=True)
    res[part + "_wall_s"] = time.time() - t0
    print(f"{part} done in {time.time() - t0:.0f}s", flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    torch.cuda.empty_cache()


def summarize(res):
    print(f"copy {res.get('copy_1GiB_GBps', 0):.0f} GB/s, bf16 mm {res.get('bf16_mm_8192_TFLOPs', 0):.0f} TFLOP/s")
    for r in res.get("mm", []):
        if r["tokens"] == 8192:
            print(f"mm {r['model']} {r['linear']:7s} {r['gemm']:5s} {r['M']}x{r['N']}x{r['K']}: bf16 {r.get('bf16_TFLOPs', 0):.0f} "
                  f"tw {r.get('tw_TFLOPs') or 0:.0f} twfa {r.get('tw_fastacc_TFLOPs') or 0:.0f} rw {r.get('rw_TFLOPs') or 0:.0f}")
    for r in res.get("cast", []):
        print(f"cast {r['tensor']:20s} {r['cast']:22s} {r['mode']:8s} {r.get('time_s', 0) * 1e6:8.1f} us "
              f"{r.get('GBps_ideal_bytes', 0):6.0f} GB/s k={r.get('kernels')} {r.get('error', '')[:80]}")
    for r in res.get("sdpa", []):
        print(f"sdpa {r['dtype']} hd{r['head_dim']:3d} {r['kv']:10s} {r['mask']:9s} {r['backend']:9s} "
              f"fwd {r.get('fwd_TFLOPs', 0):5.0f} fb {r.get('fwd_bwd_TFLOPs', 0):5.0f} TF/s "
              f"{(r.get('error') or '')[:70]} {('|'.join(r.get('kernels_fwd_bwd', [])))[:110] if r['backend'] == 'default' else ''}")


if __name__ == "__main__":
    main()
