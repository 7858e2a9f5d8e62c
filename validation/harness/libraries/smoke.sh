set -x
source validation/harness/libraries/prelude.sh
tar -C /tmp/tx -cf $OUT/tx.tar .
nproc; python3 -c "import torch,os;print(torch.__version__, torch.get_num_threads(), os.cpu_count(), len(os.sched_getaffinity(0)))"
grep -o 'avx512[a-z_]*\|amx[a-z_]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo; grep -m1 'model name' /proc/cpuinfo; free -g; ulimit -l
python3 -m pip show transformers accelerate peft 2>/dev/null | grep -E '^(Name|Version)'
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
python3 validation/harness/libraries/batch.py --tiny --set smoke --budget-s 240 --case-timeout-s 120
