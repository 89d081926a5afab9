"""Where the parent and the child of a measurement meet: the environment a measuring process starts with, the
progress lines it prints and the bar that shows them, the result or the error it hands back, its temporary
folders. Below both sides: child.py (the child) and measure.py and distributed.py (the parents) import it.
"""

from __future__ import annotations

import datetime as _dt
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from course_utils.guards import alive
from course_utils.machine import HardwareError
from course_utils.models import ModelUnavailableError, uses_shipped_data
from course_utils.recipe import Recipe, RecipeError
from course_utils.results import Measurement, environment

LAUNCHED_ENV = "COURSE_LAUNCHED_AT"  # when the parent started a measuring child (time.time())
RUN_ID_ENV = "COURSE_RUN_ID"  # the measurement run a result belongs to (scripts/gpu/reference_runs.py sets it)


class MeasurementError(RuntimeError):
    """The training process failed for a reason other than memory; the message has its log's tail."""


TEMP_PREFIXES = ("course-measure-", "course-run-")  # + the owner's pid: see temp_folder()


def temp_folder(prefix: str) -> tempfile.TemporaryDirectory:
    """A temporary folder named after this process (prefix + pid + '-'), removed when its block ends. Those
    of processes that no longer exist (killed with kill -9, which no cleanup survives) are removed first."""
    root = Path(tempfile.gettempdir())
    for stale in root.glob(f"{prefix}*-*"):
        pid = stale.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-")


CHILD_ERRORS = ("RecipeError", "HardwareError", "ModelUnavailableError", "MeasurementError")


def _child_error(exc: BaseException) -> dict:
    """What a child writes instead of a result when the recipe cannot run: the error's type and message."""
    return {"child_error": type(exc).__name__, "message": str(exc)}


def _does_not_fit(recipe: Recipe, why: str) -> Measurement:
    """A 'does not fit' result, for when the process died before it could write one."""

    env = environment()
    return Measurement(recipe=recipe.to_dict(), recipe_key=recipe.key, env=_env_dict(env), env_key=env.key,
                       status="does_not_fit", error=why, date=_now(), command=_command(),
                       run_id=os.environ.get(RUN_ID_ENV, ""))


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


PROGRESS = "@@course-progress"  # the prefix of a progress line the child prints for its parent


def child_env(recipe: Recipe) -> dict:
    """The measuring child's environment. A model trained on the shipped data ('tiny', a preset) never
    needs the hub, so its child is told so and opens no connection."""

    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", COURSE_COMMAND=_command(),
               **{LAUNCHED_ENV: repr(time.time())})
    if uses_shipped_data(recipe.model):
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return env


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


def _read_child_result(d: dict) -> Measurement:
    """The child's result, or the error it reported, raised here as the same type with the same one-line
    message (no child traceback: the message says what was wrong and what to do)."""
    if "child_error" not in d:
        return Measurement.from_dict(d)

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
