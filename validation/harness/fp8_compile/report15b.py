"""The figures hardware_profiles/calibration takes from the second-round microbenchmarks (issue 15):

    python validation/harness/fp8_compile/report15b.py [validation/microbench/issue15/h100-microbench15b.json]

* compiled torchao casts: total ideal bytes over total cast-kernel time of a compiled Float8Linear per
  recipe (inductor_regions.toml [fp8_cast_<recipe>]);
* eager torchao casts: the measured non-GEMM kernel time of an eager Float8Linear over ghsim's (cast ops
  plus its other non-GEMM ops) for the same shapes, summed over the 10 linears (fp8_casts.toml [eager]
  divides the first round's rates by it; run on a checkout with those rates it prints 1.139 / 1.174, with
  the divided rates about 1.0);
* SDPA with Hugging Face's compiled mask over is_causal (library_overheads.toml [pytorch_sdpa_bool_mask]);
* peft: per adapter, the kernel time and the bytes its forward keeps, beside ghsim's.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ghsim.simulate import simulate
from ghsim.validate.cases import DEFAULT_TOLERANCES, case_hardware, case_model, load_case

VALIDATION = Path(__file__).resolve().parents[2]
DATA = VALIDATION / "microbench" / "issue15" / "h100-microbench15b.json"
CAST_KERNEL_MARKS = ("amax", "abs_max", "reciprocal", "scaled_mm", "exp2")  # Inductor's cast kernels
LINEARS = {"q": "q_proj", "kv": "k_proj", "o": "o_proj", "gate_up": "gate_proj", "down": "down_proj"}
CASES = {"1b": "llama1b-mb4", "3b": "llama3b-mb1"}  # the eager float8 cases at the microbenchmark's token counts


def compiled_cast_bytes(row: dict, recipe: str) -> float:
    """Ideal bytes of a compiled Float8Linear's casts as graph/torchao_fp8.py counts them."""
    x, w, g = row["T"] * row["in"], row["in"] * row["out"], row["T"] * row["out"]
    xw = 4 if row["x_dtype"] == "float32" else 2
    if recipe == "tensorwise":  # x once (saved fp8), w twice, the gradient once into two layouts
        return x * (xw + 1) + 2 * w * 5 + g * 4
    return x * (xw + 1) + x * 3 + 2 * w * 5 + 2 * g * 3  # rowwise: x and the gradient again per column


def compiled_rates(rows: list[dict]) -> None:
    for recipe in ("tensorwise", "rowwise"):
        picked = [r for r in rows if r["mode"] == "compiled" and r["recipe"] == recipe and "error" not in r]
        nbytes = sum(compiled_cast_bytes(r, recipe) for r in picked)
        secs = sum(t for r in picked for n, t in r["kernel_list"]
                   if n.startswith("triton") and any(m in n for m in CAST_KERNEL_MARKS)) * 1e-6
        print(f"compiled {recipe}: {nbytes / 1e6:.0f} MB of cast bytes in {secs * 1e6:.0f} us of cast kernels "
              f"over {len(picked)} linears: {nbytes / secs / 1e12:.3f} TB/s")


def eager_factors(rows: list[dict]) -> None:
    for recipe in ("tensorwise", "rowwise"):
        measured = ghsim_cast = ghsim_other = 0.0
        for size, suffix in CASES.items():
            case = load_case(VALIDATION / "measured_libraries" / f"h100-ao-{recipe}-eager-{suffix}-s2048", DEFAULT_TOLERANCES)
            tl = simulate(case_model(case), case_hardware(case), case.plan).timeline
            durations = tl.schedule.end - tl.schedule.start
            for short, proj in LINEARS.items():
                row = next(r for r in rows if r["mode"] == "eager" and r["recipe"] == recipe and r["model"] == size
                           and r["linear"] == short)
                measured += row["other_kernel_s"]
                for op, layer, d in zip(tl.ops, tl.layer, durations):
                    if layer == 1 and op.name.startswith(proj) and op.category != "gemm":
                        if op.variant.startswith("fp8cast"):
                            ghsim_cast += d
                        else:
                            ghsim_other += d
        print(f"eager {recipe}: measured non-GEMM kernels {measured * 1e3:.2f} ms, ghsim casts {ghsim_cast * 1e3:.2f} ms "
              f"+ other {ghsim_other * 1e3:.2f} ms: cast factor {(measured - ghsim_other) / ghsim_cast:.3f}")


def sdpa(rows: list[dict]) -> None:
    by = {(r["shape"], r["B"], r["call"]): r for r in rows}
    for shape, b in sorted({(r["shape"], r["B"]) for r in rows}):
        base, masked = by[(shape, b, "gqa_is_causal")], by[(shape, b, "expanded_bool_mask")]
        print(f"sdpa {shape} B={b} hd={base['head_dim']}: bool mask / is_causal forward "
              f"{masked['fwd_s'] * 1e6:.1f} / {base['fwd_s'] * 1e6:.1f} us = {masked['fwd_s'] / base['fwd_s']:.2f}, "
              f"backward {masked['bwd_s'] * 1e6:.1f} / {base['bwd_s'] * 1e6:.1f} us = {masked['bwd_s'] / base['bwd_s']:.2f}")


def peft(rows: list[dict]) -> None:
    for r in rows:
        if r["kind"] == "lora":
            base = next(b for b in rows if b["kind"] == "base" and b["model"] == r["model"] and b["linear"] == r["linear"])
            print(f"peft {r['model']} {r['linear']:8s}: kernels {r['kernels']} ({r['kernel_s'] * 1e6:.0f} us; base "
                  f"{base['kernel_s'] * 1e6:.0f} us), forward keeps {r['saved_bytes'] / 2**20:.1f} MiB "
                  f"(T x in x 2 B = {r['T'] * r['in'] * 2 / 2**20:.1f} MiB)")


def main() -> None:
    data = json.loads(Path(sys.argv[1] if len(sys.argv) > 1 else DATA).read_text())
    compiled_rates(data["f8lin"])
    eager_factors(data["f8lin"])
    sdpa(data["sdpa_mask"])
    peft(data["peft"])


if __name__ == "__main__":
    main()
