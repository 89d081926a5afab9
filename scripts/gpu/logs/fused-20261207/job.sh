#!/bin/bash
# Issue 31, fused LoRA (Recipe(fused_lora=True), course_utils/fused_lora.py): one detached job, run from the session's
# checkout with the course's wheels (.whl, scripts/device/device_wheels.py) and Unsloth's (.whl-unsloth, peer_wheels.py)
# carried, started and collected over two or three device calls:
#     python3 scripts/device/detached.py start --name fused --dir /tmp/jobs -- bash scripts/gpu/logs/fused-20261207/job.sh
#     python3 scripts/device/detached.py wait --name fused --dir /tmp/jobs --for 560; tar czf $OUT/fused.tgz -C /tmp/out .
# In the order it runs, the most needed first:
# A: the count table at 1 x 16: ours + fused LoRA, ours, Unsloth, ours, ours + fused LoRA, each a fresh process (one run
#    id; the spread is between processes of a variant), on cores 0-11; beside it T: notebooks 09 and 10 under the T4
#    profile (t4_check.py, 2 cores each of 12-15: memory and running at all; the device time did not allow them apart);
# C: fused LoRA under the T4 profile in fp16, for memory and for running at all (--set fused-t4);
# B: 16 x 1, ours and ours + fused LoRA, Unsloth beside them (beyond_recipe.py --set fused, the 16 x 1 pair).
# STEPS and VARIANTS shorten A, NO_T4=1 leaves T out, PARTS (default "A C B") picks the parts and their order,
# OUTD=$OUT/x writes straight into a call's $OUT.
set -u
T0=$(date +%s)
OUTD=${OUTD:-/tmp/out}
mkdir -p $OUTD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > $OUTD/install.log 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/unsl-site .whl-unsloth/*.whl \
    .whl/bitsandbytes-*.whl .whl/peft-*.whl .whl/dill-*.whl .whl/multiprocess-*.whl >> $OUTD/install.log 2>&1
echo "installs done after $(( $(date +%s) - T0 )) s" >> $OUTD/install.log
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 COURSE_HOME=/tmp/ch PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; \
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; \
  python3 -c "import transformers, huggingface_hub; print('transformers', transformers.__version__, 'hub', huggingface_hub.__version__)"; \
  } >> $OUTD/install.log 2>&1 || { echo "the course's stack does not import: see install.log"; exit 1; }
DAY=$(date -u +%Y%m%d)
T4PID=  # T, from the start, beside the parts
[ -n "${NO_T4:-}" ] || { taskset -c 12-15 python3 scripts/gpu/t4_check.py --out $OUTD/t4-check.jsonl --logs $OUTD/t4logs \
    --home /tmp/t4home --jobs 09:small,10:small --parallel 2 --cores 2 --timeout 560 > $OUTD/t4check.log 2>&1 & T4PID=$!; }
partA() {
taskset -c 0-11 python3 scripts/gpu/count_launches.py --out $OUTD/counts.jsonl --tables $OUTD --run-id counts-$DAY-fused \
    --steps ${STEPS:-5} --window 2 --timeout 300 --variants ${VARIANTS:-ours-fused,ours,unsloth,ours,ours-fused} > $OUTD/counts.log 2>&1
echo "A: count_launches exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/counts.log
}
partC() {
COURSE_PROFILE=t4 COURSE_HOME=/tmp/ch-t4 taskset -c 0-11 python3 scripts/gpu/beyond_recipe.py --set fused-t4 --steps 4 --timeout 300 \
    --out $OUTD/fused-t4.jsonl --run-id fused-t4-$DAY > $OUTD/fused-t4.log 2>&1
echo "C: beyond_recipe fused-t4 exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/fused-t4.log
}
partB() {
taskset -c 0-11 python3 scripts/gpu/beyond_recipe.py --set fused --steps 6 --timeout 300 --peers unsloth --peer-batches 16x1 \
    ${B_ONLY:---only 'fast, embeddings + activations on CPU (16x1)'} \
    --only 'fast, embeddings + activations on CPU (16x1), fused LoRA' \
    --out $OUTD/fused.jsonl --run-id fused-$DAY > $OUTD/fused.log 2>&1
echo "B: beyond_recipe fused exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/fused.log
}
for part in ${PARTS:-A C B}; do part$part; done
[ -z "$T4PID" ] || { wait $T4PID; echo "T: t4_check exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/t4check.log; }
