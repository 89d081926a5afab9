"""Where one optimizer step's time goes (issue 16): torch.profiler over one step of a recipe, on a GPU.

    python scripts/gpu/profile_step.py --out profile/ [--only "fast recipe (16x1)"] [--steps 3]

For each recipe of notebook 09's path (the source recipe, "+ Liger kernels" at 1x16, the fast recipe and
the fast recipe with embeddings and activations on CPU at 16x1) it builds the model and trainer as a
measurement does (course_utils.build, random-weight preset, no download), trains steps-1 optimizer steps
untouched, and profiles the last one (CPU and CUDA activity). It writes, per recipe, the profiler's table
of the 40 largest entries by self device time (<label>.txt) and one JSON line of summary (summary.jsonl):

- step_s: the profiled step's wall time (synchronized at both ends), and tokens/s from it;
- kernel_s: the sum of every CUDA kernel's and copy's self time, and gpu_busy = kernel_s / step_s (well
  under 1: the GPU waits for Python and kernel launches, so fewer, larger kernels or CUDA graphs help);
- by_kind: that device time split by what the kernels do, read from their names (KINDS: matmuls, NF4
  dequantization, attention, the loss, host/device copies, the optimizer, the rest);
- the compute limit: the FLOPs of one token (course_utils.estimate.limits.flops_per_token, the arithmetic the course
  shows: forward, backward with input gradients and the trained weights' gradients, the layers' forward again
  under checkpointing, attention) and limit_tokens_per_s at --peak-tflops (default: the GPU's datasheet dense
  bf16 peak, course_utils.machine.DATASHEET_PEAK_FLOPS; scripts/gpu/peak_matmul.py measures a real matmul rate).
These are profiled steps (the profiler adds its own overhead): compare kinds within a step, and take
speeds from scripts/gpu/beyond_recipe.py, not from here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from course_utils.chapter import beyond_the_recipe as beyond  # noqa: E402

# (kind, pattern over a lower-cased kernel or op name), first match wins
KINDS = (
    ("4-bit dequantize", r"dequant|kdequantize|nf4|bnb"),
    ("attention", r"flash|fmha|attention|sdpa|efficient_attention|cudnn.*attn"),
    ("loss", r"cross_entropy|log_softmax|nll_loss|liger|fused_linear|softmax_backward"),
    ("optimizer", r"optimizer|adam|koptimizer|_foreach"),
    ("host/device copies", r"memcpy|memset|dtoh|htod|pinned"),
    ("matmul", r"gemm|matmul|cutlass|xmma|nvjet|sm90|sm100|\bmm\b|addmm|bmm|splitk|cublas"),
)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, pattern in KINDS:
        if re.search(pattern, low):
            return kind
    return "other (elementwise, norms, casts, ...)"


def profile_one(recipe, steps: int, out: Path, peak_tflops: float) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import TrainerCallback

    from course_utils.build import build
    from course_utils.estimate import model_shapes
    from course_utils.machine import release_memory
    from course_utils.estimate.limits import flops_per_token, limit_tokens_per_s
    from course_utils.results import environment_record

    recipe = recipe.with_(steps=steps, warmup_steps=min(recipe.warmup_steps, steps - 1), label=recipe.label)
    state: dict = {}

    class Profiled(TrainerCallback):
        def on_step_begin(self, args, st, control, **kw):
            if st.global_step == steps - 1:
                torch.cuda.synchronize()
                state["prof"] = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                state["prof"].__enter__()
                state["t0"] = time.perf_counter()

        def on_step_end(self, args, st, control, **kw):
            if "prof" in state and "step_s" not in state:
                torch.cuda.synchronize()
                state["step_s"] = time.perf_counter() - state["t0"]
                state["prof"].__exit__(None, None, None)

    built = build(recipe, callbacks=(Profiled(),))
    built.trainer.train()
    prof = state["prof"]
    events = prof.key_averages()
    device_time = lambda e: getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)  # noqa: E731
    by_kind: dict[str, float] = {}
    kernel_us = 0.0
    for e in events:
        t = device_time(e)
        if t and not e.key.startswith(("aten::", "cuda", "Optimizer", "autograd::", "ProfilerStep")):
            kernel_us += t
            by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + t / 1e6
    table = events.table(sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=90)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", recipe.label).strip("_")
    (out / f"{safe}.txt").write_text(table)
    tokens = recipe.micro_batch * recipe.grad_accum * recipe.max_seq_length
    f = flops_per_token(recipe, model_shapes(recipe.model))
    flops = dict(weights=f.weights, attention=f.attention, forward=f.forward, backward=f.backward,
                 recompute=f.recompute, total=f.total)
    step_s = state["step_s"]
    summary = dict(label=recipe.label, micro_batch=recipe.micro_batch, grad_accum=recipe.grad_accum,
                   step_s=round(step_s, 3), tokens_per_s=round(tokens / step_s),
                   kernel_s=round(kernel_us / 1e6, 3), gpu_busy=round(kernel_us / 1e6 / step_s, 3),
                   by_kind={k: round(v, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
                   flops_per_token=flops, peak_tflops=peak_tflops,
                   limit_tokens_per_s=round(limit_tokens_per_s(recipe, peak_tflops * 1e12)),
                   device=torch.cuda.get_device_name(), torch=torch.__version__, env=environment_record(),
                   date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), command=" ".join(sys.argv))
    del built, prof
    release_memory()
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for the tables and summary.jsonl")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps; the last one is profiled")
    parser.add_argument("--only", action="append", default=None, help="only the recipe with this label")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the GPU's dense bf16 matmul rate for the limit (default: its datasheet's, "
                             "course_utils.machine.DATASHEET_PEAK_FLOPS; scripts/gpu/peak_matmul.py measures one)")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("profile_step.py profiles CUDA kernels: it needs a GPU", file=sys.stderr)
        return 1
    if args.peak_tflops is None:
        from course_utils.estimate.limits import datasheet_peak

        peak = datasheet_peak(torch.cuda.get_device_name(), "bf16")
        if peak is None:
            print(f"no datasheet peak for {torch.cuda.get_device_name()}: give --peak-tflops", file=sys.stderr)
            return 1
        args.peak_tflops = peak / 1e12
    path = beyond.path_from(beyond.source(args.model))
    recipes = [path[5], path[3], path[6], path[0]]  # fast (16x1), + Liger (1x16), fast + CPU (16x1), source
    if args.only:
        recipes = [r for r in recipes if r.label in args.only]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for recipe in recipes:
        s = profile_one(recipe, args.steps, out, args.peak_tflops)
        with (out / "summary.jsonl").open("a") as f:
            f.write(json.dumps(s) + "\n")
        kinds = ", ".join(f"{k} {v:.2f} s" for k, v in s["by_kind"].items())
        print(f"{s['label']}: step {s['step_s']:.2f} s ({s['tokens_per_s']:,} tokens/s profiled), kernels "
              f"{s['kernel_s']:.2f} s (GPU busy {s['gpu_busy']:.0%}); {kinds}; limit {s['limit_tokens_per_s']:,} "
              f"tokens/s at {s['flops_per_token']['total'] / 1e9:.2f} GFLOP/token", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
