"""Beyond the source recipe on a GPU: the source recipe, each change, the lean and the fast recipe,
measured in one run, printed side by side with ratios against the source recipe of that run.

    python scripts/beyond_recipe.py --out course_utils/reference/beyond/llama-3.1-8b.jsonl
    python scripts/beyond_recipe.py --set explore --steps 4 --out explore.jsonl

Each recipe trains in a fresh process (course_utils.measure) on a random-weight preset built from
its config (no download): warm-up step, one tracked step (peaks by category and CUDA's allocated
and reserved peaks), then timed steps (median tokens/s). With --steps 20 the per-step losses of
the source, lean and fast recipes, which see the same data in the same order, are compared too.
The --out file is a results store: a recipe already in it is not run again.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from course_utils import beyond  # noqa: E402
from course_utils.recipe import Recipe  # noqa: E402


def recipe_set(name: str, model: str, steps: int) -> list[Recipe]:
    """The recipes of a set, the source recipe first."""
    path = beyond.changes(model, steps)
    lean, fast = beyond.lean(model, steps), beyond.fast(model, steps)
    if name == "final":
        return path + [lean, fast]
    if name == "curves":  # the recipes whose loss curves are compared
        return [path[0], lean, fast, beyond.fast_low_memory(model, steps)]
    if name == "explore":
        no_upcast = path[1]
        return path + [
            lean.with_(micro_batch=2, grad_accum=8, label="lean 2x8"),
            lean,
            no_upcast.with_(micro_batch=16, grad_accum=1, label="no upcast 16x1"),
            fast,
            fast.with_(micro_batch=4, grad_accum=4, gradient_checkpointing=False, label="fast, 4x4, no ckpt"),
            fast.with_(torch_compile=True, label="fast + torch.compile"),
            lean.with_(torch_compile=True, label="lean + torch.compile"),
        ]
    raise SystemExit(f"unknown set {name!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--set", default="final", choices=("final", "curves", "explore"))
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run (1 warm-up, 1 tracked)")
    parser.add_argument("--out", required=True, help="results file (JSON lines); resumable")
    parser.add_argument("--timeout", type=float, default=None, help="stop a run that takes longer (s)")
    parser.add_argument("--print-only", action="store_true", help="print the table of --out; measure nothing")
    args = parser.parse_args(argv)

    from course_utils.results import ResultStore

    store = ResultStore(args.out)
    recipes = recipe_set(args.set, args.model, args.steps)
    done = []
    if args.print_only:
        stored = {m.recipe_key: m for m in store.load()}
        done = [stored[r.key] for r in recipes if r.key in stored]
        for m, r in zip(done, [r for r in recipes if r.key in stored]):
            m.recipe["label"] = r.label
    else:
        import torch

        if not torch.cuda.is_available():
            print("beyond_recipe.py measures on a CUDA GPU; --print-only shows a stored run", file=sys.stderr)
            return 1
        from course_utils.measure import MeasurementError, measure
        from course_utils.models import preset_path

        t = time.perf_counter()
        print("random-weight checkpoint:", preset_path(args.model), f"({time.perf_counter() - t:.0f} s)", flush=True)
        for i, recipe in enumerate(recipes, 1):
            t = time.perf_counter()
            try:
                m = measure(recipe, store=store, progress=False, timeout_s=args.timeout)
            except MeasurementError as exc:
                print(f"[{i}/{len(recipes)}] {recipe.label}: FAILED {str(exc)[-1500:]}", flush=True)
                continue
            m.recipe["label"] = recipe.label
            done.append(m)
            alloc = (m.cuda_max_allocated or 0) / beyond.GiB
            print(f"[{i}/{len(recipes)}] {recipe.label}: {m.status}, {alloc:.2f} GiB allocated, "
                  f"{m.tokens_per_s or 0:.0f} tokens/s, {time.perf_counter() - t:.0f} s  {m.notes}", flush=True)
    print()
    print(f"{args.model}, sequence 512, 16 x 512 tokens per optimizer step; ratios against the source recipe "
          "measured in this run")
    print(beyond.format_rows(beyond.rows(done)))
    src = next((m for m in done if m.label.startswith("source")), None)
    lean = next((m for m in done if m.label.startswith("lean recipe")), None)
    fast = next((m for m in done if m.label.startswith("fast recipe")), None)
    others = [m for m in done if m.label.startswith("fast,")]
    print()
    for target, value, ok in beyond.target_checks(src, lean, fast):
        print(f"  {'MET ' if ok else 'MISSED'}  {target:<36}{value}")
    if src is not None:
        for other in [lean, fast] + others:
            if other is not None and len(other.losses) > 2:
                a = beyond.loss_agreement(src, other)
                print(f"  loss, {other.label} vs source over {a['steps']} steps: largest gap {a['max_gap']:.4f}, "
                      f"mean gap {a['mean_gap']:.4f}; fell {a['fall_a']:.3f} (source) and {a['fall_b']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
