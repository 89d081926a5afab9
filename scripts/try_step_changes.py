"""Issue 16 candidates, measured one at a time beside the recipe they change, on a GPU (an experiment, not a
reference run): each variant trains in a fresh process, the way course_utils.measure does (measure.run_here:
warm-up, tracked step, median of the timed steps), and prints one JSON line.

    python scripts/try_step_changes.py --out tries.jsonl [--steps 6] [--only NAME]

Variants (on the random-weight Llama-3.1-8B, sequence 512, 16 x 512 tokens per optimizer step):
- "1x16 Liger": notebook 08's "+ Liger kernels" recipe (1x16), as shipped;
- "1x16 Liger, dropout 0": the same with lora_dropout=0 (peft then runs no dropout kernels, forward or back);
- "1x16 Liger, compiled layers": each decoder layer compiled with torch.compile (regional compilation:
  one graph per layer, reused by all of them), checkpointing around the compiled layer as before;
- the same two for the fast recipe with embeddings and activations on CPU (16x1).
Compilation time falls in the warm-up step, which is not timed.
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
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def variants(steps: int) -> dict:
    from course_utils import beyond

    path = beyond.path_from(beyond.source("llama-3.1-8b", steps))
    liger, low = path[3], path[-1]
    return {
        "1x16 Liger": (liger, False),
        "1x16 Liger, dropout 0": (liger.with_(lora_dropout=0.0), False),
        "1x16 Liger, compiled layers": (liger, True),
        "1x16 Liger, dropout 0, compiled layers": (liger.with_(lora_dropout=0.0), True),
        "16x1 offload": (low, False),
        "16x1 offload, dropout 0, compiled layers": (low.with_(lora_dropout=0.0), True),
    }


def compile_layers(built) -> None:
    """torch.compile every decoder layer (one compiled graph, reused: the layers share their code)."""
    import torch

    torch._dynamo.config.cache_size_limit = 64  # guards on each layer's attributes would recompile per layer
    model = built.trainer.model
    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    for layer in layers:
        layer.compile()
    print(f"compiled {len(layers)} decoder layers", flush=True)


def child(name: str, steps: int) -> None:
    from course_utils.measure import run_here

    recipe, compiled = variants(steps)[name]
    t0 = time.perf_counter()
    m = run_here(recipe, on_built=compile_layers if compiled else None)
    print("RESULT " + json.dumps(dict(variant=name, status=m.status, error=m.error[:300],
                                      allocated_gib=round((m.cuda_max_allocated or 0) / 2**30, 2),
                                      reserved_gib=round((m.cuda_max_reserved or 0) / 2**30, 2),
                                      tokens_per_s=m.tokens_per_s, losses=[round(x, 4) for x in m.losses],
                                      timing=m.timing, wall_s=round(time.perf_counter() - t0, 1),
                                      recipe=recipe.to_dict(), env=m.env, date=m.date)), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--only", action="append")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        child(a.child, a.steps)
        return 0
    names = a.only or list(variants(a.steps))
    for name in names:
        cmd = [sys.executable, __file__, "--child", name, "--steps", str(a.steps)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            lines = [ln[7:] for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            line = lines[-1] if lines else json.dumps(dict(variant=name, status="failed",
                                                          error=(done.stdout + done.stderr)[-1500:]))
        except subprocess.TimeoutExpired:
            line = json.dumps(dict(variant=name, status="timeout", error=f"over {a.timeout} s"))
        with open(a.out, "a") as f:
            f.write(line + "\n")
        d = json.loads(line)
        print(f"{name:42} {d['status']:8} {d.get('allocated_gib', '-')!s:>6} GiB {d.get('tokens_per_s')!s:>9} tok/s "
              f"losses {d.get('losses', [])} {d.get('error', '')[:300]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
