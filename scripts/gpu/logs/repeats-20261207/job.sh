#!/bin/bash
# Issue 31, repeats with nothing else on the GPU: one detached job, run from a copy of the session's checkout (so
# that later edits of the checkout do not reach its child processes) with the course's wheels (.whl,
# scripts/device/device_wheels.py) and Unsloth's (.whl-unsloth, peer_wheels.py) carried, started and collected over
# several device calls:
#     python3 scripts/device/detached.py start --name rep --dir /tmp/jobs -- bash scripts/gpu/logs/repeats-20261207/job.sh
#     python3 scripts/device/detached.py wait --name rep --dir /tmp/jobs --for 555; tar czf $OUT/rep.tgz -C /tmp/out .
# In the order it runs, the most needed first:
# A: the count table at 1 x 16, each variant twice, interleaved, each a fresh process: ours ("+ Liger kernels"),
#    + fused LoRA, + fused LoRA + reentrant checkpointing, Unsloth 2026.10.9 (count_launches.py, one run id);
# B1: 16 x 1, ours and ours + fused LoRA with Unsloth, in one run (beyond_recipe.py --set fused --peers unsloth);
# C: under the T4 profile in fp16 at 1 x 16: ours, + fused LoRA, + reentrant checkpointing (--set fused-t4), for
#    memory and for running at all;
# B2: B1 again (a second run: the spread between runs at 16 x 1).
# PARTS (default "A B1 C B2", what ran on 2026-12-07) picks the parts and their order; VARIANTS and STEPS change A.
# For the next run (README.md here, "the next run"; not run yet), PARTS="H P1 P2":
# H: the host's time per call of what remains (host_costs.py, about a minute);
# P1, P2: the planner's 16 and 8 GiB picks, alone, + fused LoRA, + reentrant checkpointing (beyond_recipe.py --set
#   picks), twice, for the spread (about 4 minutes each); then, in the session, check_plan.py for any changed pick;
# T: notebooks 09 and 08 under the T4 profile (t4_check.py, two at once), run as PARTS="H P1 T P2" (run2/);
# D: the count at 1 x 16 of two changes tried on fused LoRA + reentrant checkpointing, interleaved, two processes each:
#    its dequantize through bitsandbytes' ops (as before) against its direct ctypes calls, + torch's F.rms_norm, and
#    Unsloth (count_launches.py variants -ops, -norm), run as OUTD=$OUT PARTS=D (its -norm processes ran Liger's
#    RMSNorm after all: see README.md);
# For the run after (not run yet), PARTS="H N F1 F2" (about 25 minutes, detached): H first, for its check that
# fused LoRA's direct dequantize equals the ops' in fp16 and fp32 too (fused_lora._CHECKED: bf16 only until then);
# N: the count at 1 x 16 of torch's F.rms_norm on fused LoRA + reentrant (the -norm variant, now patched when training
#    begins) against the same without it and Unsloth, three processes each, interleaved;
# F1, F2: the peer run the targets name, twice: beyond_recipe.py --set fused --peers unsloth at both settings
#    (1 x 16: + Liger, + fused LoRA, + reentrant; 16 x 1: offloading, + fused LoRA; Unsloth at each), with today's
#    direct dequantize.
# Ran as PARTS="H F1 N F2" (run3/, README.md there; F2 stopped before Unsloth's 1 x 16 process). For the next run,
# PARTS="R C F3" (about 27 minutes, detached): R the count at 1 x 16 of transformers' RoPE compiled on top of
# F.rms_norm (the -norm-rope variant) against -norm alone and Unsloth, three processes each, interleaved; C the 1 x 16
# recipes under the T4 profile in fp16 again, now with fused LoRA's direct dequantize in fp16 (checked equal to the
# ops' on the H100, never run under the T4 profile); F3 the peer run once more (a third run for the spread).
# Ran as PARTS="R C" (run4/). Then PARTS=O (run5/, about 8 minutes): the count at 16 x 1 of layer_offload.py's
# offloader (each layer's input only, pinned buffers allocated once) in place of trl's, without and with reentrant
# checkpointing, against trl's and Unsloth at 16 x 1, two processes each, interleaved. And PARTS="K O" for the next
# session (about 22 minutes): K the count at 1 x 16 of fused LoRA + reentrant with each decoder layer compiled
# (the -compiled variant, Liger off; on a CPU one graph, no break, 4,761 -> 1,957 operators a micro-batch) against
# the same uncompiled and Unsloth, three processes each, interleaved (steps 6: the first compiles).
# Run as PARTS="K2 O2 T2" (run5/, 2026-12-07 evening, to fit 30 minutes of device time): K and O with two processes
# each, O without the reentrant -pinned variant; T2 notebooks 05 and 09 under the T4 profile (the first T4 run after
# peft 0.22's keyword names and fused LoRA's direct dequantize).
# For the next session, PARTS="I J" (about 25 minutes): I the count at 1 x 16 of fused LoRA + reentrant with each
# layer's forward compiled inside its checkpoint (-compiled-inside: run 5's -compiled held the checkpoint and
# recomputed nothing, 19.1 GiB; its probe: 5.08 GiB, the host's time per layer up), that without Dynamo's guard
# checks after the first step (-noguards) and with CUDA graphs (-graphs), against the same uncompiled and Unsloth,
# two processes each, interleaved; J at 16 x 1 on the fast recipe (trl's offloader, non-reentrant): fused LoRA with
# its backward scaling as before (-latescale) and as now, and compiled inside the checkpoint, beside Unsloth, two
# processes each. Run as PARTS="J I" (J first: about 10 minutes, the 16 x 1 target).
# Too long for one session's 30 device minutes beside the T4 check it owes, so run as PARTS="I3 T3 J3" (run6/, about
# 24 minutes): I3 and J3 are I and J cut to the compiled-inside variant, the same uncompiled and Unsloth, two processes
# each (J3 keeps -latescale against the scaling as now, and runs each variant once before the repeats, so that a job
# stopped early still has each); T3 notebooks 06, 07 and 09 under the T4 profile (06 and 07 not run under it since
# peft 0.22's keyword names, 09 not since fused LoRA's backward scaling changed).
# Refused machines took 540 s of the session's device time before any start, so run as PARTS="I5 T3 J3": I5 is I3 with
# one Unsloth process, between the others. Then more refusals left 614 s: PARTS="T5 I5", T5 being T3 without 09.
# None of them ran: every start was refused (README.md, "Run 6"). For the next session, PARTS="I5 T5 J3" (about 25
# minutes), or PARTS="I3 T3 J3" with the whole budget.
# Since 2026-12-07 late, compiling inside the checkpoint is a Recipe knob (compile_layers, course_utils/
# compiled_layers.py; the -compiled-inside count variants set it), so its peer run can go first: PARTS="G C2 I5"
# (about 28 minutes): G the peer run the targets name with it (beyond_recipe.py --set compiled --peers
# unsloth: fused LoRA + reentrant at 1 x 16 and fused LoRA at 16 x 1, each as shipped (Liger), without Liger, and
# without Liger with compile_layers, Unsloth at both settings); C2 the 1 x 16 pair under the T4 profile in fp16 (--set compiled-t4), for
# memory and for running at all; I5 the launch count of the same at 1 x 16 as above.
# G and C2 ran as run 7 (run7/, README.md). Next: PARTS="I5 T5 J3" (about 25 minutes).
# Session of 2026-12-07 late: PARTS="I6 T5 J3" (about 27 minutes, detached): I6 is I5 with CUDA graphs (-graphs) and
# Dynamo's guards skipped after the first step (-noguards) in place of the repeats of the uncompiled and Unsloth, one
# process each, so that the one run tells whether either lifts compile_layers past Unsloth at 1 x 16.
# Ran as run 8 (run8/, README.md): I6 and T5 whole, J3 up to its last process. -latescale's switch is deleted since,
# so J and J3 no longer run as written; nor does D, whose -ops switch went the same way. Next: PARTS="R3 T6" (about 20 minutes): R3 the 1 x 16 peer run three times
# (beyond_recipe.py --set compiled --peers unsloth, at 1 x 16 only: Liger's recipe, compile_layers' and Unsloth, one
# process each a run, the runs back to back), the repeats that alone can say whether compile_layers meets the 1 x 16
# target; T6 notebook 09 under the T4 profile (not run under it since fused LoRA's backward scaling changed).
# Session of 2026-12-08: PARTS="R3 T7", T7 being T6 with notebooks 08 and 10 beside 09 (three at once); after refused
# starts took 631 s of the budget, PARTS="T7 R2" (R2: R3 with two runs; about 17 minutes).
set -u
T0=$(date +%s)
OUTD=${OUTD:-/tmp/out}
mkdir -p $OUTD
rm -rf /tmp/repo && cp -r "$PWD" /tmp/repo && cd /tmp/repo
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > $OUTD/install.log 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/unsl-site .whl-unsloth/*.whl \
    .whl/bitsandbytes-*.whl .whl/dill-*.whl .whl/multiprocess-*.whl >> $OUTD/install.log 2>&1  # peft: its own 0.21.2
echo "installs done after $(( $(date +%s) - T0 )) s" >> $OUTD/install.log
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 COURSE_HOME=/tmp/ch PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; git log --oneline -1 2>/dev/null; \
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; \
  python3 -c "import transformers, huggingface_hub; print('transformers', transformers.__version__, 'hub', huggingface_hub.__version__)"; \
  } >> $OUTD/install.log 2>&1 || { echo "the course's stack does not import: see install.log"; exit 1; }
DAY=$(date -u +%Y%m%d)
partA() {
python3 scripts/gpu/count_launches.py --out $OUTD/counts.jsonl --tables $OUTD --run-id counts-$DAY-repeats \
    --steps ${STEPS:-5} --window 2 --timeout 300 \
    --variants ${VARIANTS:-ours-fused-reentrant,ours-fused,ours,unsloth,ours,ours-fused,ours-fused-reentrant,unsloth} \
    > $OUTD/counts.log 2>&1
echo "A: count_launches exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/counts.log
}
partB() {  # $1: 1 or 2
python3 scripts/gpu/beyond_recipe.py --set fused --steps 6 --timeout 300 --peers unsloth --peer-batches 16x1 \
    --only 'fast, embeddings + activations on CPU (16x1)' \
    --only 'fast, embeddings + activations on CPU (16x1), fused LoRA' \
    --out $OUTD/fused-peer-$1.jsonl --run-id fused-peer$1-$DAY > $OUTD/fused-peer-$1.log 2>&1
echo "B$1: beyond_recipe fused exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/fused-peer-$1.log
}
partB1() { partB 1; }
partB2() { partB 2; }
partC() {
COURSE_PROFILE=t4 COURSE_HOME=/tmp/ch-t4 python3 scripts/gpu/beyond_recipe.py --set fused-t4 --steps 4 --timeout 300 \
    --out $OUTD/fused-t4.jsonl --run-id fused-t4-$DAY > $OUTD/fused-t4.log 2>&1
echo "C: beyond_recipe fused-t4 exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/fused-t4.log
}
partC2() {
COURSE_PROFILE=t4 COURSE_HOME=/tmp/ch-t4 python3 scripts/gpu/beyond_recipe.py --set compiled-t4 --steps 4 \
    --timeout 400 --out $OUTD/compiled-t4.jsonl --run-id compiled-t4-$DAY > $OUTD/compiled-t4.log 2>&1
echo "C2: beyond_recipe compiled-t4 exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/compiled-t4.log
}
partG() {
python3 scripts/gpu/beyond_recipe.py --set compiled --steps 8 --timeout 400 --peers unsloth \
    --out $OUTD/compiled-peer.jsonl --run-id compiled-peer-$DAY > $OUTD/compiled-peer.log 2>&1
echo "G: beyond_recipe compiled, both settings, exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/compiled-peer.log
}
partR3() {
for i in ${RUNS:-1 2 3}; do
python3 scripts/gpu/beyond_recipe.py --set compiled --steps 8 --timeout 300 --peers unsloth --peer-batches 1x16 \
    --only '+ Liger kernels, fused LoRA, reentrant ckpt' --only 'no Liger, fused LoRA, reentrant ckpt, compiled layers' \
    --out $OUTD/compiled-peer-r$i.jsonl --run-id compiled-peer-r$i-$DAY > $OUTD/compiled-peer-r$i.log 2>&1
echo "R3: run $i exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/compiled-peer-r$i.log
done
}
partH() { python3 scripts/gpu/host_costs.py --out $OUTD/host-costs.jsonl > $OUTD/host-costs.log 2>&1
          echo "H: exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/host-costs.log; }
partP() { python3 scripts/gpu/beyond_recipe.py --set picks --steps 6 --timeout 300 --out $OUTD/picks-$1.jsonl \
              --run-id picks$1-$DAY > $OUTD/picks-$1.log 2>&1
          echo "P$1: exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/picks-$1.log; }
counts() {  # one count run: $1 the part's letter, $2 the run id's end, $3 steps, $4 micro-batches profiled, $5 timeout,
            # $6 the variants, in order (VARIANTS, where set, in their place)
python3 scripts/gpu/count_launches.py --out $OUTD/counts-${1,}.jsonl --tables $OUTD --run-id counts-$DAY-$2 \
    --steps $3 --window $4 --timeout $5 --variants ${VARIANTS:-$6} > $OUTD/counts-${1,}.log 2>&1
echo "$1: exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/counts-${1,}.log
}
partD() { counts D dequant 5 2 200 ours-fused-reentrant-ops,ours-fused-reentrant,ours-fused-reentrant-norm,unsloth,unsloth,ours-fused-reentrant-norm,ours-fused-reentrant,ours-fused-reentrant-ops; }
partN() { counts N norm 5 2 200 ours-fused-reentrant-norm,ours-fused-reentrant,unsloth,unsloth,ours-fused-reentrant,ours-fused-reentrant-norm,ours-fused-reentrant-norm,unsloth,ours-fused-reentrant; }
partR() { counts R rope 5 2 200 ours-fused-reentrant-norm-rope,ours-fused-reentrant-norm,unsloth,unsloth,ours-fused-reentrant-norm,ours-fused-reentrant-norm-rope,ours-fused-reentrant-norm-rope,unsloth,ours-fused-reentrant-norm; }
partO() { counts O offload 5 1 200 fast-fused-pinned,fast-fused,fast-fused-reentrant-pinned,unsloth-16x1,unsloth-16x1,fast-fused-reentrant-pinned,fast-fused,fast-fused-pinned; }
partK() { counts K compiled 6 2 400 ours-fused-reentrant-compiled,ours-fused-reentrant,unsloth,unsloth,ours-fused-reentrant,ours-fused-reentrant-compiled,ours-fused-reentrant-compiled,unsloth,ours-fused-reentrant; }
partK2() { counts K compiled 6 2 400 ours-fused-reentrant-compiled,ours-fused-reentrant,unsloth,unsloth,ours-fused-reentrant,ours-fused-reentrant-compiled; }
partO2() { counts O offload 5 1 200 fast-fused-pinned,fast-fused,unsloth-16x1,unsloth-16x1,fast-fused,fast-fused-pinned; }
partI() { counts I inside 6 2 400 ours-fused-reentrant-compiled-inside,ours-fused-reentrant-compiled-inside-noguards,ours-fused-reentrant-compiled-inside-graphs,ours-fused-reentrant,unsloth,unsloth,ours-fused-reentrant,ours-fused-reentrant-compiled-inside-graphs,ours-fused-reentrant-compiled-inside-noguards,ours-fused-reentrant-compiled-inside; }
partJ() { counts J inside16 6 1 300 fast-fused-latescale,fast-fused,fast-fused-compiled-inside,unsloth-16x1,unsloth-16x1,fast-fused-compiled-inside,fast-fused,fast-fused-latescale; }
partI3() { counts I inside 6 2 400 ours-fused-reentrant-compiled-inside,ours-fused-reentrant,unsloth,unsloth,ours-fused-reentrant,ours-fused-reentrant-compiled-inside; }
partI5() { counts I inside 6 2 400 ours-fused-reentrant-compiled-inside,ours-fused-reentrant,unsloth,ours-fused-reentrant,ours-fused-reentrant-compiled-inside; }
partI6() { counts I inside 6 2 400 ours-fused-reentrant-compiled-inside,ours-fused-reentrant,ours-fused-reentrant-compiled-inside-graphs,unsloth,ours-fused-reentrant-compiled-inside-noguards,ours-fused-reentrant-compiled-inside; }
partJ3() { counts J inside16 6 1 300 fast-fused-compiled-inside,fast-fused,unsloth-16x1,fast-fused-latescale,fast-fused-latescale,unsloth-16x1,fast-fused,fast-fused-compiled-inside; }
partJ6() { counts J inside16-mini 5 1 200 fast-fused-compiled-inside,fast-fused; }  # what 329 s could hold
t4() {  # notebooks under the T4 profile, each its own virtual T4 on 2 cores: $1 the part's name, $2 the NN:variant
        # jobs, $3 how many at once, $4 the timeout per notebook
python3 scripts/gpu/t4_check.py --out $OUTD/t4-check.jsonl --logs $OUTD/t4-logs --jobs $2 --parallel $3 --cores 2 \
    --timeout $4 --home /tmp/t4home > $OUTD/t4.log 2>&1
echo "$1: exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/t4.log
}
partT() { t4 T 09:small,08:small 2 540; }
partT2() { t4 T2 05:small,09:small 2 540; }
partT3() { t4 T3 07:small,06:small,09:small 3 560; }
partT5() { t4 T5 07:small,06:small 2 540; }
partT6() { t4 T6 09:small 1 540; }
partR2() { RUNS="1 2" partR3; }  # R3 with two runs
partT7() { t4 T7 09:small,08:small,10:small 3 540; }  # T6 with 08 and 10 (text changed since their T4 runs)
partF() {  # $1: 1 to 4
python3 scripts/gpu/beyond_recipe.py --set fused --steps 8 --timeout 300 --peers unsloth \
    --out $OUTD/peer-$1.jsonl --run-id peer$1-$DAY > $OUTD/peer-$1.log 2>&1
echo "F$1: beyond_recipe fused, both settings, exit $? after $(( $(date +%s) - T0 )) s" >> $OUTD/peer-$1.log
}
partF1() { partF 1; }
partF2() { partF 2; }
partF3() { partF 3; }
partF4() { partF 4; }
partP1() { partP 1; }
partP2() { partP 2; }
for part in ${PARTS:-A B1 C B2}; do part$part; done
echo "all parts done after $(( $(date +%s) - T0 )) s" >> $OUTD/install.log
