"""The measuring child: `python -m course_utils.child --recipe JSON --out FILE` builds the recipe, trains it
under the probe (a Trainer callback plus module hooks that mark the tracker's phases, track the one
tracked step and time the others) and writes a Measurement as JSON. The parent's side is measure.py,
which imports this module, never the reverse.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from course_utils import machine
from course_utils.build import build
from course_utils.common import GiB
from course_utils.guards import beside_callback, loss_problem, measuring
from course_utils.launch import (CHILD_ERRORS, LAUNCHED_ENV, PROGRESS, RUN_ID_ENV, TEMP_PREFIXES,  # noqa: F401
                                 MeasurementError, _child_error, _command, _does_not_fit, _env_dict, _now,
                                 temp_folder)
from course_utils.machine import apply_profile, resolve_precision
from course_utils.recipe import Recipe
from course_utils.results import Measurement, environment

# ---------------------------------------------------------------------------------------------
# child side
# ---------------------------------------------------------------------------------------------
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
    problem = loss_problem(probe.losses)
    if problem:
        raise MeasurementError(
            f"{recipe.name!r} did not train: with learning_rate={recipe.learning_rate:g}, {problem}; nothing was "
            "stored. Try a smaller learning rate such as 1e-3 (course run --lr 1e-3; the chapter uses 2e-4).")


def run_here(recipe: Recipe, budget_gib: float | None = None, report_progress=False, on_built=None,
             checked: bool = False) -> Measurement:
    """Build and train the recipe in this process and measure it (measure() calls this in a child).
    report_progress: True prints progress lines for a parent; a callable gets (step, seconds) per step
    and, if it has one, its close() at the end. on_built: called with the build.Built before training
    (distributed.py's ranks add their callbacks and hooks there, and keep the trainer to save the adapter).
    checked=True: checks.check_runnable ran on it in this process (build checks nothing again)."""
    try:
        with measuring():  # from the build on (it loads the CPU too), other measurements here see this one
            return _run_here(recipe, budget_gib, report_progress, on_built, checked)
    finally:
        if hasattr(report_progress, "close"):
            report_progress.close()


def _run_here(recipe: Recipe, budget_gib: float | None, report_progress, on_built=None, checked=False) -> Measurement:
    """run_here's body."""
    import torch

    from course_utils.memtrack import BudgetExceeded, MemoryTracker, model_state_tensors, tensor_bytes

    t0 = time.perf_counter()
    startup = _startup_s()
    device = machine.device_type()
    env = environment()
    budget = int(budget_gib * GiB) if budget_gib is not None else None
    tracker = MemoryTracker(device, budget_bytes=budget)
    probe = Probe(recipe, tracker, device, report_progress)
    base = dict(recipe=recipe.to_dict(), recipe_key=recipe.key, env=_env_dict(env), env_key=env.key,
                date=_now(), command=_command(), run_id=os.environ.get(RUN_ID_ENV, ""))
    workdir = temp_folder(TEMP_PREFIXES[1])  # the trainer's output_dir, removed after
    try:
        built = build(recipe, callbacks=(callback(probe),), output_dir=workdir.name, checked=checked)
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
    status, error, beside = "ok", "", set()
    try:
        if on_built is not None:
            on_built(built)
        built.trainer.add_callback(beside_callback(beside))  # this one sees the others (each step)
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
        timing={**probe.timing(), **({"others": len(beside)} if beside else {})} if status == "ok" else {},
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

    prof = machine.active_profile()
    return f"{prof.label}: {prof.card_bytes / 2**30:.2f} GiB for the whole card" if prof else None


def main(argv: list[str] | None = None) -> int:
    """Child entry point: python -m course_utils.child --recipe JSON --out FILE."""
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

class Probe:
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

        from course_utils.memtrack import model_state_tensors, optimizer_state_tensors

        if self.device == "cuda":

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
            # torch.compile'd code (Recipe(compile_layers=True), torch_compile) runs eagerly in the tracked step: a
            # compiled function called under a dispatch mode is skipped by Dynamo, and then for good, so the timed
            # steps would have run eagerly too (tests/test_compiled_layers.py). The stance keeps it for the next steps.
            stance = getattr(torch.compiler, "set_stance", None)  # torch 2.6 on; before it, no stance to take
            self._eager = stance("force_eager") if stance else contextlib.nullcontext()
            self._eager.__enter__()
            self.tracker.__enter__()
            self.tracking = True

    def stop_tracking(self):
        """Leave the tracker, the eager stance and single-threaded backward."""
        self.tracker.__exit__(None, None, None)
        self._eager.__exit__(None, None, None)
        self._single_thread.__exit__(None, None, None)
        self.tracking = False

    def on_pre_optimizer_step(self, args, state, control, **kw):
        self.tracker.phase = "optimizer"

    def on_optimizer_step(self, args, state, control, optimizer=None, **kw):
        from course_utils.memtrack import optimizer_state_tensors

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


def callback(probe: Probe):
    """Wrap the probe as a transformers TrainerCallback."""
    from transformers import TrainerCallback

    class ProbeCallback(TrainerCallback):
        pass

    cb = ProbeCallback()
    for name in ("on_step_begin", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end", "on_log"):
        setattr(cb, name, getattr(probe, name))
    return cb


if __name__ == "__main__":
    sys.exit(main())
