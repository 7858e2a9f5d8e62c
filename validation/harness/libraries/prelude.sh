# Sourced at the start of every device call: install carried wheels, get DeepSpeed's CPUAdam/FusedAdam built.
# WHL: the carried wheels' folder (default .whl); DS_OPS: the ops to build (default "CPUAdam FusedAdam").
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${WHL:-.whl}"/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/tx TORCH_CUDA_ARCH_LIST=9.0 DS_ACCELERATOR=cuda
mkdir -p /tmp/tx
if [ -f "${WHL:-.whl}/tx.tar" ]; then tar -C /tmp/tx -xf "${WHL:-.whl}/tx.tar" && find /tmp/tx -type f -exec touch {} +; fi
t0=$(date +%s)
DS_OPS="${DS_OPS:-CPUAdam FusedAdam}" python3 - <<'PY'
import os, time, deepspeed
from deepspeed.ops import op_builder
for b in (getattr(op_builder, n + "Builder")() for n in os.environ["DS_OPS"].split()):
    t = time.time(); b.load(verbose=False); print(type(b).__name__, "loaded in %.1fs" % (time.time() - t), flush=True)
PY
echo "ops ready in $(( $(date +%s) - t0 ))s"
