"""The `course` command: `course run` (the chapter's ladder, headless; with --gpus N on N processes through
accelerate launch), `course env`, `course estimate` (the expected-memory table, or one recipe's arithmetic, per GPU
with --gpus N) and `course plan` (what fits a budget, such as "16GiB" or "2 x 15 GiB")."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from course_utils.common import GiB, MiB  # noqa: F401  (hardware.GiB, hardware.MiB)
from course_utils import distributed, measure
from course_utils.checks import check_positions
from course_utils.child import MeasurementError
from course_utils.cli_config import config_estimate
from course_utils.cli_recipe import (add_recipe_flags, estimate_base, field_type, recipe_from_flags, run_base,
                                     run_recipe, value_flags)
from course_utils.distributed import fsdp_ready, rank_table
from course_utils.estimate.distributed import estimate_distributed
from course_utils.estimate.peak import estimate
from course_utils.estimate.reports import expected_memory_table, format_expected_table
from course_utils.estimate.shapes import EstimateError
from course_utils.estimate.plan import BudgetError
from course_utils.estimate.planner import parse_gpu_budget, plan
from course_utils.cli_env import env_report
from course_utils.machine import T4_CARD_GIB, HardwareError, PROFILE_ENV
from course_utils.measure import Outcome, Results, measure_all
from course_utils.models import ModelUnavailableError, load_config
from course_utils.recipe import RecipeError
from course_utils.results import ResultLineError, ResultStore, StoreError, default_store, reference_results
from course_utils.show.plots import ladder_figure
from course_utils.show.report import describe_change

def _cmd_env(args: argparse.Namespace) -> int:
    """Print the environment report; exit 1 when something the chapter needs is missing."""
    import os


    if args.profile:  # the profile reaches every measuring child through the environment
        os.environ[PROFILE_ENV] = args.profile
    text, ok = env_report()
    print(text)
    return 0 if ok else 1


def _cmd_run(args: argparse.Namespace) -> int:
    """Run the ladder, print the table and what changed, write results and the plot. With --gpus N > 1 (or
    --strategy) every rung runs on N processes instead: _cmd_run_distributed."""
    if args.gpus > 1 or args.strategy is not None:
        return _cmd_run_distributed(args)
    import matplotlib

    matplotlib.use("Agg")

    if args.profile:  # the profile reaches every measuring child through the environment
        import os


        os.environ[PROFILE_ENV] = args.profile
    started = time.perf_counter()
    base = run_recipe(args)
    store = ResultStore(args.store) if args.store else default_store()
    out = _output_folder(args.out)  # a folder that cannot be written is refused before anything is measured
    store.check_writable()
    _STATE["store"], _STATE["stored_before"] = store, _count(store)
    print(f"The chapter's ladder on model={args.model!r}: {base.describe()}, {base.steps} steps per rung "
          f"({base.warmup_steps} warm-up, 1 tracked for memory, {base.steps - base.warmup_steps - 1} timed).")
    print(f"Results store: {store.path}" + (" (re-measuring everything: --force)" if args.force else ""))
    rungs, same = measure.ladder_here(base)  # each rung checked there
    results = measure_all(rungs, store=store, force=args.force, progress=not args.no_progress, isolate=True,
                          skip=same, desc="ladder", checked=True)
    measured = results.measured
    for _ in range(args.repeats):  # interleaved: each repeat runs the rungs in the reverse order of the last
        measured = measure.time_again(measured, store=store, isolate=True, progress=not args.no_progress)
    env = measured[0].env
    print(f"\nDevice: {env['device']}; torch {env['versions']['torch']}, transformers "
          f"{env['versions']['transformers']}, peft {env['versions']['peft']}, trl {env['versions']['trl']}, "
          f"bitsandbytes {env['versions']['bitsandbytes']}")
    print("Peak memory by category (tensor-level tracking, steady state after warm-up):\n")
    print(results.table(measured))
    print("\nWhat each technique changed:")
    for before, after in zip(measured, measured[1:]):
        print("  " + describe_change(before, after))
    cached = sum(1 for m in measured if m.cached)
    if cached:
        print(f"\n({cached} of the rungs came from the results store; --force re-measures them.)")

    with open(out / "ladder.jsonl", "w") as fh:
        for m in measured:
            fh.write(m.to_json() + "\n")
    reference = [m for m in reference_results() if m.recipe.get("model") == args.model]
    ladder_figure(measured, reference, path=out / "ladder.png")
    print(f"\nWrote {out / 'ladder.jsonl'} and {out / 'ladder.png'} in {time.perf_counter() - started:.0f} s.")
    return 0


def _cmd_run_distributed(args: argparse.Namespace) -> int:
    """`course run --gpus N [--strategy ...]`: each rung of the ladder trained on N processes by
    distributed.launch (accelerate launch, the shipped config), every rung checked before the first starts;
    the table is per GPU (each rung's largest rank) with global tokens/s, then each rank's own figures."""
    import matplotlib

    matplotlib.use("Agg")

    if getattr(args, "budget_gib", None) is not None:  # a per-process cap means one process: not with --gpus
        raise RecipeError("--budget-gib caps one process's memory and cannot be combined with --gpus or --strategy; "
                          "drop one of them.")
    if args.profile:
        import os


        os.environ[PROFILE_ENV] = args.profile
    strategy = args.strategy or "ddp"
    started = time.perf_counter()
    base = run_recipe(args)
    store = ResultStore(args.store) if args.store else default_store()
    out = _output_folder(args.out)
    store.check_writable()
    rungs, same = measure.ladder_here(base)
    if strategy.startswith("fsdp"):
        rungs = [fsdp_ready(r) for r in rungs]
    device = ""
    for i, rung in enumerate(rungs):  # every check before the first process starts
        if i not in same:
            device = distributed.check_launch(rung, args.gpus, strategy)
    _STATE["store"], _STATE["stored_before"] = store, _count(store)
    where = "GPUs" if device == "cuda" else "CPU processes (gloo)"
    print(f"The chapter's ladder on model={args.model!r}, {strategy} on {args.gpus} {where}: {base.describe()} "
          f"per process, {base.steps} steps per rung; global batch {args.gpus} x {base.effective_batch} sequences.")
    print(f"Results store: {store.path}" + (" (re-measuring everything: --force)" if args.force else ""))
    results = Results()
    for i, rung in enumerate(rungs):
        if i in same:
            results.append(Outcome(rung, None, same[i]))
            continue
        t0 = time.perf_counter()
        m = distributed.launch(rung, gpus=args.gpus, strategy=strategy, store=store, force=args.force,
                   progress=not args.no_progress)
        results.append(Outcome(rung, m, "", time.perf_counter() - t0))
    measured = results.measured
    print(f"\nPeak memory per GPU (the largest rank's) and global tokens/s, {args.gpus} processes:\n")
    print(results.table())
    print("\nEach rank:\n")
    print(rank_table(measured))
    name = f"ladder-{args.gpus}x{strategy}"
    with open(out / f"{name}.jsonl", "w") as fh:
        for m in measured:
            fh.write(m.to_json() + "\n")
    ladder_figure(measured, [], path=out / f"{name}.png")
    print(f"\nWrote {out / (name + '.jsonl')} and {out / (name + '.png')} in {time.perf_counter() - started:.0f} s.")
    return 0


_STATE: dict = {}  # the store `course run` writes to, and how many results it held before, for Ctrl-C


def _count(store) -> int:
    """Results in a store (0 when it cannot be read)."""
    try:
        return len(store.load())
    except OSError:
        return 0


def _output_folder(path: str) -> Path:
    """--out as a folder we can write to, made now; an error naming the problem otherwise."""

    out = Path(path)
    if out.exists() and not out.is_dir():
        raise RecipeError(f"--out {path} is a file, not a folder: give a folder for ladder.jsonl and ladder.png "
                          "(it is made if missing).")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".course-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise RecipeError(f"--out {path} cannot be written here ({exc.strerror or exc}): give a folder you can "
                          "write to.") from None
    return out


def _cmd_estimate(args: argparse.Namespace) -> int:
    """Print the expected-memory table, or (with --model) one recipe's estimate and its arithmetic."""

    try:
        if args.config is not None:  # a trl sft --config file (course_utils/cli_config.py)

            print(config_estimate(args))
            return 0
        if args.model is None:
            if args.gpus > 1 or args.strategy is not None:
                raise EstimateError("--gpus and --strategy estimate one recipe per GPU: give it with --model "
                                    "(e.g. --model llama-3.1-8b --source --gpus 2 --strategy fsdp).")
            print(format_expected_table(expected_memory_table(hardware=args.hardware)))
            return 0
        recipe = _recipe_from_args(args)
        check_positions(recipe.model, recipe.max_seq_length, load_config(recipe.model).max_position_embeddings)
        if args.gpus > 1:

            print(estimate_distributed(recipe, args.gpus, args.strategy or "ddp", hardware=args.hardware).explain())
            return 0
        print(estimate(recipe, hardware=args.hardware).explain())
    except EstimateError as exc:
        print(f"course: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _recipe_from_args(args: argparse.Namespace):
    """The recipe `course estimate` describes: a base (plain LoRA, or the chapter's) with the flags given applied."""
    return recipe_from_flags(estimate_base(args.model, args.source), args, "estimate")


def _cmd_plan(args: argparse.Namespace) -> int:
    """List the candidate recipes that fit the budget, fastest first, and name the pick."""

    counted, per_gpu = args.budget if args.budget is not None else (1, None)
    try:
        if args.gpus is not None and counted not in (1, args.gpus):
            raise BudgetError(f"--budget is for {counted} GPUs but --gpus {args.gpus}: give one of them "
                              f"(e.g. --budget '{args.gpus} x 15 GiB', or the memory of one GPU with --gpus).")
        gpus = args.gpus or counted
        check_positions(args.model, args.seq, load_config(args.model).max_position_embeddings)
        result = plan(args.model, per_gpu, seq=args.seq, hardware=args.hardware, gpus=gpus if gpus > 1 else None)
    except (BudgetError, EstimateError) as exc:
        print(f"course: error: {exc}", file=sys.stderr)
        return 2
    print(result.format(show=None if args.all else 15))
    if result.pick is not None:
        print(f"Check it on a GPU: python scripts/gpu/check_plan.py --model {args.model} "
              f"--budget {result.budget / 2**30:.2f}GiB --seq {args.seq} --hardware {args.hardware}")
    return 0


def _budget(text: str) -> tuple[int, int]:
    """argparse type for --budget: (GPUs, bytes per GPU): '16GiB' is (1, bytes), '2 x 15 GiB' two GPUs of 15 GiB
    (planner.parse_gpu_budget); or an error that names the input."""

    try:
        return parse_gpu_budget(text)
    except BudgetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _path(flag: str):
    """argparse type for a path flag: any text but an empty one (which would mean the current folder)."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"an empty {flag} would mean the current folder: give a path")
        return text

    parse.__name__ = "path"
    return parse


def _gpu_count(text: str) -> int:
    """argparse type for --gpus: a whole number, 1 or more."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"--gpus takes a whole number of GPUs (processes), 1 or more, got {text!r}")
    return n


MAX_REPEATS = 5  # each repeat runs every rung once more


def _repeats(text: str) -> int:
    """argparse type for --repeats: a whole number from 0 to MAX_REPEATS."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_REPEATS:
        raise argparse.ArgumentTypeError(f"--repeats takes a whole number from 0 to {MAX_REPEATS} (how many more times "
                                         f"each rung is timed), got {text!r}")
    return n


def _add_estimate_and_plan(sub) -> None:
    """The `estimate` and `plan` subcommands."""
    hardware = dict(choices=("gpu", "t4", "cpu"), default="gpu",
                    help="gpu: a bf16 GPU of compute capability 8.0+ (A100, L4, H100, H200; default); "
                         f"t4: Colab's free T4 (fp16, no FlashAttention-2, {T4_CARD_GIB:g} GiB); cpu")
    est = sub.add_parser("estimate",
                         help="the expected-memory table, or one recipe's estimated peak with its arithmetic")
    est.add_argument("--model", default=None, type=field_type("model", str),
                     help="a preset (llama-3.1-8b, ...), 'tiny', or a local folder / cached hub id; "
                          "without it, print the expected-memory table")
    est.add_argument("--source", action="store_true", help="start from the source chapter's complete recipe")
    est.add_argument("--config", default=None, metavar="FILE", type=_path("--config"),
                     help="a `trl sft --config` YAML file: its model and recipe, read as trl's sft script trains them "
                          "(settings the course does not model are named: an error, or a warning when harmless)")
    est.add_argument("--hardware", **hardware)
    est.add_argument("--gpus", type=_gpu_count, default=1, help="GPUs that train together: the estimate per GPU")
    est.add_argument("--strategy", choices=("ddp", "fsdp"), default=None,
                     help="with --gpus N: ddp (a whole copy per GPU; default) or fsdp (full shard)")
    add_recipe_flags(est, "estimate", {"": estimate_base("tiny"), "with --source": estimate_base("tiny", source=True)},
                     "With --model: plain LoRA at the hardware's precision, or with --source the source chapter's "
                     "complete recipe")
    est.set_defaults(func=_cmd_estimate)

    pl = sub.add_parser("plan", help="the recipes that fit a memory budget, and the fastest of them")
    pl.add_argument("--model", required=True, type=field_type("model", str),
                    help="a preset such as llama-3.1-8b, or a local folder / cached hub id")
    pl.add_argument("--budget", type=_budget, default=None,
                    help=f"memory to fit in, e.g. 16GiB, 16GB, 12.5GiB (default with --hardware t4: {T4_CARD_GIB:g}GiB); "
                         "on several GPUs the count and one GPU's memory, e.g. '2 x 15 GiB'")
    pl.add_argument("--gpus", type=_gpu_count, default=None,
                    help="GPUs to plan for (DDP and FSDP rows; the budget is then one GPU's memory)")
    pl.add_argument("--seq", type=field_type("max_seq_length"), default=512, help="max sequence length (default 512)")
    pl.add_argument("--hardware", **hardware)
    pl.add_argument("--all", action="store_true", help="list every recipe that fits, not only the 15 fastest")
    pl.set_defaults(func=_cmd_plan)


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (what was wrong, and where the flags are listed), not the usage
    block followed by the error."""

    def error(self, message: str):
        if "ignored explicit argument" in message:  # '--gradient-checkpointing=yes': a switch takes no value
            message += ": a switch takes no value (--x turns it on, --no-x, where it has one, off)"
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the flags)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `course` command."""
    parser = _OneLineParser(prog="course", description="Chapter 3, Memory-Efficient Training: measure it.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)

    run = sub.add_parser("run", help="measure the chapter's ladder of techniques and plot memory against speed")
    run.add_argument("--model", default="tiny", type=field_type("model", str),
                     help="'tiny' (embedded, offline; default), a preset such as llama-3.1-8b (GPU), or a hub id/path")
    run.add_argument("--out", default="course-output", type=_path("--out"),
                     help="folder for ladder.jsonl and ladder.png")
    run.add_argument("--store", default=None, type=_path("--store"),
                     help="results store (default $COURSE_HOME/results.jsonl)")
    run.add_argument("--force", action="store_true", help="re-measure even when the store has a result")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    run.add_argument("--repeats", type=_repeats, default=1,
                     help="time every rung this many more times, in reverse order, so each speed carries its spread "
                          "in this run and a speed change counts only beyond it (default 1; 0: timed once, judged by "
                          "a fixed spread)")
    run.add_argument("--gpus", type=_gpu_count, default=1,
                     help="processes that train together, one per GPU (on a machine without GPUs, gloo CPU processes); "
                          "above 1 every rung runs through accelerate launch (notebook 11)")
    run.add_argument("--strategy", choices=("ddp", "fsdp", "fsdp_offload"), default=None,
                     help="with --gpus: ddp (default), fsdp (full shard, GPUs only) or fsdp_offload")
    add_recipe_flags(run, "run", {"": run_base("tiny")},
                     "The ladder's baseline: the notebooks' CPU base recipe on any machine; its learning rate is above "
                     "the chapter's 2e-4 because the tiny model has random weights and LoRA needs bigger steps to "
                     "show learning within a few steps")
    run.set_defaults(func=_cmd_run)

    profile = dict(choices=("t4",), default=None,
                   help="on a bigger CUDA GPU, behave as on this learner's card (t4: fp16, no flash attention, "
                        f"{T4_CARD_GIB:g} GiB for the whole card); the same as COURSE_PROFILE=t4")
    run.add_argument("--profile", **profile)
    env = sub.add_parser("env", help="print the environment report with [OK]/[FAIL] checks")
    env.add_argument("--profile", **profile)
    env.set_defaults(func=_cmd_env)
    _add_estimate_and_plan(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `course` console command."""

    args = build_parser().parse_args(_glue_negative_values(sys.argv[1:] if argv is None else list(argv)))
    previous = _on_sigterm()
    try:
        return args.func(args)
    except (RecipeError, HardwareError, ModelUnavailableError, MeasurementError, StoreError, ResultLineError) as exc:
        print(f"course: error: {exc}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"course: stopped (SIGTERM); the measuring process was ended with it. {_saved_note()}", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"\ncourse: interrupted. {_saved_note()}", file=sys.stderr)
        return 130
    except OSError as exc:  # a file or folder the command needs (COURSE_HOME, a lock) that cannot be used
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        print(f"course: error: {exc.strerror or _one_line(exc)}{where}. Check that COURSE_HOME and the paths "
              "given are folders and files you can write.", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 (no traceback reaches the terminal; COURSE_DEBUG=1 shows it)
        if os.environ.get("COURSE_DEBUG"):
            raise
        print(f"course: error: unexpected {type(exc).__name__}: {_one_line(exc)}. This is a bug in the course: "
              "please report it with the command you ran (COURSE_DEBUG=1 shows the traceback).", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C: every `finally` runs, so the measuring child is ended
    (measure.relay) and a store rewrite in progress is rolled back (results.ResultStore._append)."""


def _on_sigterm():
    """Make SIGTERM raise Terminated while the command runs; returns the handler to restore (None when this is
    not the main thread, where no handler can be set)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise Terminated()

    return signal.signal(signal.SIGTERM, handler)


def _one_line(exc: BaseException) -> str:
    """An error's message on one line (a child's log tail or a list of problems joined with ' | ')."""
    text = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text or type(exc).__name__


def _saved_note() -> str:
    """What Ctrl-C leaves: the results measured so far are in the store, and running again resumes."""
    store = _STATE.get("store")
    if store is None:
        return "Nothing was measured."
    saved = _count(store) - _STATE.get("stored_before", 0)
    if saved <= 0:
        return "No result of this run was stored yet; run the same command again to start over."
    return (f"{saved} result(s) of this run were saved in {store.path}; run the same command again to resume "
            "(stored results are reused, not re-measured).")


VALUE_OPTIONS = tuple(dict.fromkeys(("--budget", "--gpus", "--seq", *value_flags())))  # plan's --seq too


def _glue_negative_values(argv: list[str]) -> list[str]:
    """'--budget -1GiB' as '--budget=-1GiB': argparse reads a value that starts with '-' as an option and
    says only 'expected one argument'; glued, the value reaches its check, which says what is wrong."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in VALUE_OPTIONS and i + 1 < len(argv) and argv[i + 1].startswith("-") and argv[i + 1][1:2].isdigit():
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


if __name__ == "__main__":
    sys.exit(main())
