# Sourced at the start of every issue-15 device call: install the carried torchao wheel, record the machine.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl15/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p $OUT
{ date -u; nvidia-smi; nvidia-smi -q -d CLOCK,PERFORMANCE,POWER | head -80; nproc; free -g;
  python3 -c "import torch, transformers, peft, triton, torchao; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'transformers', transformers.__version__, 'peft', peft.__version__, 'triton', triton.__version__, 'torchao', torchao.__version__)"; } > $OUT/env_$1.txt 2>&1
tail -1 $OUT/env_$1.txt
