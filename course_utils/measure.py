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
from dataclasses import dataclass
from pathlib import Path

from .recipe import Recipe
from .results import Measurement, ResultStore, default_store

PROGRESS = "@@course-progress"
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
    from .hardware import environment

    store = store or default_store()
    env = environment()
    if not force and budget_gib is None:
        found = store.find(recipe, env.key)
        if found is not None and not found.noisy:  # a speed from a busy machine is measured again
            found.cached = True
            return _as_asked(found, recipe)
    check_runnable(recipe)  # a recipe that cannot run here is refused before anything starts
    if budget_gib is None:
        _check_writable(store)  # and a result that could not be stored is not measured
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


def _check_writable(store: ResultStore) -> None:
    """The store's own up-front check, where the store has one."""
    check = getattr(store, "check_writable", None)
    if check is not None:
        check()


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
        log: list[str] = []
        bar = _progress_bar(recipe, progress)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        timed_out = threading.Event()

        def stop() -> None:
            timed_out.set()
            proc.kill()

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
                proc.kill()
                proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]
        if timed_out.is_set():
            raise MeasurementError(f"measuring {recipe.name!r} took longer than {timeout_s} s; stopped it.")
        if out.exists():
            return _read_child_result(json.loads(out.read_text()))
        tail = "".join(log[-40:])
        if code in (-9, 137):  # the kernel's out-of-memory killer on CPU
            return _does_not_fit(recipe, "the training process was killed (out of host memory)")
        raise MeasurementError(f"measuring {recipe.name!r} failed (exit code {code}). Last lines of its log:\n{tail}")


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
    from .hardware import environment

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


class _Probe:
    """Trainer callback + hooks: phases for the tracker, the tracked step, timing, losses."""

    def __init__(self, recipe: Recipe, tracker, device: str, report_progress=False):
        self.recipe, self.tracker, self.device = recipe, tracker, device
        self.report_progress = report_progress  # True: print for the parent; a callable: (step, seconds)
        self.batch_sizes: set[int] = set()  # sequences per forward: must be the recipe's micro-batch
        self._t_begin = time.perf_counter()
        self.losses: list[float] = []
        self.tokens = 0
        self.step_rates: list[float] = []  # tokens/s of each timed step
        self.step_cpu: list[float] = []  # CPU seconds / (wall seconds x threads) of each timed step
        self._cpu_last = None
        self._t_last = None
        self._tokens_last = 0
        self.tracking = False
        self.warmup_peak = None
        self.cuda_peaks = (None, None)

    # module hooks: the outermost forward marks the activations phase
    def forward_pre(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            self.tokens += ids.numel()
            self.batch_sizes.add(int(ids.shape[0]))
        self.tracker.phase = "forward"

    def forward_post(self, module, args, kwargs, output):
        self.tracker.phase = "after_forward"

    def grad_ready(self, param):
        if self.tracking:
            self.tracker.classify([param.grad], "gradients")

    # trainer callbacks
    def _sync(self):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kw):
        import torch

        from .memtrack import model_state_tensors, optimizer_state_tensors

        if self.device == "cuda":
            from .hardware import apply_profile

            apply_profile()  # again, each step: kernels load on first use, and the contexts grow with them
        if state.global_step == self.recipe.warmup_steps:  # the tracked step starts
            self.tracker.phase = "idle"
            self.tracker.classify(model_state_tensors(model), "parameters")
            if optimizer is not None:
                self.tracker.classify(optimizer_state_tensors(optimizer), "optimizer")
            self.tracker.reset_peak()
            if self.device == "cuda":
                self._sync()
                torch.cuda.reset_peak_memory_stats()
            # On CUDA, autograd runs backward on its own device thread, where our dispatch mode is not
            # active; for the tracked step, run backward on this thread so every allocation is seen.
            self._single_thread = torch.autograd.set_multithreading_enabled(False)
            self._single_thread.__enter__()
            self.tracker.__enter__()
            self.tracking = True

    def stop_tracking(self):
        """Leave the tracker and single-threaded backward."""
        self.tracker.__exit__(None, None, None)
        self._single_thread.__exit__(None, None, None)
        self.tracking = False

    def on_pre_optimizer_step(self, args, state, control, **kw):
        self.tracker.phase = "optimizer"

    def on_optimizer_step(self, args, state, control, optimizer=None, **kw):
        from .memtrack import optimizer_state_tensors

        if self.tracking and optimizer is not None:
            self.tracker.classify(optimizer_state_tensors(optimizer), "optimizer")
        self.tracker.phase = "idle"

    def on_step_end(self, args, state, control, **kw):
        if self.tracking:  # the tracked step is over: stop tracking, start the clock
            self.stop_tracking()
        elif self._t_last is not None:
            self._sync()
            now = time.perf_counter()
            self.step_rates.append((self.tokens - self._tokens_last) / (now - self._t_last))
            self.step_cpu.append((time.process_time() - self._cpu_last) / ((now - self._t_last) * self._threads()))
        if state.global_step > self.recipe.warmup_steps:
            self._sync()
            self._t_last, self._tokens_last = time.perf_counter(), self.tokens
            self._cpu_last = time.process_time()
        took = round(time.perf_counter() - self._t_begin, 2)
        self._t_begin = time.perf_counter()
        if callable(self.report_progress):  # measuring in this process: the bar is ours
            self.report_progress(state.global_step, took)
        elif self.report_progress:  # a child tells its parent, which draws the progress bar
            print(f"{PROGRESS} {state.global_step} {took}", flush=True)

    @staticmethod
    def _threads() -> int:
        """The threads torch computes with on a CPU (1 on a GPU, where the CPU only launches kernels)."""
        import torch

        return max(1, torch.get_num_threads())

    def timing(self) -> dict:
        """How steady the timed steps were: spread of their tokens/s, and (CPU) the share of the cores' time
        the process got. A busy machine shows in one or the other (results.Measurement.noisy)."""
        out = {"timed_steps": len(self.step_rates)}
        if len(self.step_rates) >= 2:
            out["spread"] = round((max(self.step_rates) - min(self.step_rates)) / statistics.median(self.step_rates), 3)
        if self.device == "cpu" and self.step_cpu:
            out["cpu_share"] = round(statistics.median(self.step_cpu), 3)
        return out

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def _callback(probe: _Probe):
    """Wrap the probe as a transformers TrainerCallback."""
    from transformers import TrainerCallback

    class ProbeCallback(TrainerCallback):
        pass

    cb = ProbeCallback()
    for name in ("on_step_begin", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end", "on_log"):
        setattr(cb, name, getattr(probe, name))
    return cb


def _startup_s() -> float:
    """Seconds from the parent starting this measuring process to now (its imports), or 0.0 in-process."""
    try:
        return round(max(0.0, time.time() - float(os.environ.pop(LAUNCHED_ENV))), 2)
    except (KeyError, ValueError):
        return 0.0


def check_sane(recipe: Recipe, probe: "_Probe") -> None:
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


def run_here(recipe: Recipe, budget_gib: float | None = None, report_progress=False) -> Measurement:
    """Build and train the recipe in this process and measure it (measure() calls this in a child).
    report_progress: True prints progress lines for a parent; a callable gets (step, seconds) per step
    and, if it has one, its close() at the end."""
    try:
        return _run_here(recipe, budget_gib, report_progress)
    finally:
        if hasattr(report_progress, "close"):
            report_progress.close()


def _run_here(recipe: Recipe, budget_gib: float | None, report_progress) -> Measurement:
    """run_here's body."""
    import torch

    from .build import build
    from .hardware import GiB, device_type, environment, resolve_precision
    from .memtrack import BudgetExceeded, MemoryTracker, model_state_tensors, tensor_bytes

    t0 = time.perf_counter()
    startup = _startup_s()
    device = device_type()
    env = environment()
    budget = int(budget_gib * GiB) if budget_gib is not None else None
    tracker = MemoryTracker(device, budget_bytes=budget)
    probe = _Probe(recipe, tracker, device, report_progress)
    base = dict(recipe=recipe.to_dict(), recipe_key=recipe.key, env=_env_dict(env), env_key=env.key,
                date=_now(), command=_command(), run_id=os.environ.get(RUN_ID_ENV, ""))
    workdir = temp_folder(TEMP_PREFIXES[1])  # the trainer's output_dir, removed after
    try:
        built = build(recipe, callbacks=(_callback(probe),), output_dir=workdir.name)
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


# ---------------------------------------------------------------------------------------------
# the driver: many recipes, in order
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """One recipe of a measure_all run: its Measurement (labelled as the recipe), or why it was skipped."""

    recipe: Recipe
    measurement: Measurement | None = None
    skipped: str = ""  # why it was not measured; "" when it was
    seconds: float = 0.0  # wall time of its measure() call (0.0 when skipped)

    @property
    def label(self) -> str:
        """The recipe's display name."""
        return self.recipe.name


class Results(list):
    """What measure_all returns: one Outcome per recipe, in the order they were asked for."""

    @property
    def measured(self) -> list[Measurement]:
        """The Measurements of the recipes that ran (or came from the store), in order, labelled as asked."""
        return [o.measurement for o in self if o.measurement is not None]

    @property
    def skipped(self) -> dict[int, str]:
        """{position: why} for the recipes that were not measured."""
        return {i: o.skipped for i, o in enumerate(self) if o.measurement is None}

    def table(self):
        """results.results_table of every recipe, in order: a skipped one is a row with its reason."""
        from .results import results_table
        from .tables import Note

        table = results_table(self.measured)
        for i, why in sorted(self.skipped.items()):
            table.rows.insert(i, [self[i].label, Note(f"skipped: {why}")])
        return table


def measure_all(recipes, *, store: ResultStore | None = None, force: bool = False, progress: bool = True,
                isolate: bool | None = None, skip: dict[int, str] | None = None, desc: str = "recipes",
                timeout_s: float | None = None, keep_going: bool = False, after_each=None) -> Results:
    """Measure each recipe with measure(), in order; the one loop every driver of the course sits on.

    skip: {position: why} for recipes not to measure (their Outcome keeps the reason). Every other recipe is
    checked with checks.check_runnable before the first one is measured, so a bad one costs no run.
    isolate: as in measure(), but None by default (a fresh process on a GPU, this process on a CPU).
    keep_going=True: a run that fails (MeasurementError, not 'does not fit') is skipped with its error, and
    the rest are measured. after_each(results so far) is called after each recipe (scripts print there).
    desc names the progress bar over the recipes (progress=False: no bars).
    """
    from tqdm.auto import tqdm

    from .checks import check_runnable

    recipes, skip = list(recipes), dict(skip or {})
    outside = sorted(set(skip) - set(range(len(recipes))))
    if outside:
        raise ValueError(f"skip names position(s) {outside}, but there are {len(recipes)} recipes "
                         f"(positions 0 to {len(recipes) - 1}); give reasons only for recipes in the list.")
    for i, recipe in enumerate(recipes):
        if i not in skip:
            check_runnable(recipe)
    results = Results()
    bar = tqdm(recipes, desc=desc, unit="recipe", disable=not progress)
    for i, recipe in enumerate(bar):
        bar.set_postfix_str(recipe.name[:30])
        if i in skip:
            results.append(Outcome(recipe, None, skip[i]))
        else:
            results.append(_measure_one(recipe, keep_going, store=store, force=force, progress=progress,
                                        isolate=isolate, timeout_s=timeout_s))
        if after_each is not None:
            after_each(results)
    return results


def _measure_one(recipe: Recipe, keep_going: bool, **how) -> Outcome:
    """measure(recipe, **how) as an Outcome; with keep_going, a failed run is one skipped with its error."""
    started = time.perf_counter()
    try:
        m = measure(recipe, **how)
    except MeasurementError as exc:
        if not keep_going:
            raise
        return Outcome(recipe, None, f"failed: {exc}", round(time.perf_counter() - started, 1))
    return Outcome(recipe, m, "", round(time.perf_counter() - started, 1))


def ladder_here(base: Recipe, upto: int | None = None) -> tuple[list[Recipe], dict[int, str]]:
    """The chapter's ladder from `base` (its first `upto` rungs) as it runs here, mixed precision resolved,
    and {position: why} for the rungs that are then the same recipe as the rung above (on a CPU, mixed
    precision is fp32, so that rung is the one before it)."""
    from .hardware import device_type, resolve_precision
    from .recipe import ladder

    asked = ladder(base)[:upto]
    rungs = [rung.with_(precision=resolve_precision(rung.precision), label=rung.label) for rung in asked]
    same = {i: _same_as_above(asked[i - 1], asked[i], device_type())
            for i in range(1, len(rungs)) if rungs[i].key == rungs[i - 1].key}
    return rungs, same


def run_ladder(base: Recipe, *, store: ResultStore | None = None, force: bool = False, progress: bool = True,
               upto: int | None = None, isolate: bool | None = None) -> tuple[list[Measurement], dict[int, str]]:
    """Measure the chapter's ladder from `base`, one technique added per rung (the first `upto` rungs).

    Returns a measurement per rung in order and the rungs skipped here, with the reason (ladder_here); a
    skipped rung's entry is the rung above's measurement under its own recipe. isolate: as in measure();
    the default runs each rung in a fresh process on a GPU and in this process on a CPU, where the
    tensor-level figures are the same and seven process start-ups would cost most of a minute.
    """
    rungs, same = ladder_here(base, upto)
    results = measure_all(rungs, store=store, force=force, progress=progress, isolate=isolate, skip=same,
                          desc="ladder")
    out: list[Measurement] = []
    for o in results:
        out.append(o.measurement or Measurement(**{**out[-1].__dict__, "recipe": o.recipe.to_dict(), "cached": True}))
    return out, results.skipped


def _same_as_above(before: Recipe, rung: Recipe, device: str) -> str:
    """Why a rung is the same recipe as the one above it here: what it sets, and why that changes nothing."""
    changed = {f: getattr(rung, f) for f in ("precision", "micro_batch", "grad_accum", "optimizer",
                                             "gradient_checkpointing", "load_in_4bit", "max_seq_length")
               if getattr(rung, f) != getattr(before, f)}
    if changed.get("precision") == "auto":
        return f"precision=auto is fp32 on {device}: same recipe as the rung above"
    if not changed:
        return (f"the rung above already has what it sets ({rung.micro_batch}x{rung.grad_accum}, {rung.optimizer}, "
                f"{'ckpt' if rung.gradient_checkpointing else 'no ckpt'}): same recipe")
    said = ", ".join(f"{k}={v}" for k, v in changed.items())
    return f"its change ({said}) is already in the rung above: same recipe"


def sweep(base: Recipe, knob: str, values, *, isolate: bool | None = None, store: ResultStore | None = None,
          progress: bool = True) -> list[Measurement]:
    """Measure `base` with one knob set to each of `values` (e.g. max_seq_length over 64..512).

    By default (isolate=None) the runs share this process on a CPU (tensor-level figures are the
    same as in a fresh process, and a sweep takes seconds, not minutes); on a GPU each is isolated.
    """
    recipes = [base.with_(**{knob: value}, label=f"{knob}={value}") for value in values]
    return measure_all(recipes, store=store, progress=progress, isolate=isolate, desc=f"{knob} sweep").measured
