"""Issue 15: the regions torch.compile (Inductor) fuses in a Hugging Face Llama layer, eager vs
compiled, one device call.

    python3 validation/harness/fp8_compile/microbench_compile15.py --out $OUT/compile_regions.json

Each region is written as Hugging Face's eager code runs it under torch.autocast(bf16) with fp32
parameters (the residual stream fp32, projections' outputs bf16) and timed eager and
torch.compile'd (static shapes, fresh compile per shape): forward alone and forward + backward
(backward = the difference), CUDA events, median of `reps` after warm-up (bench() of
microbench15.py), kernel counts and names from torch.profiler (kernels_of()).

Regions (T tokens, h hidden, f intermediate, H heads, K kv heads, d head dim):
* add_rmsnorm: h1 = x + a (fp32 + bf16); n = (w * (h1 * rsqrt(mean(h1^2) + eps))).to(bf16): the
  residual add, LlamaRMSNorm and autocast's cast feeding the next projections; backward takes the
  gradients of h1 (fp32) and n (bf16).
* rmsnorm: the same without the add (the first layer's input norm).
* swiglu: silu(g) * u on bf16 [T, f].
* rope: HF's apply_rotary_pos_emb on q [b, H, s, d] and k [b, K, s, d] (transposed views of the
  projections' bf16 outputs) with fp32 cos/sin (HF's rotary tables in the fp32 residual dtype),
  rotated q and k cast to bf16 for SDPA.
* cross_entropy: F.cross_entropy(logits.float(), labels) on bf16 logits [T, V] (HF's loss).
* downcast / upcast: fp32 -> bf16 and bf16 -> fp32 copies of an [f, h] tensor (weight casts,
  gradient casts).
Memory: fwd_kept_bytes = allocated after a forward with its outputs alive (outputs + tensors saved
for backward), fwd_bwd_peak_bytes = peak over forward + backward; both above the inputs.
* sdpa_bool_mask vs sdpa_causal_gqa (eager only): F.scaled_dot_product_attention as HF calls it
  compiled (a materialised [b, 1, s, s] boolean causal mask, k and v expanded to the H query
  heads) and eager (is_causal, enable_gqa with K kv heads), at the layer's batch (T / 2048) x 2048.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from microbench15 import bench, kernels_of  # noqa: E402  (same timing and kernel counting)

BF16 = torch.bfloat16
EPS = 1e-5
# (name, T, h, f, H, K, d): the HF Llama-3.2 1B and 3B layer shapes at the measured token counts
# (most needed first: a call that runs out of time loses the last)
SHAPES = [("1b-T8192", 8192, 2048, 8192, 32, 8, 64), ("3b-T2048", 2048, 3072, 8192, 24, 8, 128),
          ("1b-T2048", 2048, 2048, 8192, 32, 8, 64), ("3b-T4096", 4096, 3072, 8192, 24, 8, 128)]
VOCAB = 128256


def rmsnorm(h1, w):
    return (w * (h1 * torch.rsqrt(h1.pow(2).mean(-1, keepdim=True) + EPS))).to(BF16)


def add_rmsnorm(x, a, w):
    h1 = x + a
    return h1, rmsnorm(h1, w)


def swiglu(g, u):
    return F.silu(g) * u


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return ((q * cos) + (rotate_half(q) * sin)).to(BF16), ((k * cos) + (rotate_half(k) * sin)).to(BF16)


def cross_entropy(logits, labels):
    return F.cross_entropy(logits.float(), labels)


def cast(x, dtype):
    return x.to(dtype)


def sdpa_causal_gqa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def sdpa_bool_mask(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def inputs(region, T, h, f, H, K, d):
    """(args, which args get gradients) for one region at one shape."""
    r = lambda *s, dt=torch.float32: torch.randn(*s, device="cuda", dtype=dt)
    b, s = T // 2048, 2048
    if region == "add_rmsnorm":
        return (r(T, h), r(T, h, dt=BF16), r(h)), (0, 1, 2)
    if region == "rmsnorm":
        return (r(T, h), r(h)), (0, 1)
    if region == "swiglu":
        return (r(T, f, dt=BF16), r(T, f, dt=BF16)), (0, 1)
    if region == "rope":
        q = r(b, s, H * d, dt=BF16).view(b, s, H, d).transpose(1, 2)
        k = r(b, s, K * d, dt=BF16).view(b, s, K, d).transpose(1, 2)
        return (q, k, r(b, s, d), r(b, s, d)), (0, 1)
    if region == "cross_entropy":
        return (r(T, VOCAB, dt=BF16), torch.randint(0, VOCAB, (T,), device="cuda")), (0,)
    if region in ("sdpa_causal_gqa", "sdpa_bool_mask"):
        heads = K if region == "sdpa_causal_gqa" else H
        qkv = (r(b, H, s, d, dt=BF16), r(b, heads, s, d, dt=BF16), r(b, heads, s, d, dt=BF16))
        if region == "sdpa_causal_gqa":
            return qkv, (0, 1, 2)
        return (*qkv, torch.ones(s, s, dtype=torch.bool, device="cuda").tril().expand(b, 1, s, s)), (0, 1, 2)
    if region == "downcast":
        return (r(f, h), torch.bfloat16), (0,)
    if region == "upcast":
        return (r(f, h, dt=BF16), torch.float32), (0,)
    raise ValueError(region)


FUNCS = {"add_rmsnorm": add_rmsnorm, "rmsnorm": rmsnorm, "swiglu": swiglu, "rope": rope,
         "cross_entropy": cross_entropy, "downcast": cast, "upcast": cast,
         "sdpa_causal_gqa": sdpa_causal_gqa, "sdpa_bool_mask": sdpa_bool_mask}


def measure(region, shape, mode, reps):
    name, T, h, f, H, K, d = shape
    args, grad_of = inputs(region, T, h, f, H, K, d)
    leaves = [a.detach().requires_grad_(i in grad_of) if torch.is_tensor(a) and a.is_floating_point() else a
              for i, a in enumerate(args)]
    fn = FUNCS[region]
    if mode == "compiled":
        torch._dynamo.reset()
        fn = torch.compile(fn, dynamic=False)
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = [torch.randn_like(o) for o in outs]

    def fwd():
        with torch.no_grad():
            fn(*leaves)

    def fwd_bwd():
        o = fn(*leaves)
        o = o if isinstance(o, tuple) else (o,)
        torch.autograd.backward(o, grads)
        for a in leaves:
            if torch.is_tensor(a):
                a.grad = None

    t0 = time.perf_counter()
    fwd_bwd()  # compiles the backward too
    compile_s = time.perf_counter() - t0
    row = {"region": region, "shape": name, "T": T, "h": h, "f": f, "H": H, "K": K, "d": d, "mode": mode,
           "compile_or_first_s": compile_s, "fwd_s": bench(fwd, reps=reps)}
    row["fwd_bwd_s"] = bench(fwd_bwd, reps=reps)
    row["bwd_s"] = row["fwd_bwd_s"] - row["fwd_s"]
    # memory: what the forward keeps (outputs + saved for backward) and the forward+backward peak,
    # both above what the inputs already hold
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    o = fn(*leaves)
    torch.cuda.synchronize()
    row["fwd_kept_bytes"] = torch.cuda.memory_allocated() - base
    o = o if isinstance(o, tuple) else (o,)
    torch.autograd.backward(o, grads)
    torch.cuda.synchronize()
    row["fwd_bwd_peak_bytes"] = torch.cuda.max_memory_allocated() - base
    del o
    for a in leaves:
        if torch.is_tensor(a):
            a.grad = None
    kf, kfb = kernels_of(fwd), kernels_of(fwd_bwd)
    row.update(kernels_fwd=len(kf), kernels_fwd_bwd=len(kfb), kernel_names_fwd_bwd=sorted(set(kfb)))
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=480.0)
    args = ap.parse_args()
    start = time.time()
    res = {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": __import__("triton").__version__,
           "gpu": torch.cuda.get_device_name(), "script": "validation/harness/fp8_compile/microbench_compile15.py",
           "rows": [], "errors": []}
    plan = [(r, s) for s in SHAPES for r in ("add_rmsnorm", "rmsnorm", "swiglu", "rope", "cross_entropy",
                                              "downcast", "upcast", "sdpa_causal_gqa", "sdpa_bool_mask")]
    for region, shape in plan:
        for mode in ("eager",) if region.startswith("sdpa") else ("eager", "compiled"):
            if time.time() - start > args.budget_s:
                res["errors"].append(f"{region} {shape[0]} {mode}: skipped (time budget)")
                continue
            try:
                row = measure(region, shape, mode, args.reps)
                res["rows"].append(row)
                print(f"{region:14s} {shape[0]:9s} {mode:8s} fwd {row['fwd_s'] * 1e6:8.1f} us  bwd "
                      f"{row['bwd_s'] * 1e6:8.1f} us  kernels {row['kernels_fwd']}/{row['kernels_fwd_bwd']}  "
                      f"first {row['compile_or_first_s']:.1f} s", flush=True)
            except Exception as e:  # a region that fails is recorded, the others still run
                res["errors"].append(f"{region} {shape[0]} {mode}: {e!r}")
                traceback.print_exc()
            torch.cuda.empty_cache()
            with open(args.out, "w") as fh:  # partial results survive a timeout
                json.dump(res, fh, indent=1)
    res["wall_s"] = time.time() - start
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
