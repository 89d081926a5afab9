"""Reproduce the shipped GPU reference results with one command (needs a CUDA GPU, no download).

    python scripts/gpu/reference_runs.py --set llama-3.1-8b --out course_utils/reference/llama-3.1-8b.jsonl

Each run is a fresh process (course_utils.measure) on a preset architecture with random weights;
the output file is a results store, so a run already in it is skipped (resumable). Every line
records the GPU, driver, CUDA, library versions, date and this command.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from course_utils.child import RUN_ID_ENV
from course_utils.measure import measure_all
from course_utils.models import preset_path
from course_utils.recipe import Recipe, source_chapter_recipe
from course_utils.results import ResultStore


def reference_set(model: str, steps: int) -> list[Recipe]:
    """The chapter's techniques on one architecture, most important first."""
    src = source_chapter_recipe(model).with_(steps=steps, warmup_steps=1, label="source chapter recipe (QLoRA 1x16)")
    lora = src.with_(load_in_4bit=False, label="LoRA bf16, ckpt, 1x16, paged 8-bit")
    lora_adam = lora.with_(optimizer="adamw_torch", label="LoRA bf16, ckpt, 1x16, adamw_torch")
    recipes = [
        src,
        src.with_(micro_batch=4, grad_accum=4, label="QLoRA 4x4"),
        src.with_(micro_batch=16, grad_accum=1, label="QLoRA 16x1"),
        lora_adam,
        lora_adam.with_(gradient_checkpointing=False, label="LoRA bf16, no ckpt, 1x16, adamw_torch"),
        lora_adam.with_(micro_batch=16, grad_accum=1, label="LoRA bf16, ckpt, 16x1, adamw_torch"),
        lora_adam.with_(optimizer="adamw_8bit", label="LoRA bf16, ckpt, 1x16, adamw_8bit"),
        lora,
        lora_adam.with_(precision="fp32", gradient_checkpointing=False, label="LoRA fp32, no ckpt, 1x16 (baseline)"),
        lora_adam.with_(lora_r=None, gradient_checkpointing=False, label="full FT bf16, no ckpt, 1x16, adamw_torch"),
        lora_adam.with_(lora_r=None, label="full FT bf16, ckpt, 1x16, adamw_torch"),
        lora_adam.with_(lora_r=None, optimizer="adamw_8bit", label="full FT bf16, ckpt, 1x16, adamw_8bit"),
        # paging needs tensors of 1e5 elements or more: a full fine-tune has them, LoRA r=16 has none (notebook 03)
        lora_adam.with_(lora_r=None, optimizer="paged_adamw_8bit", label="full FT bf16, ckpt, 1x16, paged 8-bit"),
    ]
    return recipes


def tf32_set(model: str, steps: int) -> list[Recipe]:
    """Notebook 04's precisions in one run: fp32, fp32 with TF32 matmuls, and bf16 (LoRA, no checkpointing)."""
    fp32 = source_chapter_recipe(model).with_(
        steps=steps, warmup_steps=1, load_in_4bit=False, optimizer="adamw_torch", gradient_checkpointing=False,
        precision="fp32", label="LoRA fp32, no ckpt, 1x16")
    return [fp32, fp32.with_(tf32=True, label="LoRA fp32 + TF32, no ckpt, 1x16"),
            fp32.with_(precision="bf16", label="LoRA bf16, no ckpt, 1x16")]


SETS = {
    # notebook 04's TF32 comparison (ships in course_utils/reference/tf32/)
    "tf32-llama-3.1-8b": lambda steps: tf32_set("llama-3.1-8b", steps),
    "llama-3.1-8b": lambda steps: reference_set("llama-3.1-8b", steps),
    # a second architecture: the chapter's 13B row
    "llama-2-13b": lambda steps: [r for r in reference_set("llama-2-13b", steps)
                                  if not r.name.startswith(("full FT bf16, no", "LoRA fp32"))],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", required=True, choices=sorted(SETS))
    parser.add_argument("--out", required=True, help="results file (JSON lines)")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps per run (1 warm-up, 1 tracked)")
    parser.add_argument("--first", type=int, default=None, help="only the first N recipes of the set")
    parser.add_argument("--only", action="append", default=None, help="only the recipe with this label (repeatable)")
    parser.add_argument("--run-id", default=None,
                        help="the measurement run these results belong to (default: ref-<UTC date and time>); "
                             "give the same id to calls that together measure one set")
    args = parser.parse_args()
    os.environ[RUN_ID_ENV] = args.run_id or time.strftime("ref-%Y%m%d-%H%M", time.gmtime())

    import torch

    if not torch.cuda.is_available():
        print("reference runs need a CUDA GPU", file=sys.stderr)
        return 1
    t = time.perf_counter()
    recipes = SETS[args.set](args.steps)[: args.first]
    print("random-weight checkpoint:", preset_path(recipes[0].model), f"({time.perf_counter() - t:.0f} s)", flush=True)
    store = ResultStore(args.out)
    if args.only:
        unknown = set(args.only) - {r.label for r in recipes}
        if unknown:
            print(f"no recipe labelled {sorted(unknown)} in set {args.set}; labels: {[r.label for r in recipes]}",
                  file=sys.stderr)
            return 2
        recipes = [r for r in recipes if r.label in args.only]

    def said(results) -> None:
        o = results[-1]
        print(f"[{len(results)}/{len(recipes)}] {o.label}: {o.measurement.status}, {o.seconds:.0f} s", flush=True)

    results = measure_all(recipes, store=store, progress=False, isolate=True, after_each=said)
    print(results.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
