"""Speed of the plan search, reported as ratios measured in one run.

    python benchmarks/bench_search.py [--calibration synthetic] [--jobs 1,2] [--quick] [--time-limit 7]
    python benchmarks/bench_search.py --against /tmp/base [--cases 8,1024] [--time-limit 0]
    python benchmarks/bench_search.py --survey 3 [--time-limit 7]

--against: the issue-18 cases (exhaustive llama-70b on 8 x h100-sxm, llama-3-70b and
llama-3.1-405b on 1,024 x h100-sxm), each searched in a fresh process of this tree and of
another checkout (e.g. `git worktree add /tmp/base main`), alternating, on every core:
wall seconds, CPU seconds (the search's process and its workers: on a shared machine less
sensitive to other load than wall), peak RSS, plans and the best step time of each, and this
tree's speedup in wall and in CPU time.

For each case (llama-70b on 4 x gh200-96gb, the issue's headline; llama-3.1-405b on
1,024 x h100-sxm) it prints the candidates judged, the wall time against its budget
(10 s and 60 s on the 2-core machine), the time per candidate as a fraction of one
full simulate() of a typical plan, and the speedup of each --jobs value over one
worker. Then the parts: how much of the space the memory model prunes, what screening
costs against a full simulation, and what the per-shape cost memo saves.
"""

from __future__ import annotations

import argparse
import math
import time

from common import add_calibration_option, chosen_calibration, median_time
from ghsim.cost.calibration import load_calibration
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Plan, Recompute
from ghsim.search.core import memo_calibration, search
from ghsim.search.screen import Status, evaluate
from ghsim.search.space import DEFAULT_FRAMEWORK, DEFAULT_OPTIMIZER, default_global_batch, default_space
from ghsim.simulate import simulate

CASES = (  # model, hardware, gpus, budget (s)
    ("llama-70b", "gh200-96gb", 4, 10.0),
    ("llama-3.1-405b", "h100-sxm", 1024, 60.0),
)


def base_plan(gpus: int) -> Plan:
    return Plan(gpus=gpus, global_batch=default_global_batch(gpus), framework=DEFAULT_FRAMEWORK,
                optimizer_impl=DEFAULT_OPTIMIZER)


AGAINST_CASES = (("llama-70b", "h100-sxm", 8), ("llama-3-70b", "h100-sxm", 1024), ("llama-3.1-405b", "h100-sxm", 1024))

# run inside the child process: the tree under test is first on sys.path
_CHILD = r"""
import json, resource, sys, time
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Plan
from ghsim.search.core import default_jobs, search
from ghsim.search.space import DEFAULT_FRAMEWORK, DEFAULT_OPTIMIZER, default_global_batch, default_space
name, hw_name, gpus, limit = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
model, hw = load_model(name), load_hardware(hw_name)
base = Plan(gpus=gpus, global_batch=default_global_batch(gpus), framework=DEFAULT_FRAMEWORK,
            optimizer_impl=DEFAULT_OPTIMIZER)
t = time.perf_counter()
r = search(model, hw, base, default_space(model, hw, base), jobs=default_jobs(), time_limit=limit)
wall = time.perf_counter() - t
me, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
rss = max(me.ru_maxrss, workers.ru_maxrss)
cpu = sum(u.ru_utime + u.ru_stime for u in (me, workers))  # (the pool's workers are reaped by then)
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "rss_mb": rss / 1024, "plans": r.n_candidates,
                  "best_s": r.best.step_time_s if r.best else None}))
"""


def against(reference: str, cases: list[tuple[str, str, int]], time_limit: float) -> None:
    """Each case in a fresh process of this tree and of `reference`, alternating (see the module doc)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = str(Path(__file__).resolve().parents[1])
    print(f"{'case':<34}{'tree':>6}{'plans':>9}{'wall s':>9}{'CPU s':>8}{'RSS MB':>8}{'best s/step':>12}"
          f"{'speedup':>9}{'CPU ratio':>10}")
    for i, (name, hw_name, gpus) in enumerate(cases):
        got = {}
        trees = [("this", here), ("ref", reference)]
        for label, tree in trees if i % 2 == 0 else trees[::-1]:
            done = subprocess.run([sys.executable, "-c", _CHILD, name, hw_name, str(gpus), str(time_limit)],
                                  env={**os.environ, "PYTHONPATH": tree}, cwd=tree, capture_output=True, text=True,
                                  check=True)
            got[label] = json.loads(done.stdout.strip().splitlines()[-1])
        for label in ("ref", "this"):
            g = got[label]
            speedup = got["ref"]["wall_s"] / g["wall_s"]
            cpu = got["ref"].get("cpu_s", math.nan) / g.get("cpu_s", math.nan)  # (a reference's child may not say)
            print(f"{name + ' x' + str(gpus) + ' ' + hw_name:<34}{label:>6}{g['plans']:>9,}{g['wall_s']:>9.1f}"
                  f"{g.get('cpu_s', math.nan):>8.1f}{g['rss_mb']:>8.0f}{g['best_s'] or float('nan'):>12.3f}"
                  f"{speedup:>9.2f}{cpu:>10.2f}", flush=True)


# README's default-vs-exhaustive survey: 1-4 GPU cases and the 8+ GPU cases the 7 s default once missed
SURVEY = (("llama-2-7b", "gh200-96gb", 1), ("llama-70b", "gh200-96gb", 4), ("llama-2-13b", "h200-sxm", 8),
          ("llama-2-70b", "h200-sxm", 8), ("mixtral-8x7b", "h100-sxm", 8), ("gpt-oss-20b", "h100-sxm", 8),
          ("llama-70b", "h100-sxm", 8), ("llama-70b", "h100-sxm", 16), ("llama-3.1-405b", "h100-sxm", 1024))


def survey(time_limit: float, runs: int) -> None:
    """Each survey case searched with the default time limit (`runs` times) and exhaustively, on
    every core: does the default find the exhaustive best?"""
    from ghsim.search.core import default_jobs

    print(f"{'case':<34}{'exhaustive s':>13}{'best s/step':>12}  default runs: wall s, best s/step, same plan")
    for name, hw_name, gpus in SURVEY:
        model, hw = load_model(name), load_hardware(hw_name)
        base = base_plan(gpus)
        space = default_space(model, hw, base)
        t = time.perf_counter()
        full = search(model, hw, base, space, jobs=default_jobs())
        full_s = time.perf_counter() - t
        line = f"{name + ' x' + str(gpus) + ' ' + hw_name:<34}{full_s:>13.1f}{full.best.step_time_s:>12.3f} "
        for _ in range(runs):
            t = time.perf_counter()
            r = search(model, hw, base, space, jobs=default_jobs(), time_limit=time_limit)
            same = r.best is not None and r.best.plan == full.best.plan
            line += f" | {time.perf_counter() - t:.1f}, {r.best.step_time_s:.3f}, {'yes' if same else 'NO'}"
        print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", default=None, help="another checkout of ghsim to compare with (see above)")
    ap.add_argument("--cases", default="8,1024,1024-405b", help="with --against: which of its cases")
    add_calibration_option(ap)
    ap.add_argument("--jobs", default="1,2", help="worker counts to compare")
    ap.add_argument("--quick", action="store_true", help="the 4-GPU case only")
    ap.add_argument("--time-limit", type=float, default=0.0,
                    help="the search's time limit (ghsim plan's default is 7 s; 0: simulate every survivor)")
    ap.add_argument("--survey", type=int, default=0, metavar="RUNS",
                    help="README's survey: each case's default search (--time-limit, 7 s if 0) RUNS times "
                         "against its exhaustive search")
    args = ap.parse_args()
    if args.survey:
        survey(args.time_limit or 7.0, args.survey)
        return
    if args.against:
        keys = {"8": 0, "1024": 1, "1024-405b": 2}
        against(args.against, [AGAINST_CASES[keys[c]] for c in args.cases.split(",")], args.time_limit)
        return
    synthetic = chosen_calibration(args.calibration)
    jobs = [int(j) for j in args.jobs.split(",")]

    print(f"{'case':<34}{'jobs':>5}{'plans':>9}{'s':>7}{'/budget':>9}{'us/plan':>9}"
          f"{'plan/sim':>10}{'speedup':>9}{'simulated':>10}")
    for name, hw_name, gpus, budget in CASES[:1] if args.quick else CASES:
        model, hw = load_model(name), load_hardware(hw_name)
        cal = synthetic or load_calibration(hw.calibration)
        base = base_plan(gpus)
        space = default_space(model, hw, base)
        # one full simulate() of a plan the search reports: the unit the search is measured in
        first = search(model, hw, base, space, calibration=cal, jobs=jobs[-1], time_limit=args.time_limit)
        typical = first.best.plan if first.best else base
        sim_s = median_time(lambda: simulate(model, hw, typical, cal, keep_timeline=False), 3)[0]
        one = None
        for j in jobs:
            if args.time_limit and j != jobs[-1]:
                continue  # a time limit fixes the wall time: compare workers without one
            t = time.perf_counter()
            r = search(model, hw, base, space, calibration=cal, jobs=j, time_limit=args.time_limit)
            wall = time.perf_counter() - t
            one = one or wall
            simulated = r.count(Status.FEASIBLE) + r.count(Status.NO_FIT)
            per_plan = wall / r.n_evaluated
            print(f"{name + ' x' + str(gpus) + ' ' + hw_name:<34}{j:>5}{r.n_evaluated:>9,}{wall:>7.1f}"
                  f"{wall / budget:>9.2f}{per_plan * 1e6:>9.0f}{per_plan / sim_s:>10.4f}{one / wall:>9.2f}"
                  f"{simulated:>10,}")
        print(f"  one full simulate() of the best plan: {sim_s * 1e3:.0f} ms; "
              f"pruned by the memory model without simulating: {r.count(Status.PRUNED) / r.n_evaluated:.1%}; "
              f"rejected up front {r.count(Status.REJECTED):,}, set aside by bounds {r.count(Status.BOUNDED):,}, "
              f"same as a twin {r.count(Status.SAME):,}, unexplored (time limit) {r.count(Status.UNEXPLORED):,}; "
              f"best {first.best.step_time_s if first.best else float('nan'):.2f} s/step")

    # screening and the cost memo, on a one-GPU plan (the path that replays every micro-batch)
    model, hw = load_model("llama-2-7b"), load_hardware("gh200-96gb")
    cal = synthetic or load_calibration(hw.calibration)
    plan = base_plan(1).with_(micro_batch=2, recompute=Recompute.SELECTIVE, offload=frozenset({"optimizer", "grads"}))
    full = median_time(lambda: simulate(model, hw, plan, cal, keep_timeline=False), 3)[0]
    screen = median_time(lambda: evaluate(model, hw, plan, cal, level="screen"), 3)[0]
    memo = memo_calibration(cal)
    screen_memo = median_time(lambda: evaluate(model, hw, plan, memo, level="screen"), 3)[0]
    print(f"\nllama-2-7b, 1 GPU, {plan.grad_accum} micro-batches: full simulate {full * 1e3:.0f} ms; "
          f"screened {screen * 1e3:.0f} ms ({screen / full:.2f} of it); with the per-shape cost memo "
          f"{screen_memo * 1e3:.0f} ms ({screen_memo / screen:.2f} of unmemoized)")


if __name__ == "__main__":
    main()
