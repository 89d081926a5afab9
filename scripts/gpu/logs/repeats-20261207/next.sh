#!/bin/bash
# Issue 31's next GPU job (not run yet; see README.md here, "the next run"), from a copy of the checkout, with .whl
# carried, over two device calls:
#     python3 scripts/device/detached.py start --name next --dir /tmp/jobs -- bash scripts/gpu/logs/repeats-20261207/next.sh
#     python3 scripts/device/detached.py wait --name next --dir /tmp/jobs --for 555; tar czf $OUT/next.tgz -C /tmp/out .
# H: the host's time per call of what remains (host_costs.py, about a minute);
# P1, P2: the planner's 16 and 8 GiB picks, alone, + fused LoRA, + reentrant checkpointing (beyond_recipe.py --set
#   picks), twice, for the spread (about 4 minutes each).
# Then, in the session: ship P1/P2 where the planner reads its speeds, let it offer what won, and run
#   python3 scripts/gpu/check_plan.py --model llama-3.1-8b --budget 16GiB --budget 8GiB --out $OUT/plan-check.jsonl
set -u
T0=$(date +%s)
OUTD=${OUTD:-/tmp/out}
mkdir -p $OUTD
rm -rf /tmp/repo && cp -r "$PWD" /tmp/repo && cd /tmp/repo
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > $OUTD/install.log 2>&1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 COURSE_HOME=/tmp/ch PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; \
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; \
  } >> $OUTD/install.log 2>&1 || { echo "the course's stack does not import: see install.log"; exit 1; }
DAY=$(date -u +%Y%m%d)
partH() { python3 scripts/gpu/host_costs.py --out $OUTD/host-costs.jsonl > $OUTD/host-costs.log 2>&1
          echo "H: exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/host-costs.log; }
partP() { python3 scripts/gpu/beyond_recipe.py --set picks --steps 6 --timeout 300 --out $OUTD/picks-$1.jsonl \
              --run-id picks$1-$DAY > $OUTD/picks-$1.log 2>&1
          echo "P$1: exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/picks-$1.log; }
partP1() { partP 1; }
partP2() { partP 2; }
for part in ${PARTS:-H P1 P2}; do part$part; done
echo "all parts done after $(( $(date +%s) - T0 )) s" >> $OUTD/install.log
