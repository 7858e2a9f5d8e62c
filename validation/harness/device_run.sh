#!/bin/bash
# One device call: microbenchmarks (or an NCCL sweep) then the cases, within TOTAL seconds.
#   bash validation/harness/device_run.sh MACHINE MICROBENCH_BUDGET TOTAL_BUDGET [--tiny]
# MACHINE (a list in harness/cases.py):
#   h100 | h200           single-GPU microbenchmarks + cases
#   h200x2                NCCL all-reduce/all-gather/reduce-scatter + peer copy sweep, DDP/FSDP cases
#   h200x2-par            NCCL all-to-all + send/recv sweep, TP/PP/EP cases on 2 GPUs
#   h200x4 | h200x8       full NCCL sweep (all five collectives, 1 MB - 4 GB) + issue 7's 4-/8-GPU cases
# Results are written under $RES/validation/ (default RES=/tmp/ghsim_results; only new files)
# and packed into $OUT/results.tgz (parts of 15 MB if larger: results.tgz.part-*) plus $OUT/run.log;
# unpack at the repository root: tar xzf results.tgz (or cat results.tgz.part-* | tar xzf -).
# ONLY=name1,name2 runs only those cases of the list (e.g. the rest of a list in a second call;
# MICROBENCH_BUDGET 0 skips the microbenchmarks / NCCL sweep altogether).
M=$1; MB=$2; TOTAL=$3; TINY=$4
START=$(date +%s)
export PYTHONUNBUFFERED=1
# NVLink multicast off (the lent multi-GPU machines require it; see validation/README.md)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out_local}; RES=${RES:-/tmp/ghsim_results}
V=$RES/validation; mkdir -p "$OUT" "$V/cases" "$V/microbench"
PY=${PY:-python3}
exec > >(tee -a "$OUT/run.log") 2>&1
$PY -c 'import torch,os;print("torch",torch.__version__,"cuda",torch.version.cuda,"gpus",torch.cuda.device_count(),"cpus",os.cpu_count())'
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max,power.limit,memory.total --format=csv 2>/dev/null
nvidia-smi topo -m 2>/dev/null
ALLOPS=all_reduce,all_gather,reduce_scatter,all_to_all,sendrecv,peer_copy
nccl() {  # nprocs name ops
  timeout $((MB+60)) $PY -m torch.distributed.run --standalone --nproc_per_node $1 \
      validation/harness/nccl_bench.py --name $2 --ops $3 --budget $MB --out "$V/microbench" $TINY
}
[ "$MB" -gt 0 ] && case $M in
  h200x2)     nccl 2 h200-x2-nccl all_reduce,all_gather,reduce_scatter,peer_copy ;;
  h200x2-par) nccl 2 h200-x2-nccl-a2a all_to_all,sendrecv ;;
  h200x4)     nccl 4 h200-x4-nccl $ALLOPS ;;
  h200x8)     nccl 8 h200-x8-nccl $ALLOPS ;;
  *)          timeout $((MB+45)) $PY validation/harness/microbench.py --name $M --budget $MB --out "$V/microbench" $TINY ;;
esac
NOW=$(date +%s); LEFT=$(( TOTAL - (NOW - START) ))
echo "== cases: $LEFT s left"
timeout $((LEFT+20)) $PY validation/harness/cases.py --machine $M --budget $LEFT --out "$V/cases" ${ONLY:+--only $ONLY} $TINY
echo "== packing after $(( $(date +%s) - START )) s"
tar czf "$OUT/results.tgz" -C "$RES" validation
if [ $(stat -c %s "$OUT/results.tgz") -gt 15000000 ]; then
  split -b 15M "$OUT/results.tgz" "$OUT/results.tgz.part-" && rm "$OUT/results.tgz"
fi
ls -la "$OUT"; du -sh "$V"/cases/* 2>/dev/null
echo "== done after $(( $(date +%s) - START )) s"
