#!/usr/bin/env bash
# Many searches at once: models x hardware x cluster sizes, on a Dask cluster
# (pip install 'ghsim[dask]'; start one with `dask scheduler` and `dask worker tcp://...`).
# Without --scheduler the searches run on this machine's cores (the default 27 searches
# take about 8 minutes on 2 cores; MODELS, HARDWARE and GPUS choose a smaller sweep).
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p out
ghsim sweep --models "${MODELS:-llama-2-7b,llama-2-13b,llama-70b}" --hardware "${HARDWARE:-gh200-96gb,h100-sxm,h200-sxm}" \
    --gpus "${GPUS:-1,4,8}" \
    ${DASK_SCHEDULER:+--scheduler "$DASK_SCHEDULER"} --out out/sweep.parquet
python -c "import pandas as pd; df = pd.read_parquet('out/sweep.parquet'); \
print(df.pivot_table(index=['model', 'gpus'], columns='hardware', values='tokens_per_s').round(0))"
