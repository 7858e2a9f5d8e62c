"""The issue-15 library cases (HF eager, torch.compile, torchao float8, peft LoRA) against ghsim: the
markdown table and speed-up ratios quoted in validation/measured_libraries/README.md. A case's other runs
(result.json other_runs: the same case measured in another device call) are listed beside it, with
ghsim's error against each; they are not the case's measurement.

    python validation/harness/fp8_compile/results_table15.py [--before BEFORE.json] [--json OUT.json] [--root DIR]

--before: a JSON this script wrote on an earlier checkout (its errors become the "before" column).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from ghsim.validate.cases import DEFAULT_TOLERANCES, load_case, run_case

ROOT = Path(__file__).resolve().parents[2] / "measured_libraries"
PREFIXES = ("h100-hf-", "h100-compile-", "h100-ao-", "h100-peft-")
# (label, case, its baseline): speed-ups the targets hold within 5 points
RATIOS = [(f"{what} {size}", f"h100-{a}-llama{size}-s2048", f"h100-{b}-llama{size}-s2048")
          for size in ("1b-mb4", "3b-mb1", "3b-mb2")
          for what, a, b in (("compiled / eager", "compile-default", "hf-eager"),
                             ("reduce-overhead / eager", "compile-reduce-overhead", "hf-eager"),
                             ("fp8 tensorwise compiled / bf16 compiled", "ao-tensorwise-compile", "compile-default"),
                             ("fp8 rowwise compiled / bf16 compiled", "ao-rowwise-compile", "compile-default"),
                             ("fp8 tensorwise eager / bf16 eager", "ao-tensorwise-eager", "hf-eager"),
                             ("fp8 rowwise eager / bf16 eager", "ao-rowwise-eager", "hf-eager"))]
# mode="reduce-overhead": replaying the CUDA graphs allocates nothing through the caching allocator (the
# graphs' tensors live in cudagraph trees' private pool, allocated while recording: "During CUDAGraph
# recording, memory is accounted for, allocated, and freed exactly as during eager run. On replay, just the
# kernels are invoked, and there are no changes to the allocator", pytorch.org/docs/stable/
# torch.compiler_cudagraph_trees.html), so a timed step's max_memory_allocated misses them; the memory the
# plan needs is the recording (warm-up) steps' peak
RECORDING_PEAK = ("h100-compile-reduce-overhead-",)


def results(root: Path) -> dict[str, dict]:
    out = {}
    for folder in sorted(p.parent for p in root.glob("*/case.toml")):
        if folder.name.startswith(PREFIXES):
            r = run_case(load_case(folder, DEFAULT_TOLERANCES), with_trace=False)
            raw = json.loads((folder / "result.json").read_text())
            measured, errors = dict(r.measured), dict(r.errors)
            if folder.name.startswith(RECORDING_PEAK):
                measured["peak_memory_bytes"] = float(raw["peak_allocated_warmup_bytes"])
                errors["peak_memory_rel"] = r.predicted["peak_memory_bytes"] / measured["peak_memory_bytes"] - 1
            out[folder.name] = {"measured": measured, "predicted": r.predicted, "errors": errors,
                                "other_runs": {o["call"]: o["step_time_s"] for o in raw.get("other_runs", [])
                                               if o.get("step_time_s")}}
    return out


def mean_run_error(r: dict) -> float:
    runs = [r["measured"]["step_time_s"], *r["other_runs"].values()]
    return r["predicted"]["step_time_s"] / statistics.mean(runs) - 1


def other_runs(r: dict) -> str:
    """Each other run of the case (its call: step time, ghsim's error against it)."""
    p = r["predicted"]["step_time_s"]
    return ", ".join(f"{call}: {t:.4f} ({p / t - 1:+.1%})" for call, t in r.get("other_runs", {}).items()) or "–"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before")
    ap.add_argument("--json")
    ap.add_argument("--root", default=str(ROOT), help="the case folders (default: this checkout's)")
    args = ap.parse_args()
    now = results(Path(args.root))
    if args.json:
        Path(args.json).write_text(json.dumps(now, indent=1))
    before = json.loads(Path(args.before).read_text()) if args.before else {}
    print("| case | step s measured | predicted | error | before | HBM GiB measured | predicted | error | other runs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in now.items():
        m, p, e = r["measured"], r["predicted"], r["errors"]
        was = f"{before[name]['errors']['step_time_rel']:+.1%}" if name in before else "–"
        hbm = f"{e['peak_memory_rel']:+.1%}" + (" (recording)" if name.startswith(RECORDING_PEAK) else "")
        print(f"| {name} | {m['step_time_s']:.4f} | {p['step_time_s']:.4f} | {e['step_time_rel']:+.1%} | {was} | "
              f"{m['peak_memory_bytes'] / 2**30:.2f} | {p['peak_memory_bytes'] / 2**30:.2f} | {hbm} | {other_runs(r)} |")
    steps = [abs(r["errors"]["step_time_rel"]) for r in now.values()]
    mems = [abs(r["errors"]["peak_memory_rel"]) for r in now.values()]
    print(f"\n{len(now)} cases: step time median |error| {statistics.median(steps):.1%}, max {max(steps):.1%}, "
          f"within 15%: {sum(s <= 0.15 for s in steps)} of {len(steps)}; HBM median {statistics.median(mems):.1%}, "
          f"max {max(mems):.1%}, within 5%: {sum(m <= 0.05 for m in mems)} of {len(mems)}")
    rerun = {n: r for n, r in now.items() if r.get("other_runs")}
    if rerun:  # the cases measured more than once: ghsim against the mean of their runs
        print(f"the {len(rerun)} cases with other runs, against the mean of all their runs: "
              + ", ".join(f"{n.removeprefix('h100-')} {mean_run_error(r):+.1%}" for n, r in rerun.items()))
    print()
    print("| speed-up | measured | predicted | difference (points) | other runs (both cases in one call) |")
    print("|---|---|---|---|---|")
    for label, a, b in RATIOS:
        if a in now and b in now:
            ratio = lambda k: now[a][k]["step_time_s"] / now[b][k]["step_time_s"]
            predicted = ratio("predicted")
            runs_a, runs_b = now[a].get("other_runs", {}), now[b].get("other_runs", {})
            again = ", ".join(f"{c}: {runs_a[c] / runs_b[c]:.3f} ({100 * (predicted - runs_a[c] / runs_b[c]):+.1f})"
                              for c in runs_a if c in runs_b) or "–"
            print(f"| {label} | {ratio('measured'):.3f} | {predicted:.3f} | "
                  f"{100 * (predicted - ratio('measured')):+.1f} | {again} |")


if __name__ == "__main__":
    main()
