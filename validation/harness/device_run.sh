#!/bin/bash
# One device call: microbenchmarks (or NCCL sweep) then the cases, within TOTAL seconds.
#   bash validation/harness/device_run.sh h100|h200|h200x2 MICROBENCH_BUDGET TOTAL_BUDGET [--tiny]
# Results land in the working tree (validation/microbench, validation/cases) and are
# packed into $OUT/results.tgz.part-* (split at 15 MB) plus $OUT/run.log.
M=$1; MB=$2; TOTAL=$3; TINY=$4
START=$(date +%s)
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out_local}; mkdir -p "$OUT" validation/cases validation/microbench
PY=${PY:-python3}
$PY -c 'import torch,os;print("torch",torch.__version__,"cuda",torch.version.cuda,"gpus",torch.cuda.device_count(),"cpus",os.cpu_count())'
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max,power.limit,memory.total --format=csv 2>/dev/null
if [ "$M" = h200x2 ]; then
  timeout $((MB+60)) $PY -m torch.distributed.run --standalone --nproc_per_node ${NPROC:-2} \
      validation/harness/nccl_bench.py --name h200-x2-nccl --budget $MB $TINY
else
  timeout $((MB+45)) $PY validation/harness/microbench.py --name $M --budget $MB $TINY
fi
NOW=$(date +%s); LEFT=$(( TOTAL - (NOW - START) ))
echo "== cases: $LEFT s left"
timeout $((LEFT+20)) $PY validation/harness/cases.py --machine $M --budget $LEFT $TINY
echo "== packing after $(( $(date +%s) - START )) s"
tar czf - validation/microbench validation/cases validation/cases-*.log 2>/dev/null | split -b 15M - "$OUT/results.tgz.part-"
ls -la "$OUT"; du -sh validation/cases
