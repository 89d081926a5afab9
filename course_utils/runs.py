"""The measuring driver: many recipes, measured in order, the one loop every driver of the course sits on
(`course run`, the ladder, sweeps, notebook 08's path and the scripts). One recipe at a time is
`measure.measure`; this module is about the list: skip reasons, labels, checks before the first run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .recipe import Recipe
from .results import Measurement, ResultStore


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
                timeout_s: float | None = None, keep_going: bool = False, after_each=None,
                stop_when=None) -> Results:
    """Measure each recipe with measure(), in order; the one loop every driver of the course sits on.

    skip: {position: why} for recipes not to measure (their Outcome keeps the reason). Every other recipe is
    checked with checks.check_runnable before the first one is measured, so a bad one costs no run.
    isolate: as in measure(), but None by default (a fresh process on a GPU, this process on a CPU).
    keep_going=True: a run that fails (MeasurementError, not 'does not fit') is skipped with its error, and
    the rest are measured. after_each(results so far) is called after each recipe (scripts print there).
    desc names the progress bar over the recipes (progress=False: no bars).
    stop_when(outcome) -> a reason, or None: once it gives a reason, every later recipe is skipped with it.
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
    stopped = ""
    for i, recipe in enumerate(bar):
        bar.set_postfix_str(recipe.name[:30])
        if i in skip or stopped:
            results.append(Outcome(recipe, None, skip.get(i, stopped)))
        else:
            results.append(_measure_one(recipe, keep_going, store=store, force=force, progress=progress,
                                        isolate=isolate, timeout_s=timeout_s))
            stopped = (stop_when(results[-1]) if stop_when is not None else None) or ""
        if after_each is not None:
            after_each(results)
    return results


def _measure_one(recipe: Recipe, keep_going: bool, **how) -> Outcome:
    """measure(recipe, **how) as an Outcome; with keep_going, a failed run is one skipped with its error."""
    from .measure import MeasurementError, measure  # at call time: tests replace measure.measure

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


GROWING = ("max_seq_length", "micro_batch")  # knobs whose memory only grows with the value


def sweep(base: Recipe, knob: str, values, *, isolate: bool | None = None, store: ResultStore | None = None,
          progress: bool = True) -> list[Measurement]:
    """Measure `base` with one knob set to each of `values` (e.g. max_seq_length over 64..512), one
    Measurement per value, in order.

    By default (isolate=None) the runs share this process on a CPU (tensor-level figures are the
    same as in a fresh process, and a sweep takes seconds, not minutes); on a GPU each is isolated.
    For a knob in GROWING with rising values, once one value does not fit the larger ones are not run
    (their memory only grows): each is a 'does not fit' result that says so, and is not stored.
    """
    from .measure import _does_not_fit

    values = list(values)
    recipes = [base.with_(**{knob: value}, label=f"{knob}={value}") for value in values]
    rising = knob in GROWING and values == sorted(values)

    def stop_when(o):
        if rising and o.measurement is not None and not o.measurement.fits:
            return f"not run: {o.label} did not fit, and a larger {knob} needs more memory"
        return None

    results = measure_all(recipes, store=store, progress=progress, isolate=isolate, desc=f"{knob} sweep",
                          stop_when=stop_when)
    return [o.measurement or _does_not_fit(o.recipe, o.skipped) for o in results]
