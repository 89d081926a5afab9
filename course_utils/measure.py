"""measure(recipe): train a recipe for a few steps in a fresh process and return what it used.

The child process builds the recipe, then runs:
  warm-up steps   (first-step allocations, optimizer state created; not measured)
  1 tracked step  (tensor-level tracking by category: the steady-state peak)
  timed steps     (tracker off, so its bookkeeping does not slow the clock: tokens/s of the
                   median step)
and writes a Measurement as JSON. The parent shows a progress bar, stores the result, and returns it.
Running out of memory is a result ("does not fit"), not a crash.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .probe import PROGRESS, Probe, callback
from .recipe import Recipe
from .results import Measurement, ResultStore, default_store

LAUNCHED_ENV = "COURSE_LAUNCHED_AT"  # when the parent started a measuring child (time.time())
RUN_ID_ENV = "COURSE_RUN_ID"  # the measurement run a result belongs to (scripts/reference_runs.py sets it)


class MeasurementError(RuntimeError):
    """The training process failed for a reason other than memory; the message has its log's tail."""


# ---------------------------------------------------------------------------------------------
# parent side
# ---------------------------------------------------------------------------------------------
def measure(
    recipe: Recipe,
    *,
    store: ResultStore | None = None,
    force: bool = False,
    budget_gib: float | None = None,
    progress: bool = True,
    timeout_s: float | None = None,
    isolate: bool | None = True,
) -> Measurement:
    """Measure one recipe in a fresh process, or return the stored result of an identical run.

    budget_gib simulates a smaller device: past it, the run stops and is marked "does not fit".
    force=True re-runs even when the store already has this recipe in this environment.
    isolate=False trains in this process instead (no 7 s start-up): the tensor-level figures are
    the same, but on CUDA the allocator's own peaks would include what this process already holds,
    so it is only taken on a CPU. isolate=None: a fresh process on a GPU, this process on a CPU.
    """
    from .checks import check_runnable
    from .provenance import environment

    store = store or default_store()
    env = environment()
    if not force and budget_gib is None:
        found = store.find(recipe, env.key)
        if found is not None and not found.noisy:  # a speed from a busy machine is measured again
            found.cached = True
            return _as_asked(found, recipe)
    check_runnable(recipe)  # a recipe that cannot run here is refused before anything starts
    if budget_gib is None:
        store.check_writable()  # and a result that could not be stored is not measured
    if isolate or env.device_type != "cpu":
        result = _run_child(recipe, budget_gib, progress, timeout_s)
    else:
        result = run_here(recipe, budget_gib, report_progress=_progress_bar(recipe, progress))
    if budget_gib is None:
        store.add(result)
    return _as_asked(result, recipe)


def _as_asked(m: Measurement, recipe: Recipe) -> Measurement:
    """The measurement with the asked recipe's label (the label is not part of the key, so a stored result
    may carry the label of the run that stored it). A new dict: a shared one is left as it was."""
    m.recipe = {**m.recipe, "label": recipe.label}
    return m


TEMP_PREFIXES = ("course-measure-", "course-run-")  # + the owner's pid: see temp_folder()


def temp_folder(prefix: str) -> tempfile.TemporaryDirectory:
    """A temporary folder named after this process (prefix + pid + '-'), removed when its block ends. Those
    of processes that no longer exist (killed with kill -9, which no cleanup survives) are removed first."""
    root = Path(tempfile.gettempdir())
    for stale in root.glob(f"{prefix}*-*"):
        pid = stale.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-")


def _alive(pid: int) -> bool:
    """True when a process with this pid exists (or exists but is not ours to signal)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def child_env(recipe: Recipe) -> dict:
    """The measuring child's environment. A model trained on the shipped data ('tiny', a preset) never
    needs the hub, so its child is told so and opens no connection."""
    from .checks import uses_shipped_data

    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", COURSE_COMMAND=_command(),
               **{LAUNCHED_ENV: repr(time.time())})
    if uses_shipped_data(recipe.model):
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return env


def _run_child(recipe: Recipe, budget_gib: float | None, progress: bool, timeout_s: float | None) -> Measurement:
    """Start `python -m course_utils.measure`, relay its progress, read its JSON result."""
    with temp_folder(TEMP_PREFIXES[0]) as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "course_utils.measure", "--recipe", json.dumps(recipe.to_dict()), "--out", str(out)]
        if budget_gib is not None:
            cmd += ["--budget-gib", str(budget_gib)]
        env = child_env(recipe)
        code, log, timed_out = relay(cmd, env, _progress_bar(recipe, progress), timeout_s)
        if timed_out:
            raise MeasurementError(f"measuring {recipe.name!r} took longer than {timeout_s} s; stopped it.")
        if out.exists():
            return _read_child_result(json.loads(out.read_text()))
        tail = "".join(log[-40:])
        if code in (-9, 137):  # the kernel's out-of-memory killer on CPU
            return _does_not_fit(recipe, "the training process was killed (out of host memory)")
        raise MeasurementError(f"measuring {recipe.name!r} failed (exit code {code}). Last lines of its log:\n{tail}")


def relay(cmd: list[str], env: dict, bar, timeout_s: float | None, kill=None,
          new_session: bool = False) -> tuple[int, list[str], bool]:
    """Run a measuring process: its progress lines go to `bar` (a _StepBar, or None), every other line is kept
    as its log; past timeout_s it is stopped with kill(proc) (default proc.kill(); distributed.py stops a whole
    process group, started with new_session=True). Returns (exit code, log lines, whether it timed out)."""
    kill = kill or (lambda p: p.kill())
    log: list[str] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=new_session)
    timed_out = threading.Event()

    def stop() -> None:
        timed_out.set()
        kill(proc)

    watchdog = threading.Timer(timeout_s, stop) if timeout_s else None  # a silent hang is stopped too
    if watchdog is not None:
        watchdog.start()
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith(PROGRESS):
                if bar is not None:
                    bar(*line.split()[1:3])
            else:
                log.append(line)
        code = proc.wait()
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if bar is not None:
            bar.close()
        if proc.poll() is None:
            kill(proc)
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
    return code, log, timed_out.is_set()


CHILD_ERRORS = ("RecipeError", "HardwareError", "ModelUnavailableError", "MeasurementError")


def _child_error(exc: BaseException) -> dict:
    """What a child writes instead of a result when the recipe cannot run: the error's type and message."""
    return {"child_error": type(exc).__name__, "message": str(exc)}


def _read_child_result(d: dict) -> Measurement:
    """The child's result, or the error it reported, raised here as the same type with the same one-line
    message (no child traceback: the message says what was wrong and what to do)."""
    if "child_error" not in d:
        return Measurement.from_dict(d)
    from .hardware import HardwareError
    from .models import ModelUnavailableError
    from .recipe import RecipeError

    kinds = {"RecipeError": RecipeError, "HardwareError": HardwareError,
             "ModelUnavailableError": ModelUnavailableError, "MeasurementError": MeasurementError}
    raise kinds.get(d["child_error"], MeasurementError)(d["message"])


PHASES = ("warm-up", "tracked", "timed")


def phase_of(recipe: Recipe, step: int) -> str:
    """Which part of a measurement optimizer step `step` (1-based) belongs to."""
    if step <= recipe.warmup_steps:
        return PHASES[0]
    return PHASES[1] if step == recipe.warmup_steps + 1 else PHASES[2]


class _StepBar:
    """A tqdm bar over one recipe's optimizer steps, named after the recipe, that says which phase the
    last step was in; called with (step, seconds of that step)."""

    def __init__(self, recipe: Recipe):
        from tqdm.auto import tqdm

        self.recipe = recipe
        self.bar = tqdm(total=recipe.steps, desc=recipe.name[:40], unit="step", leave=False)
        self.bar.set_postfix_str("building the model")

    def __call__(self, step, seconds=None) -> None:
        step = int(step)
        self.bar.update(step - self.bar.n)
        took = f", {float(seconds):.1f} s" if seconds not in (None, "") else ""
        ahead = phase_of(self.recipe, step + 1) if step < self.recipe.steps else "done"
        self.bar.set_postfix_str(f"{phase_of(self.recipe, step)} step{took}; next: {ahead}")

    def close(self) -> None:
        self.bar.close()


def _progress_bar(recipe: Recipe, enabled: bool):
    """A bar over the recipe's optimizer steps (auto: notebook widget or terminal), or None."""
    return _StepBar(recipe) if enabled else None


def _does_not_fit(recipe: Recipe, why: str) -> Measurement:
    """A 'does not fit' result, for when the process died before it could write one."""
    from .provenance import environment

    env = environment()
    return Measurement(recipe=recipe.to_dict(), recipe_key=recipe.key, env=_env_dict(env), env_key=env.key,
                       status="does_not_fit", error=why, date=_now(), command=_command(),
                       run_id=os.environ.get(RUN_ID_ENV, ""))


# ---------------------------------------------------------------------------------------------
# child side
# ---------------------------------------------------------------------------------------------
def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _command() -> str:
    """The command that asked for this measurement (the parent's, passed down to the child)."""
    if os.environ.get("COURSE_COMMAND"):
        return os.environ["COURSE_COMMAND"]
    argv = list(sys.argv)
    if argv and argv[0].endswith(("ipykernel_launcher.py", "ipykernel/__main__.py")):
        return "jupyter notebook"
    return shlex.join([Path(argv[0]).name] + argv[1:]) if argv and argv[0] else "python (interactive)"


def _env_dict(env) -> dict:
    import dataclasses

    return dataclasses.asdict(env)


def _startup_s() -> float:
    """Seconds from the parent starting this measuring process to now (its imports), or 0.0 in-process."""
    try:
        return round(max(0.0, time.time() - float(os.environ.pop(LAUNCHED_ENV))), 2)
    except (KeyError, ValueError):
        return 0.0


def check_sane(recipe: Recipe, probe) -> None:
    """A run that trained something other than its recipe, or diverged, is an error, not a result."""
    wrong = sorted(probe.batch_sizes - {recipe.micro_batch})
    if wrong:
        raise MeasurementError(
            f"{recipe.name!r} recorded micro_batch={recipe.micro_batch} but trained batches of {wrong} sequences; "
            "nothing was stored. Lower micro_batch to what the data holds, or use a shorter max_seq_length.")
    bad = [i + 1 for i, loss in enumerate(probe.losses) if not math.isfinite(loss)]
    if bad:
        raise MeasurementError(
            f"{recipe.name!r} diverged: the loss was not finite at step(s) {bad} (losses {probe.losses}); nothing "
            f"was stored. Lower learning_rate (now {recipe.learning_rate}), or use fp32/bf16 instead of fp16.")


def run_here(recipe: Recipe, budget_gib: float | None = None, report_progress=False, on_built=None) -> Measurement:
    """Build and train the recipe in this process and measure it (measure() calls this in a child).
    report_progress: True prints progress lines for a parent; a callable gets (step, seconds) per step
    and, if it has one, its close() at the end. on_built: called with the build.Built before training
    (distributed.py's ranks add their callbacks and hooks there, and keep the trainer to save the adapter)."""
    try:
        return _run_here(recipe, budget_gib, report_progress, on_built)
    finally:
        if hasattr(report_progress, "close"):
            report_progress.close()


def _run_here(recipe: Recipe, budget_gib: float | None, report_progress, on_built=None) -> Measurement:
    """run_here's body."""
    import torch

    from .build import build
    from .hardware import GiB, device_type, resolve_precision
    from .memtrack import BudgetExceeded, MemoryTracker, model_state_tensors, tensor_bytes
    from .provenance import environment

    t0 = time.perf_counter()
    startup = _startup_s()
    device = device_type()
    env = environment()
    budget = int(budget_gib * GiB) if budget_gib is not None else None
    tracker = MemoryTracker(device, budget_bytes=budget)
    probe = Probe(recipe, tracker, device, report_progress)
    base = dict(recipe=recipe.to_dict(), recipe_key=recipe.key, env=_env_dict(env), env_key=env.key,
                date=_now(), command=_command(), run_id=os.environ.get(RUN_ID_ENV, ""))
    workdir = temp_folder(TEMP_PREFIXES[1])  # the trainer's output_dir, removed after
    try:
        built = build(recipe, callbacks=(callback(probe),), output_dir=workdir.name)
        build_s = round(time.perf_counter() - t0, 2)
    except BaseException as exc:  # out of memory while loading is a result too: the model alone does not fit
        workdir.cleanup()  # on every way out, Ctrl-C included
        if not (isinstance(exc, Exception) and is_out_of_memory(exc)):
            raise
        return Measurement(**base, status="does_not_fit", error=f"out of memory while loading the model: "
                           f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                           precision=resolve_precision(recipe.precision), duration_s=round(time.perf_counter() - t0, 2),
                           startup_s=startup, notes=[n for n in [apply_profile_note()] if n])
    model = built.trainer.model
    model.register_forward_pre_hook(probe.forward_pre, with_kwargs=True)
    model.register_forward_hook(probe.forward_post, with_kwargs=True)
    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(probe.grad_ready)
    status, error = "ok", ""
    try:
        if on_built is not None:
            on_built(built)
        built.trainer.train()
    except torch.OutOfMemoryError as exc:  # BudgetExceeded is one too
        status = "does_not_fit"
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        if isinstance(exc, BudgetExceeded):
            error += f" (simulated budget {budget_gib} GiB)"
    finally:
        if probe.tracking:
            probe.stop_tracking()
        workdir.cleanup()
    if status == "ok":
        check_sane(recipe, probe)
    # the median step, so one step slowed by a busy machine does not move the figure
    rate = statistics.median(probe.step_rates) if probe.step_rates and status == "ok" else None
    cuda = device == "cuda"
    return Measurement(
        **base,
        status=status,
        error=error,
        peak_bytes=tracker.peak,
        peak_by_category=dict(tracker.peak_by_category),
        cuda_max_allocated=torch.cuda.max_memory_allocated() if cuda else None,
        cuda_max_reserved=torch.cuda.max_memory_reserved() if cuda else None,
        tokens_per_s=round(rate, 1) if rate else None,
        losses=probe.losses,
        precision=built.precision,
        trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        model_bytes=tensor_bytes(model_state_tensors(model)),
        duration_s=round(time.perf_counter() - t0, 2),
        startup_s=startup,
        build_s=build_s,
        notes=built.notes,
        timing=probe.timing() if status == "ok" else {},
    )


def is_out_of_memory(exc: BaseException) -> bool:
    """True for every way running out of device memory surfaces: torch's OutOfMemoryError, and the
    RuntimeErrors that CUDA kernels (bitsandbytes' among them) and accelerate raise."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, ValueError)) and ("out of memory" in text or "cuda_error_out_of_memory" in text)


def apply_profile_note() -> str | None:
    """The device profile's note for a result (None without a profile)."""
    from .hardware import active_profile

    prof = active_profile()
    return f"{prof.label}: {prof.card_bytes / 2**30:.2f} GiB for the whole card" if prof else None


def main(argv: list[str] | None = None) -> int:
    """Child entry point: python -m course_utils.measure --recipe JSON --out FILE."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipe", required=True, help="Recipe as JSON (Recipe.to_dict())")
    parser.add_argument("--out", required=True, help="where to write the Measurement JSON")
    parser.add_argument("--budget-gib", type=float, default=None)
    args = parser.parse_args(argv)
    try:
        recipe = Recipe.from_dict(json.loads(args.recipe))
        result = run_here(recipe, args.budget_gib, report_progress=True).to_json()
    except Exception as exc:  # an error the parent raises again as the same type, with the same message
        if type(exc).__name__ not in CHILD_ERRORS:
            raise
        Path(args.out).write_text(json.dumps(_child_error(exc)))
        return 3
    Path(args.out).write_text(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())


# the driver (many recipes, in order) lives in runs.py; notebooks and scripts import it from here too
from .runs import Outcome, Results, ladder_here, measure_all, run_ladder, sweep  # noqa: E402,F401
