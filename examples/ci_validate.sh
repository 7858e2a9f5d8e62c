#!/usr/bin/env bash
# Story 4: CI. Fail the build when predictions drift from the measured traces beyond
# validation/tolerances.toml, and when a saved plan stops fitting or slows down.
set -euo pipefail
cd "$(dirname "$0")/.."
ghsim validate validation/          # exit 1 when a case is out of tolerance (reads every trace: ~20 s)
# the plan we run in production must still fit and stay under its step-time budget
ghsim simulate --model llama-70b --hardware gh200-96gb --plan examples/plans/llama70b-4xgh200.toml --json \
  | python -c "import json, sys; r = json.load(sys.stdin); \
assert r['fits'], r['fit_problems']; assert r['step_time_s'] < 36, r['step_time_s']; \
print(f\"plan ok: {r['step_time_s']:.1f} s/step, {r['memory']['hbm_peak_bytes'] / 1e9:.0f} GB HBM\")"
