#!/bin/bash
# Issue 31, fused LoRA (Recipe(fused_lora=True), course_utils/fused_lora.py): one job
# (OUTD=$OUT/fused bash scripts/gpu/logs/fused-20261207/job.sh, in one device call with a time limit: the session had
# 431 s of device time left), run from the session's checkout with the course's wheels (.whl) and Unsloth's
# (.whl-unsloth) carried. In the order it runs:
# A: the count table at 1 x 16, ours + fused LoRA, ours, Unsloth (one run id);
# C: fused LoRA under the T4 profile in fp16, for memory and for running at all (--set fused-t4);
# A again: ours + fused LoRA and ours, a second process each (the same run id: the spread between processes);
# B: ours and ours + fused LoRA at 1 x 16 and 16 x 1, Unsloth at 16 x 1 beside them (beyond_recipe.py --set fused).
set -u
T0=$(date +%s)
OUTD=${OUTD:-/tmp/out/fused}  # on the device: OUTD=$OUT/fused, so what is done when the call ends comes back
mkdir -p $OUTD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > $OUTD/install.log 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/unsl-site .whl-unsloth/*.whl \
    .whl/bitsandbytes-*.whl .whl/peft-*.whl .whl/dill-*.whl .whl/multiprocess-*.whl >> $OUTD/install.log 2>&1
echo "installs done after $(( $(date +%s) - T0 )) s" >> $OUTD/install.log
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 COURSE_HOME=/tmp/ch PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } >> $OUTD/install.log 2>&1
python3 scripts/gpu/count_launches.py --out $OUTD/counts.jsonl --tables $OUTD --run-id counts-20261207-fused --steps 5 \
    --window 2 --timeout 300 --variants ours-fused,ours,unsloth > $OUTD/counts.log 2>&1
echo "count_launches exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/counts.log
COURSE_PROFILE=t4 python3 scripts/gpu/beyond_recipe.py --set fused-t4 --steps 4 --timeout 300 \
    --out $OUTD/t4.jsonl --run-id fused-t4-20261207 > $OUTD/t4.log 2>&1
echo "beyond_recipe fused-t4 exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/t4.log
python3 scripts/gpu/count_launches.py --out $OUTD/counts.jsonl --tables $OUTD --run-id counts-20261207-fused --steps 5 \
    --window 2 --timeout 300 --variants ours-fused,ours >> $OUTD/counts.log 2>&1
echo "count_launches exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/counts.log
python3 scripts/gpu/beyond_recipe.py --set fused --steps 6 --timeout 300 --peers unsloth --peer-batches 16x1 \
    --out $OUTD/fused.jsonl --run-id fused-20261207 > $OUTD/fused.log 2>&1
echo "beyond_recipe fused exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/fused.log
