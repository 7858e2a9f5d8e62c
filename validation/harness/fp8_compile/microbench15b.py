"""Issue-15 second-round microbenchmarks (one device call): the pieces the first round's cases miss.

    python3 validation/harness/fp8_compile/microbench15b.py --out $OUT/microbench15b.json [--budget-s 420]

* sdpa_mask: F.scaled_dot_product_attention as Hugging Face calls it eager (k/v with the kv heads,
  enable_gqa, is_causal) and under torch.compile (k/v expanded to every query head, a materialised
  boolean causal mask [B, 1, S, S]), at the traced shapes: 1B (B=4, 32 heads, 8 kv, head dim 64) and
  3B (B=1 and 2, 24 heads, 8 kv, head dim 128), S=2048, bf16. Forward and forward+backward.
* f8lin: one torchao Float8Linear (tensorwise / rowwise recipe) and one plain nn.Linear (bf16 under
  autocast), fp32 master weight, forward+backward under torch.autocast(bf16), eager and torch.compile'd,
  at the HF Llama projection shapes of the 1B (8192 tokens) and 3B (2048 tokens) cases; the input is
  fp32 where the model feeds fp32 (after HF's RMSNorm: q, kv, gate_up) and bf16 otherwise (o, down).
  Time = CUDA events around the call (host gaps included); per-kernel times from torch.profiler,
  split into GEMM kernels and the rest.
* peft: one peft LoRA layer (r=16, alpha=32, dropout 0, adapters fp32 as peft keeps them) on a frozen
  bf16 nn.Linear, forward+backward under autocast with a bf16 input that requires grad, against the
  frozen base alone; kernel list (name, duration) and the bytes the forward keeps for backward.

Every time: median of `reps` CUDA-event-timed calls after warm-up, random normal inputs. The script
stops starting new rows at --budget-s and writes the JSON after every part.
"""
from __future__ import annotations

import argparse
import time
import traceback

import torch
import torch.nn.functional as F

from microbench15 import bench as _bench, run_part  # same folder (run as a script)

SHAPES = {"1b": dict(h=2048, i=8192, nh=32, kv=8, hd=64, T=8192), "3b": dict(h=3072, i=8192, nh=24, kv=8, hd=128, T=2048)}
GEMM_MARKS = ("gemm", "nvjet", "cutlass", "xmma", "scaled_mm", "sm90_")
START = time.time()


def bench(fn, reps=15, warm=4):
    """Median seconds of `reps` CUDA-event-timed calls after `warm` warm-up calls."""
    return _bench(fn, reps=reps, warm=warm)


def kernels(fn):
    """(name, seconds) of every CUDA kernel one call launches (microbench15.kernels_of gives the names only)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return [(e.name, e.device_time_total * 1e-6) for e in p.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))]


def split(ks):
    g = sum(t for n, t in ks if any(m in n for m in GEMM_MARKS) and "triton" not in n)
    return {"kernels": len(ks), "kernel_s": sum(t for _, t in ks), "gemm_kernel_s": g,
            "other_kernel_s": sum(t for _, t in ks) - g}


def linears(s):
    h, i, nh, kv, hd = s["h"], s["i"], s["nh"], s["kv"], s["hd"]
    # name: (in, out, input dtype in the full fine-tuning cases)
    return {"q": (h, nh * hd, torch.float32), "kv": (h, kv * hd, torch.float32), "o": (nh * hd, h, torch.bfloat16),
            "gate_up": (h, i, torch.float32), "down": (i, h, torch.bfloat16)}


def over_budget(a):
    return time.time() - START > a.budget_s


def sdpa_mask(a):
    rows = []
    for label, B, H, KV, D in (("1b", 4, 32, 8, 64), ("3b", 1, 24, 8, 128), ("3b", 2, 24, 8, 128)):
        S = 2048
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, KV, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, KV, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        ke = k.detach().repeat_interleave(H // KV, 1).requires_grad_()
        ve = v.detach().repeat_interleave(H // KV, 1).requires_grad_()
        mask = torch.ones(S, S, device="cuda", dtype=torch.bool).tril()[None, None].expand(B, 1, S, S).contiguous()
        go = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        calls = {"gqa_is_causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                 "expanded_bool_mask": lambda: F.scaled_dot_product_attention(q, ke, ve, attn_mask=mask),
                 "expanded_is_causal": lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True)}
        for name, call in calls.items():
            def fb(call=call):
                call().backward(go)
                for t in (q, k, v, ke, ve):
                    t.grad = None
            row = {"shape": label, "B": B, "heads": H, "kv_heads": KV, "head_dim": D, "S": S, "call": name}
            try:
                row["fwd_s"] = bench(call)
                row["fwd_bwd_s"] = bench(fb)
                row["bwd_s"] = row["fwd_bwd_s"] - row["fwd_s"]
                row["kernel_names"] = sorted({n[:120] for n, _ in kernels(fb)})[:10]
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            rows.append(row)
        del q, k, v, ke, ve, mask, go
    return rows


def f8lin(a):
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    rows = []
    for mode in ("eager", "compiled"):
        for model, s in SHAPES.items():
            T = s["T"]
            for lname, (fin, fout, xdt) in linears(s).items():
                for recipe in ("bf16", "tensorwise", "rowwise"):
                    if over_budget(a):
                        return rows
                    row = {"model": model, "linear": lname, "T": T, "in": fin, "out": fout, "x_dtype": str(xdt).split(".")[-1],
                           "recipe": recipe, "mode": mode}
                    try:
                        torch._dynamo.reset()
                        m = torch.nn.Sequential(torch.nn.Linear(fin, fout, bias=False, device="cuda"))
                        if recipe != "bf16":
                            convert_to_float8_training(m, config=Float8LinearConfig.from_recipe_name(recipe))
                        f = torch.compile(m) if mode == "compiled" else m
                        x = torch.randn(T, fin, device="cuda", dtype=xdt, requires_grad=True)
                        g = torch.randn(T, fout, device="cuda", dtype=torch.bfloat16)

                        def fb():
                            with torch.autocast("cuda", dtype=torch.bfloat16):
                                y = f(x)
                            y.backward(g)
                            x.grad = None
                            m[0].weight.grad = None
                        t0 = time.perf_counter()
                        fb()
                        torch.cuda.synchronize()
                        row["first_call_s"] = time.perf_counter() - t0
                        row["fwd_bwd_s"] = bench(fb)
                        ks = kernels(fb)
                        row.update(split(ks))
                        row["kernel_list"] = [(n[:110], round(t * 1e6, 1)) for n, t in ks]
                    except Exception as e:  # noqa: BLE001
                        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    rows.append(row)
                    print(f"f8lin {mode} {model} {lname} {recipe}: {row.get('fwd_bwd_s', 0) * 1e6:.0f} us "
                          f"gemm {row.get('gemm_kernel_s', 0) * 1e6:.0f} other {row.get('other_kernel_s', 0) * 1e6:.0f} "
                          f"k={row.get('kernels')} {row.get('error', '')[:80]}", flush=True)
    return rows


def peft_rows(a):
    from peft import LoraConfig, inject_adapter_in_model
    rows = []
    for model, s in SHAPES.items():
        T = s["T"]
        for lname, (fin, fout, _) in linears(s).items():
            for kind in ("base", "lora"):
                if over_budget(a):
                    return rows
                row = {"model": model, "linear": lname, "T": T, "in": fin, "out": fout, "kind": kind}
                try:
                    m = torch.nn.Module()
                    m.lin = torch.nn.Linear(fin, fout, bias=False, device="cuda", dtype=torch.bfloat16)
                    m.lin.weight.requires_grad_(False)
                    if kind == "lora":
                        m = inject_adapter_in_model(LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["lin"]), m)
                        for n, p in m.named_parameters():  # peft's autocast_adapter_dtype: adapters in fp32
                            if "lora_" in n:
                                p.data = p.data.float()
                        row["adapter_dtypes"] = sorted({str(p.dtype) for n, p in m.named_parameters() if p.requires_grad})
                    x = torch.randn(T, fin, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    g = torch.randn(T, fout, device="cuda", dtype=torch.bfloat16)

                    def fb():
                        with torch.autocast("cuda", dtype=torch.bfloat16):
                            y = m.lin(x)
                        y.backward(g)
                        x.grad = None
                        for p in m.parameters():
                            p.grad = None
                    row["fwd_bwd_s"] = bench(fb)
                    ks = kernels(fb)
                    row.update(split(ks))
                    row["kernel_list"] = [(n[:110], round(t * 1e6, 1)) for n, t in ks]
                    torch.cuda.synchronize()
                    before = torch.cuda.memory_allocated()
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        y = m.lin(x)
                    row["saved_bytes"] = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
                    row["out_dtype"] = str(y.dtype)
                    del y
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {traceback.format_exc()[-400:]}"
                rows.append(row)
                print(f"peft {model} {lname} {kind}: {row.get('fwd_bwd_s', 0) * 1e6:.0f} us k={row.get('kernels')} "
                      f"saved {row.get('saved_bytes', 0) / 2**20:.1f} MiB {row.get('error', '')[:80]}", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--parts", default="sdpa_mask,peft,f8lin")
    a = ap.parse_args()
    res = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
           "gpu": torch.cuda.get_device_name(0), "script": "validation/harness/fp8_compile/microbench15b.py"}
    for part, fn in (("sdpa_mask", sdpa_mask), ("peft", peft_rows), ("f8lin", f8lin)):
        if part not in a.parts.split(","):
            continue
        run_part(res, part, lambda fn=fn: fn(a), a.out)
    for r in res.get("sdpa_mask", []):
        print(f"sdpa {r['shape']} B{r['B']} {r['call']:20s} fwd {r.get('fwd_s', 0) * 1e6:7.0f} us bwd {r.get('bwd_s', 0) * 1e6:7.0f} us "
              f"{r.get('error', '')[:80]}")


if __name__ == "__main__":
    main()
