"""The issue-15 library cases (HF eager, torch.compile, torchao float8, peft LoRA) against ghsim: the
markdown table and speed-up ratios quoted in validation/measured_libraries/README.md.

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
# the cudagraph pool of mode="reduce-overhead" is not in torch's allocated counter: no HBM comparison
NO_HBM = ("h100-compile-reduce-overhead-",)


def results(root: Path) -> dict[str, dict]:
    out = {}
    for folder in sorted(p.parent for p in root.glob("*/case.toml")):
        if folder.name.startswith(PREFIXES):
            r = run_case(load_case(folder, DEFAULT_TOLERANCES), with_trace=False)
            out[folder.name] = {"measured": r.measured, "predicted": r.predicted, "errors": r.errors}
    return out


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
    print("| case | step s measured | predicted | error | before | HBM GiB measured | predicted | error |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in now.items():
        m, p, e = r["measured"], r["predicted"], r["errors"]
        was = f"{before[name]['errors']['step_time_rel']:+.1%}" if name in before else "–"
        hbm = "(not comparable)" if name.startswith(NO_HBM) else f"{e['peak_memory_rel']:+.1%}"
        print(f"| {name} | {m['step_time_s']:.4f} | {p['step_time_s']:.4f} | {e['step_time_rel']:+.1%} | {was} | "
              f"{m['peak_memory_bytes'] / 2**30:.2f} | {p['peak_memory_bytes'] / 2**30:.2f} | {hbm} |")
    steps = [abs(r["errors"]["step_time_rel"]) for r in now.values()]
    mems = [abs(r["errors"]["peak_memory_rel"]) for n, r in now.items() if not n.startswith(NO_HBM)]
    print(f"\n{len(now)} cases: step time median |error| {statistics.median(steps):.1%}, max {max(steps):.1%}, "
          f"within 15%: {sum(s <= 0.15 for s in steps)} of {len(steps)}; HBM median {statistics.median(mems):.1%}, "
          f"max {max(mems):.1%}, within 5%: {sum(m <= 0.05 for m in mems)} of {len(mems)}\n")
    print("| speed-up | measured | predicted | difference (points) |")
    print("|---|---|---|---|")
    for label, a, b in RATIOS:
        if a in now and b in now:
            ratio = lambda k: now[a][k]["step_time_s"] / now[b][k]["step_time_s"]
            print(f"| {label} | {ratio('measured'):.3f} | {ratio('predicted'):.3f} | "
                  f"{100 * (ratio('predicted') - ratio('measured')):+.1f} |")


if __name__ == "__main__":
    main()
