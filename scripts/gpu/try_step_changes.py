"""Issue 16 candidates, measured one at a time beside the recipe they change, on a GPU (an experiment, not a
reference run): each variant trains in a fresh process, the way course_utils.measure does (measure.run_here:
warm-up, tracked step, median of the timed steps), and prints one JSON line.

    python scripts/gpu/try_step_changes.py --out tries.jsonl [--steps 6] [--only NAME] [--run-id NAME] [--rounds 2]
    python scripts/gpu/try_step_changes.py --model tiny --steps 4 --out tries.jsonl   # on a CPU: a smoke test

Variants (on the random-weight Llama-3.1-8B, sequence 512, 16 x 512 tokens per optimizer step; `--only` takes the
names, the script lists them when one is unknown):
- "1x16 Liger": notebook 09's "+ Liger kernels" recipe (1x16), as shipped; "16x1 offload": its fast recipe with
  embeddings and activations on CPU (16x1). They are the baselines course_utils.tries compares the others with.
- ", compiled layers": each decoder layer compiled with torch.compile (regional compilation: one graph, shared by
  the layers), checkpointing around the compiled layer as before; ", CUDA graphs": compiled with
  mode="reduce-overhead" (each layer's kernels replayed as CUDA graphs: the 1x16 step is bound by the host launching
  kernels, scripts/gpu/logs/profile-20261201);
- ", no Liger": the same without Liger's kernels, which torch.compile cannot enter (Liger 0.8.5 calls its RoPE
  through a torch.compiler.disable'd dispatch(): on the H200 a compiled layer with Liger broke there and made no
  graph), so that torch.compile fuses RMSNorm, SwiGLU and RoPE itself;
- ", every 2nd layer checkpointed": checkpointing that recomputes less (transformers 5's every_n_layers=2: half
  the decoder layers keep their activations instead of recomputing them);
- ", dropout 0": lora_dropout=0 (peft then runs no dropout kernels and keeps no dropped-out copies): other
  training than the source recipe's and the peer's (0.05).
Compilation time falls in the warm-up step, which is not timed. Each RESULT line also counts what torch.compile did
(torch._dynamo's counters: frames compiled, graphs, graph breaks, recompiles). One lease is one --run-id: give every
invocation of a device call (or of back-to-back calls) the same one, since tries compares only within a run.

Checked on a CPU (2026-12-02, torch 2.13, bitsandbytes 0.50.2, peft 0.21.2, transformers 5.24.0) with the tiny model,
`--model tiny`, which runs the same variants as notebook 09's CPU recipes with the CUDA-only changes (Liger, activation
offloading) off: each compiled decoder layer is one graph with no graph break (the checkpoint is captured as
torch's tag_activation_checkpoint, bitsandbytes' 4-bit matmuls as its custom ops inside), one graph shared by every
layer, no recompiles over the steps, the losses those of the uncompiled run. On the H200 (2026-12-02,
course_utils/reference/beyond/tries/): Liger inside a compiled layer (no graph), CUDA graphs (failed in the backward
pass), trl's activation offloading around compiled layers (ran: one graph, no break).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def variants(steps: int, model: str = "llama-3.1-8b") -> dict:
    """The variants by name: on a GPU on `model` as notebook 09's GPU path builds it; on a CPU (a smoke test of the
    same code, e.g. --model tiny) notebook 09's CPU recipes, Liger and activation offloading off (CUDA only)."""
    from course_utils.chapter import beyond_the_recipe as beyond
    from course_utils.machine import device_type

    if device_type() == "cuda":
        path = beyond.path_from(beyond.source(model, steps))
    else:
        path = [r.with_(liger_kernels=False, offload_activations=False, steps=steps, label=r.label)
                for r in beyond.path_here(model)]
    plain, liger, low = path[2], path[3], path[-1]  # "+ embeddings on CPU", "+ Liger kernels", fast + offload
    # Liger 0.8.5 calls its RoPE kernel through a torch.compiler.disable'd dispatch(): a compiled layer with Liger
    # breaks there and torch.compile made no graph of it (on the H200, 2026-12-02). The "no Liger" variants leave
    # Liger out and let torch.compile fuse RMSNorm, SwiGLU and RoPE itself.
    low_plain = low.with_(liger_kernels=False)
    quiet, low_quiet = liger.with_(lora_dropout=0.0), low.with_(lora_dropout=0.0)
    return {  # name: (recipe, what is done to the built model: None, or a CHANGES key); the peer trains at the
        # recipe's own lora_dropout (0.05), so only the variants that keep it are the same training as the peer's
        "1x16 Liger": (liger, None),
        "1x16 Liger, compiled layers": (liger, "compiled"),
        "1x16 Liger, compiled layers, CUDA graphs": (liger, "cuda graphs"),
        "1x16 Liger, every 2nd layer checkpointed": (liger, "every 2nd"),
        "1x16 compiled layers, no Liger": (plain, "compiled"),
        "1x16 compiled layers, CUDA graphs, no Liger": (plain, "cuda graphs"),
        "1x16 Liger, dropout 0": (quiet, None),
        "1x16 Liger, dropout 0, compiled layers": (quiet, "compiled"),
        "1x16 Liger, dropout 0, compiled layers, CUDA graphs": (quiet, "cuda graphs"),
        "16x1 offload": (low, None),
        "16x1 offload, compiled layers": (low, "compiled"),
        "16x1 offload, every 2nd layer checkpointed": (low, "every 2nd"),
        "16x1 offload, compiled layers, no Liger": (low_plain, "compiled"),
        "16x1 offload, dropout 0": (low_quiet, None),
        "16x1 offload, dropout 0, compiled layers": (low_quiet, "compiled"),
        "16x1 offload, dropout 0, every 2nd layer checkpointed": (low_quiet, "every 2nd"),
    }


def compile_layers(built, mode: str | None = None) -> None:
    """torch.compile every decoder layer (one compiled graph, reused: the layers share their code). mode
    "reduce-overhead" also replays each layer's kernels as a CUDA graph (one launch instead of hundreds: the 1 x 16
    step is bound by the host launching kernels, scripts/gpu/logs/profile-20261201)."""
    from course_utils.compiled_layers import allow_a_compile_per_layer, decoder_layers

    allow_a_compile_per_layer()
    layers = decoder_layers(built.trainer.model)
    for layer in layers:
        layer.compile(**({"mode": mode} if mode else {}))
    print(f"compiled {len(layers)} decoder layers{f' ({mode})' if mode else ''}", flush=True)


def checkpoint_every(built, n: int = 2) -> None:
    """Checkpointing that recomputes less: only every n-th decoder layer is checkpointed, the others keep their
    activations (transformers 5's activation_checkpointing_kwargs every_n_layers, which Trainer.train passes to
    activation_checkpointing_enable; setting the layers' flags here would be undone there)."""
    args = built.trainer.args
    args.activation_checkpointing_kwargs = {**(args.activation_checkpointing_kwargs or {}), "every_n_layers": n}
    print(f"checkpointing every {n} decoder layers", flush=True)


CHANGES = {"compiled": compile_layers, "cuda graphs": lambda built: compile_layers(built, "reduce-overhead"),
           "every 2nd": checkpoint_every}


def compile_counts() -> dict:
    """What torch.compile did in this process (torch._dynamo's counters): frames, graphs, graph breaks, recompiles."""
    from torch._dynamo.utils import counters

    breaks = counters.get("graph_break", {})
    return dict(frames=counters.get("frames", {}).get("total", 0), frames_ok=counters.get("frames", {}).get("ok", 0),
                graphs=counters.get("stats", {}).get("unique_graphs", 0), graph_breaks=sum(breaks.values()),
                break_reasons=sorted(breaks)[:10], recompiles=sum(counters.get("recompiles", {}).values()))


def child(name: str, steps: int, model: str = "llama-3.1-8b", run_id: str = "") -> None:
    from course_utils.child import run_here

    recipe, change = variants(steps, model)[name]
    compiled = change in ("compiled", "cuda graphs")
    t0 = time.perf_counter()
    m = run_here(recipe, on_built=CHANGES[change] if change else None)
    print("RESULT " + json.dumps(dict(run=run_id, variant=name, status=m.status, error=m.error[:300],
                                      allocated_gib=round((m.cuda_max_allocated or 0) / 2**30, 2),
                                      reserved_gib=round((m.cuda_max_reserved or 0) / 2**30, 2),
                                      tracked_peak_mib=round((m.peak_bytes or 0) / 2**20, 1),
                                      activations_mib=round(m.peak_by_category.get("activations", 0) / 2**20, 1),
                                      tokens_per_s=m.tokens_per_s, losses=[round(x, 4) for x in m.losses],
                                      timing=m.timing, wall_s=round(time.perf_counter() - t0, 1),
                                      compile=compile_counts() if compiled else None,
                                      recipe=recipe.to_dict(), env=m.env, date=m.date, command=m.command)), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--model", default="llama-3.1-8b", help="on a CPU: tiny (a smoke test of the same code)")
    ap.add_argument("--only", action="append")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--run-id", help="names this lease in every line (course_utils.tries compares a variant only with "
                    "its baseline of the same run: give every invocation in one lease the same id); default: "
                    "tries-<UTC date and time> of this invocation")
    ap.add_argument("--rounds", type=int, default=1, help="run the variants this many times, interleaved (A B A B): "
                    "a 1x16 step moves by about a tenth between processes, and course_utils.tries takes the median")
    ap.add_argument("--child")
    a = ap.parse_args()
    run_id = a.run_id or time.strftime("tries-%Y%m%d-%H%M", time.gmtime())
    if a.child:
        child(a.child, a.steps, a.model, run_id)
        return 0
    from course_utils.results import environment_record

    every = variants(a.steps, a.model)
    names = a.only or list(every)
    unknown = [n for n in names if n not in every]
    if unknown:
        ap.error(f"no variant {unknown}; there are: {list(every)}")
    for name in [n for _ in range(max(1, a.rounds)) for n in names]:
        cmd = [sys.executable, __file__, "--child", name, "--steps", str(a.steps), "--model", a.model, "--out", a.out,
               "--run-id", run_id]
        failed = dict(run=run_id, variant=name, recipe=every[name][0].to_dict(), env=environment_record(),  # what it ran, where
                      date=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), command=" ".join(cmd[1:]))
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            lines = [ln[7:] for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            line = lines[-1] if lines else json.dumps(dict(failed, status="failed",
                                                          error=(done.stdout + done.stderr)[-1500:]))
        except subprocess.TimeoutExpired:
            line = json.dumps(dict(failed, status="timeout", error=f"over {a.timeout} s"))
        with open(a.out, "a") as f:
            f.write(line + "\n")
        d = json.loads(line)
        print(f"{name:42} {d['status']:8} {d.get('allocated_gib', '-')!s:>6} GiB {d.get('tokens_per_s')!s:>9} tok/s "
              f"losses {d.get('losses', [])} {d.get('error', '')[:300]}"
              + (f" compile {d['compile']}" if d.get("compile") else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
