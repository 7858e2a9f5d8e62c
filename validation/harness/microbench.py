"""Microbenchmarks for ghsim calibration -> validation/microbench/<name>.json.

    python3 validation/harness/microbench.py --name h100 --budget 200
    python3 validation/harness/microbench.py --name cpu-test --tiny      # CPU smoke test

Schema: docs/formats.md, "validation/microbench/NAME.json".  Extra keys
beyond the schema (documented in validation/README.md): gemm[].role,
gemm[].layout, attention[].batch_tokens, memory_bound[].shape, host_copy[].reps,
optimizer_*[].notes, launch extras, meta extras.

Method (see also meta.method in the output): device times from CUDA events
around `n_inner` back-to-back calls, after warm-up; the GPU is first held
busy with torch.cuda._sleep long enough to cover the host's launching of those
calls, so the events time the GPU's back-to-back execution, not the launch
path; median over `reps` repetitions divided by n_inner.  Inputs are random
(torch.randn / randint), never zeros.  Where one set of operands fits in L2,
calls rotate over enough copies (>= 3x the L2 size in total) so each call
reads from HBM.  Each section has a share of the wall-clock budget and skips
its remaining items once that is spent (skips are listed in meta.skipped).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
CUDA = False
DEV = "cpu"
L2_BYTES = 50e6


def sh(cmd, timeout=30):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout).stdout.strip()
    except Exception:
        return ""


def sync():
    if CUDA:
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- timing
def bench(fn, min_time=2e-3, reps=7, warmup=3, max_inner=400):
    """Median device time of one call of fn() (fn may rotate buffers itself)."""
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    t_one = time.perf_counter() - t0
    n_inner = int(min(max_inner, max(1, math.ceil(min_time / max(t_one, 1e-7)))))
    if not CUDA:
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n_inner):
                fn()
            ts.append((time.perf_counter() - t0) / n_inner)
        return statistics.median(ts)
    # host launch time of n_inner calls (GPU may still run behind)
    h0 = time.perf_counter()
    for _ in range(n_inner):
        fn()
    h_launch = time.perf_counter() - h0
    sync()
    sleep_s = min(2.0 * h_launch + 100e-6, 0.25)
    cycles = int(sleep_s * 2.0e9)
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(reps):
        torch.cuda._sleep(cycles)
        e0.record()
        for _ in range(n_inner):
            fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e-3 / n_inner)
    return statistics.median(ts)


class Budget:
    def __init__(self, total):
        self.t0 = time.time()
        self.total = total
        self.skipped = []

    def section(self, name, share):
        return Section(self, name, share)


class Section:
    def __init__(self, b, name, share):
        self.b, self.name = b, name
        self.end = min(time.time() + share * b.total, b.t0 + b.total)
        self.n_skipped = 0

    def ok(self, item=""):
        if time.time() < self.end:
            return True
        self.n_skipped += 1
        return False

    def close(self):
        if self.n_skipped:
            self.b.skipped.append(f"{self.name}: {self.n_skipped} items skipped (budget)")


def rotating(make, bytes_per_set, max_sets=64):
    n = int(min(max_sets, max(1, math.ceil(3 * L2_BYTES / max(bytes_per_set, 1)))))
    if not CUDA:
        n = 1
    return [make() for _ in range(n)]


def rnd(shape, dtype):
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return (torch.randn(shape, device=DEV) * 2).to(dtype)
    return torch.randn(shape, device=DEV, dtype=dtype)


# ----------------------------------------------------------------------------- GEMM
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}


def gemm_shapes(tiny):
    """(role, m, n, k) lists per dtype; transformer linear = x[M,K] @ W[N,K]^T."""
    if tiny:
        H = [(64, 176, 64 + 2 * 32, 256)]
        Ms = [32, 64]
    else:
        # hidden, ffn, qkv out features, vocab list
        H = [(2048, 5632, 2048 + 2 * 256, [32000]),
             (4096, 11008, 3 * 4096, [32000, 128256]),
             (5120, 13824, 3 * 5120, [32000]),
             (8192, 28672, 8192 + 2 * 1024, [128256])]
        Ms = [512, 1024, 2048, 4096, 8192, 16384]
    out = {}

    def nk(h, f, qkv, vocabs):
        v = vocabs if isinstance(vocabs, list) else [vocabs]
        lst = [("q/o", h, h), ("qkv", qkv, h), ("up", f, h), ("gate_up", 2 * f, h), ("down", h, f)]
        lst += [("lm_head", vv, h) for vv in v]
        return lst

    bf = []
    for (h, f, qkv, voc) in H:
        for role, n, k in nk(h, f, qkv, voc):
            for m in Ms:
                bf.append(("fwd:" + role, m, n, k))
    if not tiny:
        for role, n, k in [("up", 14336, 4096), ("down", 4096, 14336)]:  # llama-3-8b MLP
            for m in Ms:
                bf.append(("fwd:" + role, m, n, k))
    bwd = []
    T = [64] if tiny else [8192]
    for (h, f, qkv, voc) in H:
        for role, n, k in nk(h, f, qkv, voc):
            for t in T:
                bwd.append(("dgrad:" + role, t, k, n))  # dX[T,K] = dY[T,N] @ W[N,K]
                bwd.append(("wgrad:" + role, n, k, t))  # dW[N,K] = dY^T[N,T] @ X[T,K]
    sq = [("square", 8192, 8192, 8192)] if not tiny else [("square", 128, 128, 128)]
    red_H = H[:2]
    red_M = [2048, 8192] if not tiny else [64]
    red = []
    for (h, f, qkv, voc) in red_H:
        for role, n, k in nk(h, f, qkv, voc):
            if role in ("gate_up",):
                continue
            for m in red_M:
                red.append(("fwd:" + role, m, n, k))
    fp8_M = [1024, 4096, 16384] if not tiny else [64]
    fp8 = [("fwd:" + r, m, n, k) for (h, f, qkv, voc) in H for r, n, k in nk(h, f, qkv, voc) for m in fp8_M]
    lora = []
    for h in ([4096] if not tiny else [64]):
        for r in (8, 16, 64):
            for m in ([2048, 8192] if not tiny else [64]):
                lora.append((f"lora_a_fwd:r{r}", m, r, h))
                lora.append((f"lora_b_fwd:r{r}", m, h, r))
                lora.append((f"lora_wgrad_a:r{r}", r, h, m))
    fp16 = [s for s in bf if s[3] in (4096,) or s[2] == 4096][:0]
    fp16 = [("fwd:" + role, m, n, k) for (h, f, qkv, voc) in H[1:2] for role, n, k in nk(h, f, qkv, voc)
            for m in red_M] if not tiny else red
    return [
        ("bf16", sq + bf),
        ("fp8", sq + fp8),
        ("fp32", sq + red),
        ("tf32", sq + red),
        ("bf16", bwd),
        ("fp16", sq + fp16),
        ("bf16", lora),
    ]


def run_gemms(res, sec, tiny):
    have_fp8 = hasattr(torch, "_scaled_mm") and (not CUDA or torch.cuda.get_device_capability() >= (8, 9))
    for dtype, shapes in gemm_shapes(tiny):
        if dtype == "fp8" and not have_fp8:
            continue
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        for role, m, n, k in shapes:
            if not sec.ok():
                continue
            try:
                rec = one_gemm(dtype, role, m, n, k)
            except Exception as e:  # noqa: BLE001
                rec = {"m": m, "n": n, "k": k, "dtype": dtype, "role": role, "error": repr(e)[:200]}
            res["gemm"].append(rec)
        torch.backends.cuda.matmul.allow_tf32 = False
        if CUDA:
            torch.cuda.empty_cache()


def one_gemm(dtype, role, m, n, k):
    if dtype == "fp8":
        if m % 16 or n % 16 or k % 16:
            raise ValueError("fp8 dims must be multiples of 16")
        bytes_set = m * k + n * k + 2 * m * n
        sets = rotating(lambda: (rnd((m, k), torch.float8_e4m3fn), rnd((n, k), torch.float8_e4m3fn)), bytes_set)
        sa = torch.tensor(0.5, device=DEV)
        sb = torch.tensor(0.5, device=DEV)
        i = [0]

        def fn():
            a, w = sets[i[0] % len(sets)]
            i[0] += 1
            return torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        layout = "A[M,K] row-major e4m3, B=W[N,K]^T column-major e4m3, per-tensor scales, bf16 out"
    else:
        dt = DT[dtype]
        es = torch.empty((), dtype=dt).element_size()
        bytes_set = (m * k + n * k + m * n) * es
        if role.startswith("wgrad") or role.startswith("lora_wgrad"):
            # dW[M=N_out, N=K_in] = dY^T @ X : A is a transposed view of dY[K=T, M]
            sets = rotating(lambda: (rnd((k, m), dt), rnd((k, n), dt)), bytes_set)
            layout = "A=dY[T,Nout]^T (transposed view), B=X[T,Kin]"

            def op(a, b):
                return a.t() @ b
        elif role.startswith("dgrad"):
            sets = rotating(lambda: (rnd((m, k), dt), rnd((k, n), dt)), bytes_set)
            layout = "A=dY[T,Nout] row-major, B=W[Nout,Kin] row-major"

            def op(a, b):
                return a @ b
        else:
            sets = rotating(lambda: (rnd((m, k), dt), rnd((n, k), dt)), bytes_set)
            layout = "F.linear: A=X[M,K] row-major, W[N,K] (B = W^T)"

            def op(a, b):
                return F.linear(a, b)
        i = [0]

        def fn():
            a, b = sets[i[0] % len(sets)]
            i[0] += 1
            return op(a, b)
    flops = 2.0 * m * n * k
    big = flops > 2e12
    t = bench(fn, reps=5 if big else 7, warmup=2 if big else 3)
    del sets
    return {"m": m, "n": n, "k": k, "dtype": dtype, "time_s": t, "tflops": flops / t / 1e12,
            "role": role, "layout": layout}


# ----------------------------------------------------------------------------- attention
def run_attention(res, sec, tiny):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    combos = [(16, 16), (32, 32), (32, 8), (64, 8)] if not tiny else [(4, 4), (4, 2)]
    seqs = [1024, 2048, 4096, 8192] if not tiny else [32, 64]
    hd = 128 if not tiny else 16
    tok = 16384 if not tiny else 128
    order = [("flash", [SDPBackend.FLASH_ATTENTION]), ("cudnn", [SDPBackend.CUDNN_ATTENTION]),
             ("efficient", [SDPBackend.EFFICIENT_ATTENTION]), ("math", [SDPBackend.MATH])]
    dt = torch.bfloat16
    jobs = [(h, kv, s, None) for s in seqs for h, kv in combos]
    jobs += [(h, kv, 4096 if not tiny else 64, "cudnn") for h, kv in combos]   # cuDNN comparison
    for h, kv, s, force in jobs:
        if not sec.ok():
            continue
        b = max(1, tok // s)
        q = torch.randn(b, h, s, hd, device=DEV, dtype=dt, requires_grad=True)
        k = torch.randn(b, kv, s, hd, device=DEV, dtype=dt, requires_grad=True)
        v = torch.randn(b, kv, s, hd, device=DEV, dtype=dt, requires_grad=True)
        do = torch.randn(b, h, s, hd, device=DEV, dtype=dt)
        gqa = kv != h
        cands = [o for o in order if o[0] == force] if force else order
        rec = None
        for name, be in cands:
            try:
                with sdpa_kernel(be):
                    def fwd():
                        with torch.no_grad():
                            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

                    def fb():
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
                        o.backward(do)
                    fwd()
                    tf = bench(fwd, reps=7)
                    tfb = bench(fb, reps=7)
                fl = 4.0 * b * h * s * s * hd * 0.5
                tb = max(tfb - tf, 1e-9)
                rec = {"batch": b, "heads": h, "kv_heads": kv, "seq": s, "head_dim": hd, "dtype": "bf16",
                       "causal": True, "backend": name, "fwd_time_s": tf, "bwd_time_s": tb,
                       "fwd_tflops": fl / tf / 1e12, "bwd_tflops": 2.5 * fl / tb / 1e12,
                       "fwd_bwd_time_s": tfb, "batch_tokens": b * s}
                break
            except Exception as e:  # noqa: BLE001
                last = repr(e)[:200]
                continue
        if rec is None:
            rec = {"batch": b, "heads": h, "kv_heads": kv, "seq": s, "head_dim": hd, "dtype": "bf16",
                   "causal": True, "backend": "none", "error": last}
        res["attention"].append(rec)
        q.grad = k.grad = v.grad = None
        del q, k, v, do
    # which backend PyTorch picks by default (no sdpa_kernel context)
    try:
        q = torch.randn(2, 32, 2048 if not tiny else 32, hd, device=DEV, dtype=dt)
        k = torch.randn(2, 8, 2048 if not tiny else 32, hd, device=DEV, dtype=dt)
        ch = torch._fused_sdp_choice(q, k, k, is_causal=True, enable_gqa=True)
        res["meta"]["sdpa_default_backend_gqa"] = str(SDPBackend(ch)) if not isinstance(ch, SDPBackend) else str(ch)
        k2 = torch.randn(2, 32, 2048 if not tiny else 32, hd, device=DEV, dtype=dt)
        ch = torch._fused_sdp_choice(q, k2, k2, is_causal=True)
        res["meta"]["sdpa_default_backend_mha"] = str(SDPBackend(ch)) if not isinstance(ch, SDPBackend) else str(ch)
    except Exception as e:  # noqa: BLE001
        res["meta"]["sdpa_default_backend_error"] = repr(e)[:200]


# ----------------------------------------------------------------------------- memory bound
def rmsnorm(x, w, eps=1e-5):
    dt = x.dtype
    xf = x.to(torch.float32)
    var = xf.pow(2).mean(-1, keepdim=True)
    return w * (xf * torch.rsqrt(var + eps)).to(dt)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def run_membound(res, sec, tiny):
    sizes = [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20] if not tiny else [1 << 12, 1 << 14]
    H = 4096 if not tiny else 64
    bf, f32 = torch.bfloat16, torch.float32

    def rec(op, numel, dtype, bytes_moved, t, shape=None):
        d = {"op": op, "numel": int(numel), "dtype": dtype, "bytes_moved": int(bytes_moved),
             "time_s": t, "gbps": bytes_moved / t / 1e9}
        if shape:
            d["shape"] = list(shape)
        res["memory_bound"].append(d)

    def cyc(sets):
        i = [0]

        def nxt():
            s = sets[i[0] % len(sets)]
            i[0] += 1
            return s
        return nxt

    for n in sizes:
        # copy (bf16 and fp32), add, mul, cast
        for dname, dt in (("bf16", bf), ("fp32", f32)):
            if not sec.ok():
                continue
            es = 2 if dt == bf else 4
            sets = rotating(lambda: (rnd((n,), dt), torch.empty(n, device=DEV, dtype=dt)), 2 * n * es)
            nx = cyc(sets)
            t = bench(lambda: (lambda s: s[1].copy_(s[0]))(nx()))
            rec("copy", n, dname, 2 * n * es, t)
            del sets
        if sec.ok():
            sets = rotating(lambda: (rnd((n,), bf), rnd((n,), bf)), 3 * n * 2)
            nx = cyc(sets)
            rec("add", n, "bf16", 3 * n * 2, bench(lambda: torch.add(*nx())))
            rec("mul", n, "bf16", 3 * n * 2, bench(lambda: torch.mul(*nx())))
            del sets
        if sec.ok():
            sets = rotating(lambda: rnd((n,), f32), 6 * n)
            nx = cyc(sets)
            rec("cast_fp32_to_bf16", n, "fp32->bf16", 6 * n, bench(lambda: nx().to(bf)))
            del sets
        # rmsnorm fwd/bwd on [n/H, H], bf16 input and fp32 input (AMP residual stream)
        for dname, dt in (("bf16", bf), ("fp32", f32)):
            if not sec.ok():
                continue
            es = 2 if dt == bf else 4
            T = max(1, n // H)
            w = torch.ones(H, device=DEV, dtype=dt) + 0.01 * torch.randn(H, device=DEV, dtype=dt)
            sets = rotating(lambda: (rnd((T, H), dt).requires_grad_(True), rnd((T, H), dt)), 3 * n * es)
            nx = cyc(sets)

            def fwd():
                with torch.no_grad():
                    return rmsnorm(nx()[0], w)

            def fb():
                x, dy = nx()
                rmsnorm(x, w).backward(dy)
                x.grad = None
            tf = bench(fwd)
            tfb = bench(fb)
            rec("rmsnorm_fwd", T * H, dname, 2 * T * H * es, tf, (T, H))
            rec("rmsnorm_bwd", T * H, dname, 3 * T * H * es, max(tfb - tf, 1e-9), (T, H))
            del sets
        if sec.ok():
            sets = rotating(lambda: (rnd((n,), bf), rnd((n,), bf)), 3 * n * 2)
            nx = cyc(sets)
            rec("silu_mul", n, "bf16", 3 * n * 2, bench(lambda: (lambda g, u: F.silu(g) * u)(*nx())))
            del sets
        if sec.ok():
            D = 128 if not tiny else 16
            Hh = 32 if not tiny else 4
            S = max(1, n // (Hh * D))
            cos = torch.randn(S, D, device=DEV, dtype=bf)
            sin = torch.randn(S, D, device=DEV, dtype=bf)
            sets = rotating(lambda: rnd((1, Hh, S, D), bf), 2 * n * 2)
            nx = cyc(sets)
            rec("rope", Hh * S * D, "bf16", 2 * Hh * S * D * 2,
                bench(lambda: (lambda q: q * cos + rotate_half(q) * sin)(nx())), (1, Hh, S, D))
            del sets
        if sec.ok():
            T = max(1, n // H)
            sets = rotating(lambda: rnd((T, H), bf), 2 * n * 2)
            nx = cyc(sets)
            rec("softmax", T * H, "bf16", 2 * T * H * 2, bench(lambda: torch.softmax(nx(), dim=-1)), (T, H))
            del sets
        for V in ((32000, 128256) if not tiny else (1000,)):
            if not sec.ok():
                continue
            T = max(16, n // V)
            x = rnd((T, V), f32).requires_grad_(True)
            y = torch.randint(0, V, (T,), device=DEV)

            def cf():
                with torch.no_grad():
                    return F.cross_entropy(x, y)

            def cfb():
                F.cross_entropy(x, y).backward()
                x.grad = None
            tf = bench(cf)
            tfb = bench(cfb)
            rec("cross_entropy_fwd", T * V, "fp32", 4 * T * V, tf, (T, V))
            rec("cross_entropy_bwd", T * V, "fp32", 8 * T * V, max(tfb - tf, 1e-9), (T, V))
            del x
        if CUDA:
            torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- host copies
def run_host_copy(res, sec, tiny):
    if not CUDA:
        return
    sizes = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def ev_time(f, reps):
        f()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            e0.record()
            f()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e-3)
        return statistics.median(ts)

    def wall_time(f, reps):
        f()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f()
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    for nb in sizes:
        if not sec.ok():
            continue
        reps = 5 if nb >= (256 << 20) else 11
        dev_a = torch.empty(nb, dtype=torch.uint8, device=DEV).random_(0, 255)
        dev_b = torch.empty(nb, dtype=torch.uint8, device=DEV).random_(0, 255)
        hp_a = torch.empty(nb, dtype=torch.uint8, pin_memory=True).fill_(7)
        hp_b = torch.empty(nb, dtype=torch.uint8, pin_memory=True).fill_(7)
        hq = torch.empty(nb, dtype=torch.uint8).fill_(7)
        hq2 = torch.empty(nb, dtype=torch.uint8).fill_(7)
        out = []
        t = ev_time(lambda: dev_a.copy_(hp_a, non_blocking=True), reps)
        out.append(("h2d", True, nb, t))
        t = ev_time(lambda: hp_b.copy_(dev_b, non_blocking=True), reps)
        out.append(("d2h", True, nb, t))
        t = wall_time(lambda: dev_a.copy_(hq), reps)
        out.append(("h2d", False, nb, t))
        t = wall_time(lambda: hq2.copy_(dev_b), reps)
        out.append(("d2h", False, nb, t))

        def both():
            cur = torch.cuda.current_stream()
            s1.wait_stream(cur)
            s2.wait_stream(cur)
            with torch.cuda.stream(s1):
                dev_a.copy_(hp_a, non_blocking=True)
            with torch.cuda.stream(s2):
                hp_b.copy_(dev_b, non_blocking=True)
            cur.wait_stream(s1)
            cur.wait_stream(s2)
        t = ev_time(both, reps)
        out.append(("both", True, 2 * nb, t))
        for d, p, b, t in out:
            res["host_copy"].append({"direction": d, "pinned": p, "bytes": b, "time_s": t, "gbps": b / t / 1e9,
                                     "reps": reps, "timer": "cuda events" if p else "host wall + synchronize"})
        del dev_a, dev_b, hp_a, hp_b, hq, hq2
    # PCIe link state while a copy stream is busy
    try:
        nb = 1 << 30
        d = torch.empty(nb, dtype=torch.uint8, device=DEV)
        h = torch.empty(nb, dtype=torch.uint8, pin_memory=True)
        for _ in range(40):
            d.copy_(h, non_blocking=True)
        res["meta"]["pcie_under_load"] = sh(
            "nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.width.current --format=csv,noheader")
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        res["meta"]["pcie_under_load_error"] = repr(e)[:200]


# ----------------------------------------------------------------------------- optimizers
def llama_param_shapes(target, h=2048, f=5632, kvd=256):
    layer = [(h, h), (kvd, h), (kvd, h), (h, h), (f, h), (f, h), (h, f), (h,), (h,)]
    shapes, n = [], 0
    while n < target:
        for s in layer:
            shapes.append(s)
            n += math.prod(s)
    return shapes, n


def run_opt_gpu(res, sec, tiny):
    targets = [100e6, 500e6, 1000e6] if not tiny else [1e5]
    for tgt in targets:
        shapes, n = llama_param_shapes(tgt) if not tiny else llama_param_shapes(tgt, 64, 128, 32)
        for impl in ("foreach", "fused"):
            if not sec.ok():
                continue
            if impl == "fused" and not CUDA:
                continue
            ps = [torch.nn.Parameter(torch.randn(s, device=DEV) * 0.02) for s in shapes]
            for p in ps:
                p.grad = torch.randn_like(p) * 1e-3
            opt = torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.01, **{impl: True})
            t = bench(opt.step, reps=5, warmup=2, min_time=0)
            res["optimizer_gpu"].append({"impl": impl, "n_params": n, "n_tensors": len(ps), "time_s": t,
                                         "params_per_s": n / t, "notes": "fp32 params/grads/states, Llama-1B-like tensor list"})
            del ps, opt
            if CUDA:
                torch.cuda.empty_cache()


def run_opt_cpu(res, sec, tiny):
    nthreads = torch.get_num_threads()
    targets = [(25e6, nthreads), (200e6, nthreads), (25e6, 1)] if not tiny else [(1e5, nthreads), (1e5, 1)]
    for tgt, th in targets:
        shapes, n = llama_param_shapes(tgt) if not tiny else llama_param_shapes(tgt, 64, 128, 32)
        for impl, kw in (("torch-adamw-fused-cpu", {"fused": True}), ("foreach", {"foreach": True}),
                         ("for-loop", {"foreach": False})):
            if not sec.ok():
                continue
            if impl == "for-loop" and tgt > 50e6:
                continue
            torch.set_num_threads(th)
            try:
                ps = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in shapes]
                for p in ps:
                    p.grad = torch.randn_like(p) * 1e-3
                opt = torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.01, **kw)
                opt.step()
                ts = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    opt.step()
                    ts.append(time.perf_counter() - t0)
                t = statistics.median(ts)
                res["optimizer_cpu"].append({"impl": impl, "threads": th, "n_params": n, "n_tensors": len(ps),
                                             "time_s": t, "params_per_s": n / t,
                                             "notes": "fp32 params/grads/states on CPU, host wall time, median of 3 after 1 warm-up"})
                del ps, opt
            except Exception as e:  # noqa: BLE001
                res["optimizer_cpu"].append({"impl": impl, "threads": th, "n_params": n, "error": repr(e)[:200]})
            finally:
                torch.set_num_threads(nthreads)


# ----------------------------------------------------------------------------- launch
def run_launch(res, sec, tiny):
    x = torch.ones(1, device=DEV)
    N = 5000 if not tiny else 500
    for _ in range(200):
        x.add_(1)
    sync()
    t0 = time.perf_counter()
    for _ in range(N):
        x.add_(1)
    t_launch = (time.perf_counter() - t0) / N
    sync()
    t_total = (time.perf_counter() - t0) / N
    L = {"eager_small_op_us": t_launch * 1e6, "eager_small_op_us_incl_drain": t_total * 1e6}
    if CUDA:
        L["empty_kernel_us"] = bench(lambda: x.add_(1), min_time=5e-3, reps=7, max_inner=4000) * 1e6
        g = torch.cuda.CUDAGraph()
        K = 500
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                x.add_(1)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            for _ in range(K):
                x.add_(1)
        g.replay()
        sync()
        t = bench(g.replay, min_time=10e-3, reps=7)
        L["cuda_graph_kernel_us"] = t / K * 1e6
        # eager time per op of a tiny GPU op including host dispatch, when GPU is idle between ops
        ts = []
        for _ in range(200):
            t0 = time.perf_counter()
            x.add_(1)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        L["launch_plus_sync_roundtrip_us"] = statistics.median(ts) * 1e6
    else:
        L["empty_kernel_us"] = t_launch * 1e6
        L["cuda_graph_kernel_us"] = 0.0
    L["notes"] = ("eager_small_op_us: host time per x.add_(1) on a 1-element CUDA tensor in a loop of "
                  f"{N} (GPU not the bottleneck); empty_kernel_us: GPU time per such kernel back-to-back "
                  "(queue pre-filled behind torch.cuda._sleep, CUDA events); cuda_graph_kernel_us: replay "
                  "time of a graph of 500 such kernels / 500")
    res["launch"] = L


# ----------------------------------------------------------------------------- meta
def gather_meta(res):
    import platform
    m = res["meta"]
    q = ("name,driver_version,power.limit,power.max_limit,pcie.link.gen.current,pcie.link.gen.max,"
         "pcie.link.width.current,pcie.link.width.max,memory.total,clocks.max.sm,clocks.max.mem,vbios_version")
    line = sh(f"nvidia-smi --query-gpu={q} --format=csv,noheader")
    vals = [v.strip() for v in line.split("\n")[0].split(",")] if line else []
    keys = q.split(",")
    smi = dict(zip(keys, vals))
    cpu = sh("lscpu | grep -E 'Model name|Socket|Core|Thread|NUMA node\\(s\\)|L3' ") or platform.processor()
    model = ""
    for ln in cpu.splitlines():
        if ln.startswith("Model name"):
            model = ln.split(":", 1)[1].strip()
    m.update({
        "gpu": torch.cuda.get_device_name(0) if CUDA else "cpu",
        "driver": smi.get("driver_version", ""),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "date": _dt.date.today().isoformat(),
        "host_cpu": model,
        "host_cores": os.cpu_count(),
        "pcie": f"gen{smi.get('pcie.link.gen.max', '?')} x{smi.get('pcie.link.width.max', '?')}",
        "pcie_current_idle": f"gen{smi.get('pcie.link.gen.current', '?')} x{smi.get('pcie.link.width.current', '?')}",
        "nvidia_smi": smi,
        "lscpu": cpu,
        "host_mem_total": sh("grep MemTotal /proc/meminfo"),
        "kernel": platform.release(),
        "torch_threads": torch.get_num_threads(),
        "cudnn": str(torch.backends.cudnn.version()) if CUDA else "",
        "cublas_note": "torch.matmul / F.linear / torch._scaled_mm (cuBLAS/cuBLASLt)",
    })
    if CUDA:
        p = torch.cuda.get_device_properties(0)
        m.update({"sm_count": p.multi_processor_count, "gpu_mem_bytes": p.total_memory,
                  "l2_bytes": getattr(p, "L2_cache_size", None)})
        m["nvidia_smi_q"] = sh("nvidia-smi -q | grep -E -A3 -i 'Product Name|Power Limit|Link Width|PCIe Generation|FB Memory|Clocks$|Max Clocks|Persistence|Virtualization|Bus Id' | head -120")


def main():
    global CUDA, DEV, L2_BYTES
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--budget", type=float, default=200)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default=str(REPO / "validation" / "microbench"))
    ap.add_argument("--sections", default="meta,launch,gemm,attention,membound,host,optgpu,optcpu")
    a = ap.parse_args()
    CUDA = torch.cuda.is_available() and not a.tiny
    DEV = "cuda" if CUDA else "cpu"
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if CUDA:
        L2_BYTES = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50e6) or 50e6
    res = {"meta": {}, "gemm": [], "attention": [], "memory_bound": [], "host_copy": [],
           "optimizer_gpu": [], "optimizer_cpu": [], "launch": {}}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{a.name}.json"
    B = Budget(a.budget)
    shares = {"meta": 0.03, "launch": 0.03, "gemm": 0.36, "attention": 0.12, "membound": 0.14,
              "host": 0.1, "optgpu": 0.05, "optcpu": 0.12}
    fns = {"meta": lambda r, s, t: gather_meta(r), "launch": run_launch, "gemm": run_gemms,
           "attention": run_attention, "membound": run_membound, "host": run_host_copy,
           "optgpu": run_opt_gpu, "optcpu": run_opt_cpu}
    secs = a.sections.split(",")
    for name in secs:
        t0 = time.time()
        rem = sum(shares[n] for n in secs[secs.index(name):])
        left = B.t0 + B.total - time.time()
        share = shares[name] / rem * left / B.total if rem > 0 else shares[name]
        sec = B.section(name, share)
        try:
            fns[name](res, sec, a.tiny)
        except Exception as e:  # noqa: BLE001
            import traceback
            res["meta"].setdefault("errors", []).append(f"{name}: {traceback.format_exc()[-800:]}")
            print(f"section {name} failed: {e!r}", flush=True)
        sec.close()
        sync()
        if CUDA:
            torch.cuda.empty_cache()
        res["meta"]["skipped"] = B.skipped
        res["meta"].setdefault("section_wall_s", {})[name] = round(time.time() - t0, 1)
        res["meta"]["method"] = (
            "validation/harness/microbench.py: CUDA events around n back-to-back calls queued behind "
            "torch.cuda._sleep (so launch latency is hidden), median of 5-7 repetitions after warm-up, "
            "random non-zero data, operands rotated over >=3x L2 where one set fits in L2. GEMM tflops = "
            "2mnk/t. Attention flops (causal) fwd = 2*b*h*s^2*d, bwd = 2.5x fwd; bwd time = (fwd+bwd) - fwd. "
            "memory_bound bytes_moved = minimal bytes read+written by the op (inputs once, outputs once). "
            "Host copies: pinned with CUDA events, pageable with host wall clock + synchronize; 'both' = "
            "h2d and d2h of the given total bytes concurrently on two streams from pinned buffers. "
            "CPU AdamW: host wall clock. fp32 = allow_tf32 False, tf32 = allow_tf32 True.")
        path.write_text(json.dumps(res, indent=1))
        print(f"[{time.time()-B.t0:6.1f}s] section {name} done ({time.time()-t0:.1f}s)", flush=True)
    summarize(res)


def summarize(res):
    def best(dtype):
        xs = [g["tflops"] for g in res["gemm"] if g.get("dtype") == dtype and "tflops" in g]
        return max(xs) if xs else None
    print("SUMMARY gemm peak TFLOP/s:", {d: round(best(d) or 0, 1) for d in ("bf16", "fp16", "fp8", "tf32", "fp32")})
    cp = [m["gbps"] for m in res["memory_bound"] if m["op"] == "copy"]
    print("SUMMARY copy GB/s max:", round(max(cp), 1) if cp else None)
    for d in ("h2d", "d2h", "both"):
        for p in (True, False):
            xs = [h["gbps"] for h in res["host_copy"] if h["direction"] == d and h["pinned"] == p]
            if xs:
                print(f"SUMMARY host {d} pinned={p}: max {max(xs):.1f} GB/s")
    for o in res["optimizer_gpu"]:
        print(f"SUMMARY optgpu {o['impl']} {o['n_params']/1e6:.0f}M: {o['params_per_s']/1e9:.2f} Gparam/s")
    for o in res["optimizer_cpu"]:
        if "params_per_s" in o:
            print(f"SUMMARY optcpu {o['impl']} th={o['threads']} {o['n_params']/1e6:.0f}M: {o['params_per_s']/1e9:.3f} Gparam/s")
    print("SUMMARY launch:", {k: v for k, v in res["launch"].items() if k != "notes"})
    fa = [(a["seq"], a["heads"], a["kv_heads"], a["backend"], round(a.get("fwd_tflops", 0)), round(a.get("bwd_tflops", 0)))
          for a in res["attention"]]
    print("SUMMARY attention (seq,h,kv,backend,fwdTF,bwdTF):", fa[:6], "...")
    print("SUMMARY skipped:", res["meta"].get("skipped"), "errors:", len(res["meta"].get("errors", [])))


if __name__ == "__main__":
    main()
