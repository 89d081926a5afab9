"""The `course` command: `course run` (the chapter's ladder, headless) and `course env`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _cmd_env(args: argparse.Namespace) -> int:
    """Print the environment report; exit 1 when something the chapter needs is missing."""
    from .hardware import env_report

    text, ok = env_report()
    print(text)
    return 0 if ok else 1


def _cmd_run(args: argparse.Namespace) -> int:
    """Run the ladder, print the table and what changed, write results and the plot."""
    import matplotlib

    matplotlib.use("Agg")
    from .measure import run_ladder
    from .plots import ladder_figure
    from .recipe import Recipe
    from .results import ResultStore, default_store, describe_change, format_table, reference_results

    started = time.perf_counter()
    base = Recipe(model=args.model, micro_batch=args.micro_batch, max_seq_length=args.seq,
                  steps=args.steps, learning_rate=args.lr, label="baseline (LoRA, fp32)")
    store = ResultStore(args.store) if args.store else default_store()
    print(f"The chapter's ladder on model={args.model!r}: {base.describe()}, {base.steps} steps per rung "
          f"({base.warmup_steps} warm-up, 1 tracked for memory, {base.steps - base.warmup_steps - 1} timed).")
    print(f"Results store: {store.path}" + (" (re-measuring everything: --force)" if args.force else ""))
    results, skipped = run_ladder(base, store=store, force=args.force, progress=not args.no_progress, isolate=True)
    env = results[0].env
    print(f"\nDevice: {env['device']}; torch {env['versions']['torch']}, transformers "
          f"{env['versions']['transformers']}, peft {env['versions']['peft']}, trl {env['versions']['trl']}, "
          f"bitsandbytes {env['versions']['bitsandbytes']}")
    print("Peak memory by category (tensor-level tracking, steady state after warm-up):\n")
    print(format_table(results, skipped))
    print("\nWhat each technique changed:")
    for i in range(1, len(results)):
        if i not in skipped:
            prev = max(j for j in range(i) if j not in skipped)
            print("  " + describe_change(results[prev], results[i]))
    cached = sum(1 for i, m in enumerate(results) if m.cached and i not in skipped)
    if cached:
        print(f"\n({cached} of the rungs came from the results store; --force re-measures them.)")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "ladder.jsonl", "w") as fh:
        for i, m in enumerate(results):
            if i not in skipped:
                fh.write(m.to_json() + "\n")
    reference = [m for m in reference_results() if m.recipe.get("model") == args.model]
    ladder_figure([m for i, m in enumerate(results) if i not in skipped], reference, path=out / "ladder.png")
    print(f"\nWrote {out / 'ladder.jsonl'} and {out / 'ladder.png'} in {time.perf_counter() - started:.0f} s.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `course` command."""
    parser = argparse.ArgumentParser(prog="course", description="Chapter 3, Memory-Efficient Training: measure it.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="measure the chapter's ladder of techniques and plot memory against speed")
    run.add_argument("--model", default="tiny",
                     help="'tiny' (embedded, offline; default), a preset such as llama-3.1-8b (GPU), or a hub id/path")
    run.add_argument("--steps", type=int, default=6, help="optimizer steps per rung (default 6)")
    run.add_argument("--seq", type=int, default=256, help="max sequence length (default 256)")
    run.add_argument("--micro-batch", type=int, default=4, help="baseline micro-batch (default 4)")
    run.add_argument("--lr", type=float, default=1e-3,
                     help="learning rate (default 1e-3: the tiny model has random weights, so LoRA needs bigger steps "
                          "than the chapter's 2e-4 to show learning within a few steps)")
    run.add_argument("--out", default="course-output", help="folder for ladder.jsonl and ladder.png")
    run.add_argument("--store", default=None, help="results store (default $COURSE_HOME/results.jsonl)")
    run.add_argument("--force", action="store_true", help="re-measure even when the store has a result")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    run.set_defaults(func=_cmd_run)

    env = sub.add_parser("env", help="print the environment report with [OK]/[FAIL] checks")
    env.set_defaults(func=_cmd_env)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `course` console command."""
    from .hardware import HardwareError
    from .measure import MeasurementError
    from .models import ModelUnavailableError
    from .recipe import RecipeError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (RecipeError, HardwareError, ModelUnavailableError, MeasurementError) as exc:
        print(f"course: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
