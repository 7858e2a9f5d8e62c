#!/bin/bash
# As run on 2026-11-27 (issue 14, ds x2) from /work/main/.carry_ds2/, a copy of lib_step.py, batch.py and prelude.sh
# of this folder with the carried wheels in whl/ (deepspeed 0.19.8 pure-Python wheel + hjson, pydantic,
# pydantic-core cp312, annotated-types, typing-extensions, typing-inspection): `CALL_S=360 bash .carry_ds2/run.sh`
# in one nvidia-h100-x2 call (timeout 380 s; it came on 2 x H200). Results: $OUT/results_ds2.json, traces, logs.
# One device call (issue 14, ds x2): host facts, carried wheels + CPUAdam JIT build, then batch.py --set ds2
cd "$(dirname "$0")"
END=$(( $(date +%s) + ${CALL_S:-362} ))
{ date -u; nproc; lscpu; free -g; nvidia-smi; nvidia-smi topo -m; cat /proc/meminfo | head -5; } > "$OUT/host.txt" 2>&1
WHL=whl DS_OPS=CPUAdam source ./prelude.sh > "$OUT/prelude.log" 2>&1
python3 -c "import torch, deepspeed; print('torch', torch.__version__, 'threads', torch.get_num_threads(), 'deepspeed', deepspeed.__version__)" >> "$OUT/prelude.log" 2>&1
set -o pipefail
python3 batch.py --set ds2 --budget-s $(( END - $(date +%s) )) --case-timeout-s 300 2>&1 | tee "$OUT/batch.log"
