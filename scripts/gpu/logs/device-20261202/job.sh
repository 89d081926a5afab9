#!/bin/bash
# One detached job for this session's device time (scripts/device/detached.py start ... -- bash this-file):
# issue 16's table from one run (ours and Unsloth), then every notebook under the T4 profile with this code,
# the longest first, 8 at a time on 2 cores each, stopped by a deadline so the last call collects every record.
# BUDGET: seconds the whole job may take (the device session's time left after the machine's start).
set -u
T0=$(date +%s)
mkdir -p /tmp/out/beyond /tmp/out/t4
python3 scripts/gpu/beyond_recipe.py --set peer --steps 8 --timeout 200 --peers unsloth --run-id beyond-20261202-peer \
    --out /tmp/out/beyond/llama-3.1-8b.jsonl > /tmp/out/beyond/main.log 2>&1
echo "beyond_recipe exit $? after $(( $(date +%s) - T0 )) s" >> /tmp/out/beyond/main.log
LEFT=$(( ${BUDGET:-1560} - ($(date +%s) - T0) ))
JOBS=07:small,07:llama-8b,08:llama-8b,08:small,06:small,06:llama-8b,05:llama-8b,05:small,03:small,04:small
JOBS=$JOBS,03:llama-8b,02:llama-8b,01:llama-8b,04:llama-8b,02:small,01:small,00:small,00:llama-8b
python3 scripts/gpu/t4_check.py --out /tmp/out/t4/t4-check.jsonl --logs /tmp/out/t4/logs --jobs $JOBS \
    --parallel 8 --cores 2 --timeout $LEFT --deadline $LEFT --home /tmp/t4home > /tmp/out/t4/main.log 2>&1
echo "t4_check exit $? after $(( $(date +%s) - T0 )) s (deadline $LEFT s)" >> /tmp/out/t4/main.log
