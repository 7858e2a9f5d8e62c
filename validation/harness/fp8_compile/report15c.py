"""Host seconds per launch of torchao's eager float8 layers against the bf16 layer on the same host
(validation/microbench/issue15/*-host15c.json, written by host15c.py).

    python validation/harness/fp8_compile/report15c.py [FILE ...]

Per decoder layer: the difference between the 8- and 2-layer tiny models (hidden 256), per phase, of host
seconds and of CUDA launch calls; their quotient is the host seconds per launch of one more layer. The
ratio of a recipe's figure to bf16's is what ghsim applies to its plain eager per-launch cost.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

DIR = Path(__file__).resolve().parents[2] / "microbench" / "issue15"
PHASES = ("fwd", "bwd")


def per_layer(rows: list[dict], hidden: int = 256) -> dict[str, dict[str, tuple[float, float]]]:
    """recipe -> phase -> (host seconds, launches) of one decoder layer: the 8- less the 2-layer model."""
    by = {(r["recipe"], r["layers"]): r for r in rows if r["hidden"] == hidden}
    out = {}
    for recipe in {k[0] for k in by}:
        lo, hi = by.get((recipe, 2)), by.get((recipe, 8))
        if lo and hi:
            n = hi["layers"] - lo["layers"]
            out[recipe] = {p: ((hi[f"{p}_host_s"] - lo[f"{p}_host_s"]) / n,
                               (hi["launches"][p] - lo["launches"][p]) / n) for p in PHASES}
    return out


def ratios(rows: list[dict]) -> dict[str, dict[str, float]]:
    """recipe -> phase -> host seconds per launch of its layer over the bf16 layer's."""
    layer = per_layer(rows)
    us = {r: {p: s / k for p, (s, k) in ph.items()} for r, ph in layer.items()}
    if "bf16" not in us:
        return {}
    return {r: {p: us[r][p] / us["bf16"][p] for p in PHASES} for r in us if r != "bf16"}


def main() -> None:
    files = [Path(f) for f in sys.argv[1:]] or sorted(DIR.glob("*-host15c*.json"))
    for f in files:
        d = json.loads(f.read_text())
        print(f"== {f.name}: {d['gpu']}, {d.get('cpu_model')}, {d['cpus']} CPUs")
        for r in d.get("real", []):
            if "error" not in r:
                print(f"  real {r['model']} mb{r['mb']} {r['recipe']:10s} host fwd {r['fwd_host_s']:.4f} s, bwd "
                      f"{r['bwd_host_s']:.4f} s, opt {r['opt_host_s']:.4f} s; step wall {r['step_wall_s']:.4f} s "
                      f"(steps {', '.join(f'{w:.3f}' for w in r['walls'])})")
        for recipe, ph in sorted(per_layer(d.get("layers", [])).items()):
            print(f"  {recipe:10s} " + "  ".join(f"{p}: {s * 1e3:6.2f} ms / {k:5.0f} launches = {s / k * 1e6:5.1f} us"
                                                 for p, (s, k) in ph.items()))
        for recipe, r in sorted(ratios(d.get("layers", [])).items()):
            print(f"  {recipe:10s} / bf16 per launch: " + ", ".join(f"{p} {v:.3f}" for p, v in r.items()))
        for row in d.get("framework_overhead", {}).get("rows", []):
            print(f"  microbench2 {row['variant']:8s} us/launch fwd {row['fwd_host_us_per_launch']:.1f} "
                  f"bwd {row['bwd_host_us_per_launch']:.1f}")
        for r in d.get("layers", []):
            host = r["fwd_host_s"] + r["bwd_host_s"] + r["opt_host_s"]
            print(f"  h{r['hidden']} L{r['layers']} {r['recipe']:10s} host fwd+bwd+opt {host * 1e3:6.1f} ms, step wall "
                  f"{r['step_wall_s'] * 1e3:6.1f} ms, back-to-back {r['back_to_back_step_s'] * 1e3:6.1f} ms, "
                  f"kernel time {r['gpu_kernel_us'] / 1e3:6.1f} ms (profiled)")
        for c in d.get("cases", []):
            print(f"  case {c.get('name', c['key'])}: {c.get('step_time_s')} s, steps {c.get('step_times_s')}")


if __name__ == "__main__":
    main()
