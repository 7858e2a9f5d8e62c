#!/usr/bin/env bash
# Story 1: which plan fits Llama-3-70B on four GH200 96GB superchips, and which is fastest?
# Writes the ranked table, a Pareto front of step time vs HBM, the best plan as plan.toml,
# and the best plan's timeline (open it in https://ui.perfetto.dev).
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p out
ghsim plan --model llama-70b --gpus 4 \
    --plot out/llama70b-4xgh200-front.png \
    --save-plan out/llama70b-4xgh200.toml \
    --trace out/llama70b-4xgh200-trace.json
# the same question, ranked by dollars per million tokens, as JSON for a script
ghsim plan --model llama-70b --gpus 4 --objective cost --json > out/llama70b-4xgh200-cost.json
python -c "import json; d = json.load(open('out/llama70b-4xgh200-cost.json')); \
print(f\"{d['n_evaluated']:,} plans judged, {d['n_feasible']} fit; cheapest: \
\${d['plans'][0]['usd_per_million_tokens']:.2f} per million tokens with {d['plans'][0]['flags']}\")"
# the saved plan is an ordinary plan file
ghsim simulate --model llama-70b --hardware gh200-96gb --plan out/llama70b-4xgh200.toml
