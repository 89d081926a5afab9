#!/bin/bash
# Issue 31, one detached job (scripts/device/detached.py start --name cnt -- bash scripts/gpu/logs/counts-20261203/job.sh), run
# from a copy of the perf branch's tracked files (.perfcarry/ in the session's checkout), with the course's wheels
# (../.whl) and Unsloth's (../.whl-unsloth) carried: the count table and tokens/s of our "+ Liger kernels" recipe at
# 1 x 16 without and with Recipe(lean_host=True), interleaved, and Unsloth 2026.10.9 at 1 x 16, in one run.
set -u
T0=$(date +%s)
OUTD=/tmp/out/counts
mkdir -p $OUTD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ../.whl/*.whl > $OUTD/install.log 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/unsl-site ../.whl-unsloth/*.whl \
    ../.whl/bitsandbytes-*.whl ../.whl/peft-*.whl ../.whl/dill-*.whl ../.whl/multiprocess-*.whl >> $OUTD/install.log 2>&1
echo "installs done after $(( $(date +%s) - T0 )) s" >> $OUTD/install.log
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 COURSE_HOME=/tmp/ch PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } >> $OUTD/install.log 2>&1
python3 scripts/gpu/count_launches.py --out $OUTD/counts.jsonl --tables $OUTD --run-id counts-20261203 --steps 5 \
    --window 2 --timeout 300 --variants ours,ours-lean,unsloth,ours-lean,ours > $OUTD/main.log 2>&1
echo "count_launches exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/main.log
