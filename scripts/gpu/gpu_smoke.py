"""Check the measurement spine on a CUDA GPU: the source chapter's recipe on the Llama-3.1-8B
architecture with random weights (no download), plus the variants named on the command line.

    python scripts/gpu/gpu_smoke.py --store results.jsonl [--steps 4] [--variants mb16,bf16-lora]
"""

from __future__ import annotations

import argparse
import time

from course_utils.measure import measure_all
from course_utils.models import preset_path
from course_utils.recipe import source_chapter_recipe
from course_utils.results import ResultStore

VARIANTS = {
    "mb16": dict(micro_batch=16, grad_accum=1, label="source recipe at micro-batch 16"),
    "bf16-lora": dict(load_in_4bit=False, label="LoRA bf16 (no 4-bit), ckpt, 1x16"),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--variants", default="")
    args = parser.parse_args()
    t = time.perf_counter()
    print("random-weight checkpoint:", preset_path(args.model), f"({time.perf_counter() - t:.0f} s)", flush=True)
    base = source_chapter_recipe(args.model).with_(steps=args.steps, warmup_steps=1, label="source chapter recipe")
    recipes = [base] + [base.with_(**VARIANTS[v]) for v in args.variants.split(",") if v]
    store = ResultStore(args.store)

    def said(results) -> None:
        print(f"{results[-1].label}: {results[-1].seconds:.0f} s", flush=True)
        print(results.table(), flush=True)

    measure_all(recipes, store=store, progress=False, isolate=True, after_each=said)


if __name__ == "__main__":
    main()
