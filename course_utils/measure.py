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

import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from course_utils import checks, machine
from course_utils.child import callback, run_here  # noqa: F401
from course_utils.launch import (TEMP_PREFIXES, MeasurementError, _does_not_fit, _progress_bar,  # noqa: F401
                                 _read_child_result, child_env, relay, temp_folder)
from course_utils.checks import _same_as_above, ladder_here  # noqa: F401  (notebooks 01-05 import it here)
from course_utils.recipe import RungError, Recipe, rungs_through
from course_utils.results import Measurement, ResultStore, default_store, environment
from course_utils.show.report import read_back_line, results_table

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
    checked: bool = False,
) -> Measurement:
    """Measure one recipe in a fresh process, or return the stored result of an identical run.

    budget_gib simulates a smaller device: past it, the run stops and is marked "does not fit".
    force=True re-runs even when the store already has this recipe in this environment.
    isolate=False trains in this process instead (no 7 s start-up): the tensor-level figures are
    the same, but on CUDA the allocator's own peaks would include what this process already holds,
    so it is only taken on a CPU. isolate=None: a fresh process on a GPU, this process on a CPU.
    checked=True: the caller (measure_all) already ran checks.check_runnable on this recipe.
    """
    store = store or default_store()
    env = environment()
    if not force and budget_gib is None:
        found = store.find(recipe, env.key)
        if found is not None and not found.noisy:  # a speed from a busy machine is measured again
            found.cached = True
            found = _as_asked(found, recipe)
            if progress:  # what is read back says so, with the date it was measured
                _say(read_back_line(found))
            return found
    if not checked:
        checks.check_runnable(recipe)  # a recipe that cannot run here is refused before anything starts
    if budget_gib is None:
        store.check_writable()  # and a result that could not be stored is not measured
    if isolate or env.device_type != "cpu":
        result = _run_child(recipe, budget_gib, progress, timeout_s)
    else:
        result = run_here(recipe, budget_gib, report_progress=_progress_bar(recipe, progress), checked=True)
    if budget_gib is None:
        store.add(result)
    return _as_asked(result, recipe)


def _say(line: str) -> None:
    """One line beside the progress bars (tqdm.write: a terminal's bar is redrawn under it)."""
    from tqdm.auto import tqdm

    tqdm.write(line)


def _as_asked(m: Measurement, recipe: Recipe) -> Measurement:
    """The measurement with the asked recipe's label (the label is not part of the key, so a stored result
    may carry the label of the run that stored it). A new dict: a shared one is left as it was."""
    m.recipe = {**m.recipe, "label": recipe.label}
    return m


def _run_child(recipe: Recipe, budget_gib: float | None, progress: bool, timeout_s: float | None) -> Measurement:
    """Start `python -m course_utils.measure`, relay its progress, read its JSON result."""
    with temp_folder(TEMP_PREFIXES[0]) as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "course_utils.child", "--recipe", json.dumps(recipe.to_dict()), "--out", str(out)]
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

    def table(self, measured: list[Measurement] | None = None):
        """results.results_table of every recipe, in order: a skipped one is a row with its reason. measured: the
        measured ones as they are now (timed again by time_again), in place of the first measurements."""
        return results_table(self.measured if measured is None else measured,
                             {self[i].label: why for i, why in self.skipped.items()}, order=[o.label for o in self])


def measure_all(recipes, *, store: ResultStore | None = None, force: bool = False, progress: bool = True,
                isolate: bool | None = None, skip: dict[int, str] | None = None, desc: str = "recipes",
                timeout_s: float | None = None, keep_going: bool = False, after_each=None,
                stop_when=None, checked: bool = False) -> Results:
    """Measure each recipe with measure(), in order; the one loop every driver of the course sits on.

    skip: {position: why} for recipes not to measure (their Outcome keeps the reason). Every other recipe is
    checked with checks.check_runnable before the first one is measured, so a bad one costs no run (checked=True:
    the caller did, as checks.ladder_here does for the ladder's rungs).
    isolate: as in measure(), but None by default (a fresh process on a GPU, this process on a CPU).
    keep_going=True: a run that fails (MeasurementError, not 'does not fit') is skipped with its error, and
    the rest are measured. after_each(results so far) is called after each recipe (scripts print there).
    desc names the progress bar over the recipes (progress=False: no bars).
    stop_when(outcome) -> a reason, or None: once it gives a reason, every later recipe is skipped with it.
    """
    from tqdm.auto import tqdm


    recipes, skip = list(recipes), dict(skip or {})
    outside = sorted(set(skip) - set(range(len(recipes))))
    if outside:
        raise ValueError(f"skip names position(s) {outside}, but there are {len(recipes)} recipes "
                         f"(positions 0 to {len(recipes) - 1}); give reasons only for recipes in the list.")
    for i, recipe in enumerate(recipes):
        if i not in skip and not checked:
            checks.check_runnable(recipe)
    results = Results()
    bar = tqdm(recipes, desc=desc, unit="recipe", disable=not progress)
    stopped = ""
    for i, recipe in enumerate(bar):
        bar.set_postfix_str(recipe.name[:30])
        if i in skip or stopped:
            results.append(Outcome(recipe, None, skip.get(i, stopped)))
        else:
            results.append(_measure_one(recipe, keep_going, store=store, force=force, progress=progress,
                                        isolate=isolate, timeout_s=timeout_s, checked=True))
            stopped = (stop_when(results[-1]) if stop_when is not None else None) or ""
        if after_each is not None:
            after_each(results)
    return results


def _measure_one(recipe: Recipe, keep_going: bool, **how) -> Outcome:
    """measure(recipe, **how) as an Outcome; with keep_going, a failed run is one skipped with its error."""
    from course_utils.child import MeasurementError  # at call time: tests replace measure.measure

    started = time.perf_counter()
    try:
        m = measure(recipe, **how)
    except MeasurementError as exc:
        if not keep_going:
            raise
        return Outcome(recipe, None, f"failed: {exc}", round(time.perf_counter() - started, 1))
    return Outcome(recipe, m, "", round(time.perf_counter() - started, 1))


class Rungs(list):
    """run_ladder's measurements, in the ladder's order, addressed by rung name (RUNG_NAMES) as well as by
    position: `rungs["+ 8-bit AdamW"]` is that rung, `rungs["+ 8-bit AdamW":"+ paged 8-bit AdamW"]` the rungs
    from one to the other, both included, and `rungs["+ 8-bit AdamW":]` the rungs from it on. A rung skipped
    here is not in the list: `skipped` says why."""

    def __init__(self, measured, skipped: dict[str, str]):
        super().__init__(measured)
        self.skipped = skipped

    def __getitem__(self, key):
        if isinstance(key, str):
            return super().__getitem__(self._position(key))
        if isinstance(key, slice) and (isinstance(key.start, str) or isinstance(key.stop, str)):
            start = self._position(key.start) if key.start is not None else None
            stop = self._position(key.stop) + 1 if key.stop is not None else None
            return super().__getitem__(slice(start, stop, key.step))
        return super().__getitem__(key)

    def _position(self, name: str) -> int:
        """Where the rung named `name` is in the list; RungError when the ladder has none of that name or it was
        not measured here."""
        for i, m in enumerate(self):
            if m.label == name:
                return i
        if name in self.skipped:
            raise RungError(f"The rung {name!r} was not measured here: {self.skipped[name]}.")
        rungs_through(name)  # an unknown name says which names there are
        raise RungError(f"The rung {name!r} was not measured: run_ladder stopped before it (through=).")


def run_ladder(base: Recipe, *, store: ResultStore | None = None, force: bool = False, progress: bool = True,
               through: str | None = None, isolate: bool | None = None,
               repeat_last: int = 0) -> tuple[Rungs, dict[str, str]]:
    """Measure the chapter's ladder from `base`, one technique added per rung, up to the rung named `through`
    (one of RUNG_NAMES; None: every rung).

    Returns the measured rungs in order (Rungs: a list that also takes a rung's name) and {rung name: why} for
    the rungs skipped here (ladder_here), which are not measured and not in the list. isolate: as in
    measure(); the default runs each rung in a fresh process on a GPU and in this process on a CPU, where the
    tensor-level figures are the same and seven process start-ups would cost most of a minute.
    repeat_last=N: after the ladder, the last N rungs measured are timed again in reverse order (time_again), so
    the speeds a notebook compares carry their spread in this run.
    """
    rungs, same = ladder_here(base, through)  # checked there, once
    results = measure_all(rungs, store=store, force=force, progress=progress, isolate=isolate, skip=same,
                          desc="ladder", checked=True)
    skipped = {results[i].label: why for i, why in results.skipped.items()}
    measured = results.measured
    if repeat_last:
        cut = max(0, len(measured) - repeat_last)
        measured = measured[:cut] + time_again(measured[cut:], store=store, isolate=isolate, progress=progress)
    return Rungs(measured, skipped), skipped


def time_again(measurements, *, store: ResultStore | None = None, isolate: bool | None = None,
               progress: bool = True) -> list[Measurement]:
    """The measurements, each timed once more in the reverse of the order given (measured A, B, C: timed again
    C, B, A), so a machine that got slower or faster meanwhile moves every speed alike. Only the speed is
    taken again (the memory figures are exact); each result gets `speeds` (all its timings in this run) and
    tokens_per_s becomes their median. Measurements that did not fit, or have no speed, are returned as
    they are; so are ones read back from the store with their repeats already recorded, when every one of
    them was (nothing was measured now). Repeated results measured here are stored again, with their speeds.
    """
    ms = list(measurements)
    timed = [m for m in ms if m.fits and m.tokens_per_s]
    if all(m.cached and len(m.speeds) >= 2 for m in timed):
        return ms
    store = store or default_store()
    again = {}
    for m in reversed(timed):
        r = _time_once(m.recipe_obj, isolate, progress)
        if r.fits and r.tokens_per_s:
            again[id(m)] = r
    out = []
    for m in ms:
        r = again.get(id(m))
        if r is None:
            out.append(m)
            continue
        speeds = (m.speeds or [m.tokens_per_s]) + [r.tokens_per_s]
        spread = max(m.timing.get("spread", 0.0), r.timing.get("spread", 0.0))
        new = dataclasses.replace(m, speeds=speeds, tokens_per_s=round(statistics.median(speeds), 1),
                                  timing={**m.timing, **({"spread": spread} if spread else {})})
        if new.source == "measured here":
            store.add(new)
        out.append(new)
    return out


def _time_once(recipe: Recipe, isolate: bool | None, progress: bool) -> Measurement:
    """One more run of `recipe` for its speed, as measure() would run it (a fresh process on a GPU or with
    isolate=True, this process on a CPU), not stored."""
    if isolate or machine.device_type() != "cpu":
        return _run_child(recipe, None, progress, None)
    return run_here(recipe, None, report_progress=_progress_bar(recipe, progress), checked=True)  # measured before


GROWING = ("max_seq_length", "micro_batch")  # knobs whose memory only grows with the value


class Sweep(list):
    """sweep's Measurements, in the order of the values that ran; `skipped` is {label: why} for the values not run
    (results_table(points, points.skipped) shows them as skip rows)."""

    def __init__(self, measured, skipped: dict[str, str]):
        super().__init__(measured)
        self.skipped = skipped


def sweep(base: Recipe, knob: str, values, *, isolate: bool | None = None, store: ResultStore | None = None,
          progress: bool = True) -> Sweep:
    """Measure `base` with one knob set to each of `values` (e.g. max_seq_length over 64..512), one
    Measurement per value run, in order (labelled `knob=value`).

    By default (isolate=None) the runs share this process on a CPU (tensor-level figures are the
    same as in a fresh process, and a sweep takes seconds, not minutes); on a GPU each is isolated.
    For a knob in GROWING with rising values, once one value does not fit the larger ones are not run
    (their memory only grows): they are not in the list but in its `skipped`, {label: why}, never a
    Measurement that looks measured.
    """
    values = list(values)
    recipes = [base.with_(**{knob: value}, label=f"{knob}={value}") for value in values]
    rising = knob in GROWING and values == sorted(values)

    def stop_when(o):
        if rising and o.measurement is not None and not o.measurement.fits:
            return f"not run: {o.label} did not fit, and a larger {knob} needs more memory"
        return None

    results = measure_all(recipes, store=store, progress=progress, isolate=isolate, desc=f"{knob} sweep",
                          stop_when=stop_when)
    return Sweep(results.measured, {results[i].label: why for i, why in results.skipped.items()})
