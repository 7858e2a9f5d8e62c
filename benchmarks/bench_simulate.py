"""Speed of one simulated step, reported as ratios measured in one run.

    python benchmarks/bench_simulate.py [--calibration synthetic]

Prints, for each model, the median wall time of simulate() and its ratio to
the 50 ms budget of issue 2, and the cost per op (which should stay flat as
models grow: the simulator is linear in ops).
"""

from __future__ import annotations

import argparse

from common import add_calibration_option, chosen_calibration, median_time
from ghsim.hardware import load_hardware
from ghsim.model import load_model
from ghsim.plan import Plan, Recompute
from ghsim.simulate import simulate

BUDGET_S = 0.050


def time_simulate(model, hw, plan, cal, repeats: int = 7) -> tuple[float, int]:
    t, report = median_time(lambda: simulate(model, hw, plan, cal), repeats)
    return t, len(report.timeline.ops)


def main() -> None:
    ap = argparse.ArgumentParser()
    add_calibration_option(ap)
    args = ap.parse_args()
    cal = chosen_calibration(args.calibration)
    hw = load_hardware("h100-sxm")
    rows = []
    for name in ("llama-2-7b", "llama-2-13b", "llama-2-70b"):
        t, n_ops = time_simulate(load_model(name), hw, Plan(seq=4096, recompute=Recompute.FULL), cal)
        rows.append((name, t, n_ops))
    base_per_op = rows[0][1] / rows[0][2]
    print(f"{'model':<14}{'ops':>8}{'ms':>9}{'/ budget':>10}{'us/op':>8}{'per-op vs 7b':>14}")
    for name, t, n_ops in rows:
        print(f"{name:<14}{n_ops:>8}{t * 1e3:>9.1f}{t / BUDGET_S:>10.2f}{t / n_ops * 1e6:>8.2f}"
              f"{(t / n_ops) / base_per_op:>14.2f}")


if __name__ == "__main__":
    main()
