# Sourced at the start of every device call: install carried wheels, get DeepSpeed's CPUAdam/FusedAdam built.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/tx TORCH_CUDA_ARCH_LIST=9.0 DS_ACCELERATOR=cuda
mkdir -p /tmp/tx
if [ -f .whl/tx.tar ]; then tar -C /tmp/tx -xf .whl/tx.tar && find /tmp/tx -type f -exec touch {} +; fi
t0=$(date +%s)
python3 - <<'PY'
import time, deepspeed
from deepspeed.ops.op_builder import CPUAdamBuilder, FusedAdamBuilder
for b in (CPUAdamBuilder(), FusedAdamBuilder()):
    t = time.time(); b.load(verbose=False); print(type(b).__name__, "loaded in %.1fs" % (time.time() - t), flush=True)
PY
echo "ops ready in $(( $(date +%s) - t0 ))s"
