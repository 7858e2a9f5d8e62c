"""Markdown tables of the issue-15 microbenchmarks (validation/microbench/issue15/h100-microbench15.json).

    python3 validation/harness/fp8_compile/report15.py
"""
from __future__ import annotations

import json
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "microbench" / "issue15" / "h100-microbench15.json"


def backend_of(kernels):
    k = " ".join(kernels)
    if "cudnn" in k:
        return "cudnn"
    if "pytorch_flash" in k:
        return "flash"
    if "fmha_cutlass" in k or "efficient" in k or "mem_eff" in k:
        return "efficient"
    if "softmax" in k.lower():
        return "math"
    return "?"


def mm_table(m):
    out = ["| model | tokens | linear | GEMM | M x N x K | bf16 mm | fp8 tensorwise | tw fast-accum | fp8 rowwise | tw/bf16 | rw/bf16 |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in m["mm"]:
        f = lambda k: f"{r[k]:.0f}" if r.get(k) else "fail"
        out.append(f"| {r['model']} | {r['tokens']} | {r['linear']} | {r['gemm']} | {r['M']}x{r['N']}x{r['K']} | "
                   f"{f('bf16_TFLOPs')} | {f('tw_TFLOPs')} | {f('tw_fastacc_TFLOPs')} | {f('rw_TFLOPs')} | "
                   f"{r['bf16_s'] / r['tw_s']:.2f} | {r['bf16_s'] / r['rw_s']:.2f} |")
    return "\n".join(out)


def cast_table(m):
    out = ["| tensor | cast | eager us | eager kernels | compiled us | compiled kernels | eager GB/s | compiled GB/s |",
           "|---|---|---|---|---|---|---|---|"]
    rows = {}
    for r in m["cast"]:
        rows.setdefault((r["tensor"], r["cast"]), {})[r["mode"]] = r
    for (t, c), d in rows.items():
        e, k = d.get("eager", {}), d.get("compiled", {})
        out.append(f"| {t} | {c} | {e.get('time_s', 0) * 1e6:.0f} | {e.get('kernels')} | {k.get('time_s', 0) * 1e6:.0f} | "
                   f"{k.get('kernels')} | {e.get('GBps_ideal_bytes', 0):.0f} | {k.get('GBps_ideal_bytes', 0):.0f} |")
    return "\n".join(out)


def sdpa_table(m):
    out = ["| dtype | hd | kv | mask | default picks | default | flash | cudnn | efficient | math |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    rows = {}
    for r in m["sdpa"]:
        rows.setdefault((r["dtype"], r["head_dim"], r["kv"], r["mask"]), {})[r["backend"]] = r
    for (dt, hd, kv, mask), d in rows.items():
        cell = lambda b: ("–" if b not in d else ("no kernel" if d[b].get("error") else f"{d[b]['fwd_bwd_TFLOPs']:.0f}"))
        pick = backend_of(d.get("default", {}).get("kernels_fwd_bwd", []))
        out.append(f"| {dt} | {hd} | {kv} | {mask} | {pick} | {cell('default')} | {cell('flash')} | {cell('cudnn')} | "
                   f"{cell('efficient')} | {cell('math')} |")
    return "\n".join(out)


def main():
    m = json.loads(SRC.read_text())
    print(f"copy 1 GiB bf16: {m['copy_1GiB_GBps']:.0f} GB/s (read+write); bf16 mm 8192^3: {m['bf16_mm_8192_TFLOPs']:.0f} TFLOP/s\n")
    print("### torch._scaled_mm vs bf16 (TFLOP/s)\n")
    print(mm_table(m))
    print("\n### fp8 cast + amax (plain PyTorch ops, eager vs torch.compile)\n")
    print(cast_table(m))
    print("\n### SDPA forward+backward (TFLOP/s, 3.5 x forward FLOPs of the unmasked entries)\n")
    print(sdpa_table(m))


if __name__ == "__main__":
    main()
