"""Speed of this tree against another checkout of ghsim, as ratios measured in one run.

    git worktree add /tmp/ghsim-ref <commit>
    python benchmarks/bench_against.py /tmp/ghsim-ref [--rounds 3]

A refactor must not slow the simulator or the search. Each round times, in a fresh
process per tree (its own ghsim on PYTHONPATH), the snapshot's simulate calls
(benchmarks/behaviour_snapshot.py, median of repeats each) and the README's exhaustive
plan search on one worker; the trees alternate within a round so that load on a shared
machine falls on both. Prints each tree's times and this tree's ratio to the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

# run inside the child process: the tree under test is first on sys.path
_CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1] + "/benchmarks")
from click.testing import CliRunner
from behaviour_snapshot import PLAN, SIMULATE
from ghsim.cli import main

def run(args):
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    return r.exit_code

out = {}
sims = []
for name, flags in SIMULATE.items():
    args = ["simulate", *flags.split(), "--json"]
    run(args)  # warm: loads and caches profiles and calibration
    times = []
    for _ in range(5):
        t = time.perf_counter(); run(args); times.append(time.perf_counter() - t)
    sims.append(statistics.median(times))
out["simulate_total_s"] = sum(sims)
t = time.perf_counter()
run(["plan", *PLAN.split(), "--json"])
out["plan_s"] = time.perf_counter() - t
print(json.dumps(out))
"""


def _time_tree(tree: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(HERE)], env=env, cwd=tree,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference", type=Path, help="another checkout of ghsim (e.g. a git worktree)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"this": [], "reference": []}
    for r in range(args.rounds):
        order = [("this", HERE), ("reference", args.reference)]
        for label, tree in (order if r % 2 == 0 else order[::-1]):
            runs[label].append(_time_tree(tree))
    print(f"{'measure':<22}{'this s':>10}{'reference s':>13}{'ratio':>8}")
    for key in ("simulate_total_s", "plan_s"):
        a = statistics.median(x[key] for x in runs["this"])
        b = statistics.median(x[key] for x in runs["reference"])
        print(f"{key:<22}{a:>10.3f}{b:>13.3f}{a / b:>8.2f}")
    print(f"(median of {args.rounds} rounds; simulate_total_s sums the median of 5 calls of each of the "
          "snapshot's simulate questions; plan_s is the README's exhaustive search on one worker)")


if __name__ == "__main__":
    main()
