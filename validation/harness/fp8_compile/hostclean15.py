"""Issue 15, session 6 (call 3): torchao's eager float8 host cost per launch, timed in a process the profiler
has not touched, then again in the same process after profiling (CUPTI left attached), with a host-speed
probe every round.

    HARNESS=<repo>/validation/harness python3 hostclean15.py --out $OUT/hostclean15.json [--budget-s 140]

Why: the earlier calls (host15c.py, interleave15.py) profiled a step to count launches before timing in the
same process; Kineto leaves CUPTI attached after profiling unless TEARDOWN_CUPTI=1 (pytorch/pytorch#144455),
which adds host work to every launch. And their hosts were contended, so their per-launch ratios depend on
which statistic is taken.

* reference: microbench2's framework_overhead rows (bf16-amp, fp8) in a fresh child process first (the
  figures ghsim's calibration holds are of this microbenchmark).
* clean: interleave15.py's tiny HF Llama (hidden 256, seq 256) at 2 and 8 layers, bf16 / tensorwise / rowwise
  as one model with its nn.Linear modules swapped; 3 warm-up steps each, then rounds of one step per
  (depth, recipe) in rotated order (host15c.timed: host perf_counter per phase). No profiler in this process.
  Each round also records a host-speed probe (the best of 3 runs of a fixed pure-Python loop) and the CPU
  steal time (/proc/stat) over the round.
* cupti: one profiled step per (depth, recipe) (host15c.profile_phases: the launch counts), then more rounds
  exactly as in `clean`, now with CUPTI attached.
After its one run, its model building and result header moved into interleave15.py (tiny_models, header),
unchanged.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HARNESS = Path(os.environ.get("HARNESS", Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(HARNESS))
sys.path.insert(0, str(HARNESS / "fp8_compile"))
import host15c  # noqa: E402
import interleave15 as il  # noqa: E402

START = time.time()


def probe_s() -> float:
    """Seconds of a fixed pure-Python loop (best of 3): the host's speed for interpreter work right now."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        s = 0
        for i in range(100_000):
            s += i & 7
        best = min(best, time.perf_counter() - t0)
    return best


def cpu_jiffies() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[7] if len(v) > 7 else 0, sum(v)


def rounds(out, models, budget_s, max_reps, save):
    for rep in range(max_reps):
        if time.time() - START > budget_s:
            out["stopped"] = f"budget after {rep} rounds"
            break
        p = probe_s()
        s0, t0 = cpu_jiffies()
        rows = {}
        for layers, r in il.rotated([(L, r) for L in (2, 8) for r in il.RECIPES], rep):
            model, sets, phases = models[layers]
            il.install(model, sets[r])
            rows[f"{r}-L{layers}"] = host15c.timed(phases, 0, 1)
        s1, t1 = cpu_jiffies()
        out["rounds"].append({"t_s": time.time() - START, "probe_s": p, "steal_frac": (s1 - s0) / max(t1 - t0, 1),
                              "rows": rows})
        if rep % 10 == 0:
            save()
            print("round", rep, round(p * 1e3, 3), {k: round(v["fwd_host_s"] * 1e3, 2) for k, v in rows.items()},
                  flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=140)
    ap.add_argument("--clean-reps", type=int, default=100)
    ap.add_argument("--cupti-reps", type=int, default=50)
    a = ap.parse_args()
    res = il.header(__doc__)

    def save():
        Path(a.out).write_text(json.dumps(res, indent=1, default=str))
    code = ("import json, sys; sys.path[:0] = [%r, %r]; import host15c; r = {}; host15c.run_reference(r); "
            "print('JSON' + json.dumps(r, default=str))" % (str(HARNESS), str(HARNESS / "fp8_compile")))
    try:  # a fresh process, as the calibration's rows were measured
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        res["reference"] = json.loads(next(ln[4:] for ln in p.stdout.splitlines() if ln.startswith("JSON")))
    except Exception as e:  # noqa: BLE001
        res["reference"] = {"error": repr(e)}
    save()
    models = il.tiny_models()
    for layers, (model, sets, phases) in models.items():
        for r in il.RECIPES:
            il.install(model, sets[r])
            host15c.timed(phases, 3, 1)
    clean = res["clean"] = {"rounds": []}
    rounds(clean, models, a.budget_s * 0.62, a.clean_reps, save)
    launches = res["launches"] = {}
    for layers, (model, sets, phases) in models.items():
        for r in il.RECIPES:
            il.install(model, sets[r])
            launches[f"{r}-L{layers}"] = host15c.profile_phases(phases)["launches"]
    cupti = res["cupti"] = {"rounds": []}
    rounds(cupti, models, a.budget_s, a.cupti_reps, save)
    res["machine_end"] = il.machine()
    res["wall_s"] = time.time() - START
    save()


if __name__ == "__main__":
    main()
