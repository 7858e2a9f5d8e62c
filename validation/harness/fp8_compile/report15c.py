"""Host seconds per launch of torchao's eager float8 layers against the bf16 layer on the same host
(validation/microbench/issue15/*-host15c.json, written by host15c.py; *-interleave15-*.json, written by
interleave15.py: the same tiny models in interleaved rounds, and the eager float8 cases against bf16).

    python validation/harness/fp8_compile/report15c.py [FILE ...]

Per decoder layer: the difference between the 8- and 2-layer tiny models (hidden 256), per phase, of host
seconds and of CUDA launch calls; their quotient is the host seconds per launch of one more layer. The
ratio of a recipe's figure to bf16's is what ghsim applies to its plain eager per-launch cost.
"""
from __future__ import annotations

import json
import random
import statistics
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


def lower_quartile(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=4, method="inclusive")[0]


def fifth_percentile(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20, method="inclusive")[0]


def step_rows(launches: dict[str, dict], rounds: list[dict], stat=statistics.median) -> list[dict]:
    """Rounds of interleaved steps as host15c rows: per (recipe, depth) `stat` (median, lower_quartile, min) of
    the host seconds per phase over every step of `rounds`, with `launches` (key -> phase -> launch calls)."""
    rows = []
    for key, count in launches.items():
        recipe, depth = key.rsplit("-L", 1)
        samples = [s for rd in rounds for s in rd["rows"][key].get("samples", [
            (rd["rows"][key]["fwd_host_s"], rd["rows"][key]["bwd_host_s"], rd["rows"][key]["opt_host_s"])])]
        rows.append({"recipe": recipe, "layers": int(depth), "hidden": 256, "launches": count,
                     **{f"{p}_host_s": stat([s[i] for s in samples]) for i, p in enumerate(PHASES)}})
    return rows


def interleaved_rows(d: dict, rounds: list[dict], stat=statistics.median) -> list[dict]:
    """interleave15.py's host rounds as host15c rows (launches of each model's profiled step)."""
    return step_rows({k: v["launches"] for k, v in d["host"]["launches"].items()}, rounds, stat)


def interleaved_ratios(d: dict, stat=statistics.median, groups: int = 4) -> tuple[dict, list[dict]]:
    """The float8 / bf16 ratios per launch over all rounds, and over `groups` consecutive groups of rounds
    (their spread; a call of fewer rounds than groups: each round alone)."""
    rounds = d["host"]["rounds"]
    n = len(rounds) // groups if len(rounds) >= 2 * groups else 1
    parts = [rounds[i:i + n] for i in range(0, len(rounds) - n + 1, n)]
    return ratios(interleaved_rows(d, rounds, stat)), [ratios(interleaved_rows(d, p, stat)) for p in parts]


def case_ratios(d: dict) -> dict[str, dict[str, list[float]]]:
    """size -> recipe -> the float8 step over the bf16 step of the same round, per round."""
    out = {}
    for size, c in d.get("cases", {}).items():
        for rd in c.get("rounds", []):
            b = rd["blocks"]
            for r in ("tensorwise", "rowwise"):
                out.setdefault(size, {}).setdefault(r, []).append(b[r]["step_s"] / b["bf16"]["step_s"])
    return out


def report_interleaved(d: dict) -> None:
    for label, stat in (("median", statistics.median), ("lower quartile", lower_quartile), ("minimum", min)):
        if stat is not statistics.median and "samples" not in d["host"]["rounds"][0]["rows"]["bf16-L2"]:
            continue  # call 1 kept one median per round: no quantile of its steps
        for recipe, ph in sorted(per_layer(interleaved_rows(d, d["host"]["rounds"], stat)).items()):
            print(f"  {label:14s} {recipe:10s} " + "  ".join(
                f"{p}: {s * 1e3:6.2f} ms / {k:5.0f} launches = {s / k * 1e6:5.1f} us" for p, (s, k) in ph.items()))
        allr, parts = interleaved_ratios(d, stat)
        for recipe in ("tensorwise", "rowwise"):
            spread = {p: (min(x[recipe][p] for x in parts), max(x[recipe][p] for x in parts)) for p in PHASES}
            print(f"  {label:14s} {recipe:10s} / bf16 per launch, all rounds: " + ", ".join(
                f"{p} {allr[recipe][p]:.3f} (groups {spread[p][0]:.3f}-{spread[p][1]:.3f})" for p in PHASES))
    for size, by in case_ratios(d).items():
        c = d["cases"][size]
        steps = {r: statistics.median(rd["blocks"][r]["step_s"] for rd in c["rounds"]) for r in c["rounds"][0]["blocks"]}
        print(f"  case {size}: median step " + ", ".join(f"{r} {t:.4f} s" for r, t in steps.items()) + "; ratio per round "
              + "; ".join(f"{r} median {statistics.median(v):.3f}, {min(v):.3f}-{max(v):.3f} "
                          f"({100 * (max(v) - min(v)):.0f} points)" for r, v in by.items()))
    for c in d.get("fresh", {}).get("cases", []):
        print(f"  fresh {c.get('name', c['key'])}: {c.get('step_time_s')} s")


def report_clean(d: dict) -> None:
    """hostclean15.py: `clean` rounds (no profiler in the process, as in training) and `cupti` rounds (after one
    profiled step per model). The minimum over the rounds is each model's uncontended step (the host ran at
    two speeds, so the time contention adds is never negative); the 5th percentile and median beside it."""
    for row in d.get("reference", {}).get("framework_overhead", {}).get("rows", []):
        print(f"  microbench2 (fresh process) {row['variant']:8s} us/launch fwd {row['fwd_host_us_per_launch']:.1f} "
              f"bwd {row['bwd_host_us_per_launch']:.1f}")
    for part in ("clean", "cupti"):
        rounds = d[part]["rounds"]
        probe = [r["probe_s"] * 1e3 for r in rounds]
        print(f"  {part}: {len(rounds)} rounds, probe {min(probe):.1f}-{max(probe):.1f} ms (median "
              f"{statistics.median(probe):.1f}), steal <= {max(r['steal_frac'] for r in rounds):.4f}")
        for label, stat in (("minimum", min), ("5th percentile", fifth_percentile), ("median", statistics.median)):
            rows = step_rows(d["launches"], rounds, stat)
            us = {r: "  ".join(f"{p} {s / k * 1e6:5.1f} us" for p, (s, k) in ph.items())
                  for r, ph in per_layer(rows).items()}
            print(f"    {label:14s} per launch: " + "; ".join(f"{r} {v}" for r, v in sorted(us.items())))
            print(f"    {label:14s} / bf16: " + "; ".join(
                f"{r} " + " / ".join(f"{v:.3f}" for v in rr.values()) for r, rr in sorted(ratios(rows).items())))
        print("    minimum / bf16, 10th-90th percentile of 2000 resamples of the rounds: " + "; ".join(
            f"{r} " + " / ".join(f"{lo:.3f}-{hi:.3f}" for lo, hi in ph.values()) for r, ph in bootstrap(d, rounds).items()))


def bootstrap(d: dict, rounds: list[dict], n: int = 2000, seed: int = 0) -> dict[str, dict[str, tuple[float, float]]]:
    """recipe -> phase -> (10th, 90th percentile) of the minimum-based ratio over resampled rounds."""
    rng = random.Random(seed)
    draws: dict[str, dict[str, list[float]]] = {}
    for _ in range(n):
        for r, ph in ratios(step_rows(d["launches"], rng.choices(rounds, k=len(rounds)), min)).items():
            for p, v in ph.items():
                draws.setdefault(r, {}).setdefault(p, []).append(v)
    return {r: {p: tuple(statistics.quantiles(v, n=10)[i] for i in (0, 8)) for p, v in ph.items()}
            for r, ph in sorted(draws.items())}


def main() -> None:
    files = [Path(f) for f in sys.argv[1:]] or (sorted(DIR.glob("*-host15c*.json")) + sorted(DIR.glob("*-interleave15-*.json"))
                                                + sorted(DIR.glob("*-hostclean15.json")))
    for f in files:
        d = json.loads(f.read_text())
        if "clean" in d:
            print(f"== {f.name}: {d['gpu']}, {d['cpus']} CPUs, no profiler then CUPTI, started "
                  f"{d['machine_start']['date'].strip()}")
            report_clean(d)
            continue
        if "host" in d:
            print(f"== {f.name}: {d['gpu']}, {d['cpus']} CPUs, interleaved, started {d['machine_start']['date'].strip()}")
            report_interleaved(d)
            continue
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
