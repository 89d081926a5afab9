#!/bin/bash
# Issue 31, fused LoRA (Recipe(fused_lora=True), course_utils/fused_lora.py): one job, run from the session's checkout
# with the course's wheels (.whl, scripts/device/device_wheels.py) and Unsloth's (.whl-unsloth, peer_wheels.py) carried:
#     OUTD=$OUT/fused bash scripts/gpu/logs/fused-20261207/job.sh
# It writes straight into the call's $OUT, so what is done when the call's time ends still comes back. About 17 min
# in all on the H200 of 2026-12-03 (two calls: start it with scripts/device/detached.py and OUTD on a folder that the
# second call copies, or run the parts in separate calls). In the order it runs, the most needed first:
# A: the count table at 1 x 16, ours + fused LoRA, ours, Unsloth, interleaved, one run id;
# C: fused LoRA under the T4 profile in fp16, for memory and for running at all (--set fused-t4);
# A again: a second process of each (the same run id: the spread between processes);
# B: ours and ours + fused LoRA at 1 x 16 and 16 x 1, Unsloth at 16 x 1 beside them (beyond_recipe.py --set fused).
set -u
T0=$(date +%s)
OUTD=${OUTD:-/tmp/out/fused}
mkdir -p $OUTD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > $OUTD/install.log 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/unsl-site .whl-unsloth/*.whl \
    .whl/bitsandbytes-*.whl .whl/peft-*.whl .whl/dill-*.whl .whl/multiprocess-*.whl >> $OUTD/install.log 2>&1
echo "installs done after $(( $(date +%s) - T0 )) s" >> $OUTD/install.log
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 COURSE_HOME=/tmp/ch PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; \
  python3 -c "import transformers, huggingface_hub; print('transformers', transformers.__version__, 'hub', huggingface_hub.__version__)"; \
  } >> $OUTD/install.log 2>&1 || { echo "the course's stack does not import: see install.log"; exit 1; }
RUN=counts-$(date -u +%Y%m%d)-fused
python3 scripts/gpu/count_launches.py --out $OUTD/counts.jsonl --tables $OUTD --run-id $RUN --steps 5 \
    --window 2 --timeout 300 --variants ours-fused,ours,unsloth > $OUTD/counts.log 2>&1
echo "count_launches exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/counts.log
COURSE_PROFILE=t4 python3 scripts/gpu/beyond_recipe.py --set fused-t4 --steps 4 --timeout 300 \
    --out $OUTD/t4.jsonl --run-id fused-t4-$(date -u +%Y%m%d) > $OUTD/t4.log 2>&1
echo "beyond_recipe fused-t4 exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/t4.log
python3 scripts/gpu/count_launches.py --out $OUTD/counts.jsonl --tables $OUTD --run-id $RUN --steps 5 \
    --window 2 --timeout 300 --variants ours,unsloth,ours-fused >> $OUTD/counts.log 2>&1
echo "count_launches exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/counts.log
python3 scripts/gpu/beyond_recipe.py --set fused --steps 6 --timeout 300 --peers unsloth --peer-batches 16x1 \
    --out $OUTD/fused.jsonl --run-id fused-$(date -u +%Y%m%d) > $OUTD/fused.log 2>&1
echo "beyond_recipe fused exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/fused.log
