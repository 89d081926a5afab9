"""The measuring child's probe: a Trainer callback plus module hooks that mark the tracker's phases, track
the one tracked step, time the others, record the losses and report progress to the parent."""

from __future__ import annotations

import statistics
import time

from .recipe import Recipe

PROGRESS = "@@course-progress"  # the prefix of a progress line the child prints for its parent


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


def callback(probe: Probe):
    """Wrap the probe as a transformers TrainerCallback."""
    from transformers import TrainerCallback

    class ProbeCallback(TrainerCallback):
        pass

    cb = ProbeCallback()
    for name in ("on_step_begin", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end", "on_log"):
        setattr(cb, name, getattr(probe, name))
    return cb
