"""Budget planner: which of the chapter's recipes fit a memory budget, and which of those trains fastest.

    plan("llama-3.1-8b", "16GiB").format()

Candidates: 4-bit or not, LoRA (r=16 on q/k/v/o) or a full fine-tune, checkpointing on or off,
micro-batch 1 to 16 with accumulation keeping the effective batch at 16, and the chapter's three
optimizers. A recipe fits when the estimator's peak, with a stated margin, is within the budget.
Speed is the measured tokens/s of a shipped reference run of exactly that recipe where one
exists; otherwise a stated model built on those runs (see "speed" below). Every row says which.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import statistics
from dataclasses import dataclass

from course_utils.common import GiB, json_lines, peer_name, shipped
from course_utils.estimate.peak import Estimate, estimate
from course_utils.estimate.shapes import model_shapes
from course_utils.machine import T4_CARD_GIB
from course_utils.recipe import DEFAULT_TARGETS, TECHNIQUES, Recipe, RecipeError, same_setup
from course_utils.results import Measurement, all_reference_results, reference_results, shipped_results

MICRO_BATCHES = (1, 2, 4, 8, 16)
EFFECTIVE_BATCH = 16
OPTIMIZERS = ("adamw_torch", "adamw_8bit", "paged_adamw_8bit")
# Fits when estimate x MARGIN_FACTOR + MARGIN_GIB <= budget. The factor covers the CUDA caching
# allocator's reserve above the peak (reserved/estimate is 1.01-1.16 in the 18 reference runs; see
# margin_calibration(), which checks the rule covers every one); of the GiB, 0.25 covers cuBLAS
# workspaces and allocator rounding, and CUDA_CONTEXT_GIB the CUDA context, which no counter sees.
MARGIN_FACTOR = 1.15
MARGIN_GIB = 0.75
SPEED_MODEL = "llama-3.1-8b"  # models without reference runs are scaled from this one's


class BudgetError(ValueError):
    """A budget string that cannot be read; the message names it and shows the accepted forms."""


MAX_SPEED_SCALE = 25.0  # the parameter-ratio speed model is used only within 25x of SPEED_MODEL's size
MAX_BUDGET = 2**50  # 1 PiB: past any machine (and past it, float bytes lose their meaning)
_UNITS = {"gib": GiB, "gb": 10**9, "mib": 2**20, "mb": 10**6}


def parse_budget(text: str) -> int:
    """'16GiB', '16GB', '12.5GiB', '8 gib' -> bytes (GiB = 2^30, GB = 10^9)."""
    match = re.fullmatch(r"\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z]+)\s*", str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise BudgetError(f"Cannot read the budget {text!r}: write a number and a unit, e.g. 16GiB, 16GB, 12.5GiB "
                          f"or 8000MiB (GiB = 2^30 bytes, GB = 10^9 bytes).")
    value = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(value) or value < 1:
        raise BudgetError(f"The budget {text!r} is not a positive amount of memory: give one such as "
                          f"{T4_CARD_GIB:g}GiB (a free Colab T4) or 24GiB.")
    if value > MAX_BUDGET:
        raise BudgetError(f"The budget {text!r} is more than {MAX_BUDGET / 2**50:.0f} PiB, more memory than any machine "
                          "the planner models; give a card's memory, e.g. 80GiB.")
    nbytes = int(value)
    return nbytes


def needed_bytes(e: Estimate) -> int:
    """Memory a recipe needs by the planner's rule: estimate x MARGIN_FACTOR + MARGIN_GIB."""
    return int(e.peak_bytes * MARGIN_FACTOR + MARGIN_GIB * GiB)


# Beyond the chapter (notebook 09): for 4-bit recipes in bf16, the techniques the planner may pick
# (recipe.TECHNIQUES' `planner`): no fp32 upcast, then with it every combination of the others that a Recipe
# accepts (Liger kernels and compiled layers refuse each other). Not in fp16 (a T4): there the upcast is what keeps
# fp16 norms from overflowing, and none of these was measured for speed on a T4.
_TUNERS = tuple(t for t in TECHNIQUES if t.planner)
TUNING_KNOBS = tuple(t.fields[0] for t in _TUNERS)
_BEYOND = tuple(t for t in TECHNIQUES if t.where == "beyond")
_FIRST, *_OTHERS = ({t.fields[0]: t.on_value} for t in _TUNERS)


def _accepted(changes: dict) -> bool:
    """True when a 4-bit checkpointed Recipe takes these changes together (Recipe refuses the pairs that clash)."""
    try:
        Recipe(load_in_4bit=True, gradient_checkpointing=True).with_(**changes)
    except RecipeError:
        return False
    return True


TUNINGS = ({},) + tuple(t for n in range(len(_OTHERS) + 1) for combo in itertools.combinations(_OTHERS, n)
                        if _accepted(t := dict(_FIRST, **{k: v for change in combo for k, v in change.items()})))


def candidate_recipes(model: str, seq: int = 512, precision: str = "bf16", tuned: bool = True) -> list[Recipe]:
    """The grid the planner searches: every combination of the chapter's techniques, and for 4-bit
    recipes the changes of notebook 09 (tuned=False leaves those out)."""
    out = []
    for four_bit in (True, False):
        for lora_r in ((16,) if four_bit else (16, None)):
            for ckpt in (True, False):
                for mb in MICRO_BATCHES:
                    for opt in OPTIMIZERS:
                        base = Recipe(model=model, load_in_4bit=four_bit, lora_r=lora_r,
                                      lora_targets=DEFAULT_TARGETS, precision=precision,
                                      gradient_checkpointing=ckpt, micro_batch=mb, grad_accum=EFFECTIVE_BATCH // mb,
                                      optimizer=opt, max_seq_length=seq, steps=5, warmup_steps=1)
                        out.append(base)
                        if four_bit and tuned and precision == "bf16":
                            out += [r for t in TUNINGS[1:] if acts(r := base.with_(**t), t)]
    return out


def acts(r: Recipe, changes: dict) -> bool:
    """True when each change acts on `r` (reentrant checkpointing needs checkpointing): no candidate twice."""
    return all(_TUNER[knob].on(r) for knob in changes)


def is_tuned(r: Recipe) -> bool:
    """True when a recipe uses a change beyond the chapter's techniques."""
    return any(t.on(r) for t in _BEYOND)


def tuning_factor(recipe: Recipe, refs: list, knobs: tuple[str, ...] = TUNING_KNOBS) -> tuple[float, list[str]]:
    """Tokens/s factor of a recipe's beyond-the-chapter changes (those of `knobs`) over the same recipe without them:
    for each change, the median ratio of pairs of runs that differ only in it (any optimizer), each pair measured in
    one run (of `refs` and the shipped check and count runs, _check_runs), at the nearest measured micro-batch and
    there from the pairs whose other changes differ least from the recipe's."""
    factor, parts = 1.0, []
    current = recipe
    for knob in reversed(TUNING_KNOBS):
        if getattr(current, knob) == _TUNING_DEFAULT[knob] or knob not in knobs:
            continue
        before = current.with_(**_back(knob))
        others = tuple(k for t in _BEYOND if (k := t.fields[0]) not in _back(knob))  # activations on CPU: in `differ`
        pairs = [(abs(math.log(mb / recipe.micro_batch)), mb, sum(getattr(plain, k) != getattr(before, k)
                                                                  for k in others), ratio)
                 for plain, mb, ratio in _knob_pairs(knob, recipe.model, refs)
                 if same_setup(plain, before, ignore=BATCHING + others)]
        if pairs:
            near = min(pairs)[:3]
            ratios = [ratio for *where, ratio in pairs if tuple(where) == near]
            ratio = statistics.median(ratios)
            factor *= ratio
            median_of = f", median of {len(ratios)} pairs" if len(ratios) > 1 else ""
            parts.append(f"{_name(knob)} x{ratio:.2f} (measured at micro-batch {near[1]}{median_of})")
        else:
            parts.append(f"{_name(knob)} x1.00 (no measured pair)")
        current = before
    return factor, parts


BATCHING = ("micro_batch", "grad_accum", "optimizer")


def _back(knob: str) -> dict:
    """The recipe without `knob`: it at its default, what it takes the place of back on (Liger, for compiled layers)."""
    return {knob: _TUNING_DEFAULT[knob], **dict(_TUNER[knob].instead)}


def _name(knob: str) -> str:
    """A change's name in a speed's basis: "compiled layers in place of Liger" where it takes another's place."""
    instead = ", ".join(_TUNING_SHORT.get(k, k) for k, _ in _TUNER[knob].instead)
    return _TUNING_SHORT[knob] + (f" in place of {instead}" if instead else "")


_PAIRS: dict = {}


def _knob_pairs(knob: str, model: str, refs: list) -> list[tuple[Recipe, int, float]]:
    """Every pair of runs of `model` (of `refs` and _check_runs) measured in one run that differ only in `knob` (what it
    takes the place of aside): (the one without it, the micro-batch, the tokens/s ratio). Kept per list of runs, which
    the planner prices hundreds of recipes against (the list is held with them, so that no id is reused)."""
    key = (knob, model, tuple(map(id, refs)))
    if key not in _PAIRS:
        by_run: dict = {}
        for m in [*refs, *_check_runs()]:
            if m.recipe["model"] == model:
                by_run.setdefault((m.source, m.run_id), []).append((m.recipe_obj, m.tokens_per_s))
        back = tuple(_back(knob).items())
        pairs = [(plain, r2.micro_batch, t2 / t1) for runs in by_run.values() for r2, t2 in runs
                 if getattr(r2, knob) != _TUNING_DEFAULT[knob] and (plain := _without(r2, back))
                 for r1, t1 in runs if r1.micro_batch == r2.micro_batch and same_setup(r1, plain)]
        if len(_PAIRS) > 32:
            _PAIRS.clear()
        _PAIRS[key] = (list(refs), pairs)
    return _PAIRS[key][1]


@functools.lru_cache(maxsize=None)
def _without(r: Recipe, back: tuple) -> Recipe:
    """r with the fields of `back` ((field, value), ...) set: tuning_factor asks it of every run for every recipe it
    prices (a Recipe is frozen, so one copy serves every ask; Recipe.with_ validates each field, the planner's slowest
    step before)."""
    return r.with_(**dict(back))


_UNSAID = {"ops", "norm", "rope", "noguards", "graphs", "latescale", "pinned"}  # count_launches.py's variants' words


@functools.lru_cache(maxsize=1)
def _check_runs() -> list:
    """The shipped runs that check one change again: pairs for tuning_factor only, never a recipe's own speed (the
    planner's speeds are those of its reference GPU). reference/beyond/checks: fused LoRA and reentrant checkpointing
    beside the recipe without them at 16 x 1 and 8 x 2 (scripts/gpu/logs/repeats-20261207/); and each process of the
    count runs at 1 x 16 (beyond/tries/counts-*.jsonl, scripts/gpu/count_launches.py), the only pairs at 1 x 16, but
    not the processes of a variant that changed something its recipe does not say (_UNSAID: the old dequantize,
    F.rms_norm, the compiled RoPE, Dynamo's guards off, CUDA graphs, the old LoRA scaling, the pinned layer inputs, and
    "-compiled", the layers compiled around their checkpoint)."""

    counts = [Measurement(recipe=d["recipe"], recipe_key=d["recipe_key"], env=d["env"], env_key="", status="ok",
                          tokens_per_s=d["timing"]["tokens_per_s"], source=path.name, run_id=d["run"])
              for path in sorted(shipped("reference", "beyond", "tries").glob("counts-*.jsonl"))
              for d in json_lines(path.read_text()) if d.get("status") == "ok" and d["variant"] != "unsloth"
              and not _UNSAID & set((v := d.get("ran_as", d["variant"])).split("-")) and not v.endswith("-compiled")]
    return [m for m in shipped_results("beyond/checks") + counts if m.fits and m.tokens_per_s
            and not peer_name(m)]  # a peer's rows in a check run are no pairs of ours


_TUNER = {t.fields[0]: t for t in _TUNERS}
_TUNING_SHORT = {t.fields[0]: t.short for t in _TUNERS}
_TUNING_DEFAULT = {t.fields[0]: t.default for t in _TUNERS}


# ---------------------------------------------------------------------------------------------
# speed: measured where known, else a stated model built on the measurements
# ---------------------------------------------------------------------------------------------
# The model: a recipe's family is its (4-bit, full FT, checkpointing) choice. Within a family,
# tokens/s follows the measured micro-batch points (median over optimizers: they differ by less
# than the run-to-run noise), on straight lines in log-log between them; outside them, it follows
# the shape of the best-measured family. A family without runs borrows the nearest measured one
# and multiplies by each differing technique's factor, the median ratio over reference pairs that
# differ only in that technique. Models without runs are scaled from SPEED_MODEL by parameter count.
FAMILY_KNOBS = ("load_in_4bit", "full_ft", "gradient_checkpointing")


@dataclass(frozen=True)
class Speed:
    """Tokens per second and where the number comes from."""

    tokens_per_s: float | None  # None: no reference run comes close enough to this model to model it
    basis: str
    measured: bool


def family(r: Recipe) -> tuple[bool, bool, bool]:
    """(4-bit, full fine-tune, checkpointing): the choices that set a recipe's speed family."""
    return (r.load_in_4bit, not r.uses_lora, r.gradient_checkpointing)


def family_name(key: tuple[bool, bool, bool]) -> str:
    """'QLoRA, ckpt' and the like."""
    four_bit, full_ft, ckpt = key
    return ("QLoRA" if four_bit else "full FT" if full_ft else "LoRA") + (", ckpt" if ckpt else ", no ckpt")


def family_curves(refs: list) -> dict[tuple, dict[int, float]]:
    """Measured tokens/s by micro-batch, per family (median over optimizers at each micro-batch)."""
    points: dict[tuple, dict[int, list[float]]] = {}
    for m in refs:
        r = m.recipe_obj
        points.setdefault(family(r), {}).setdefault(r.micro_batch, []).append(m.tokens_per_s)
    return {k: {mb: statistics.median(v) for mb, v in by_mb.items()} for k, by_mb in points.items()}


def interpolate(curve: dict[int, float], mb: int) -> float:
    """The curve at micro-batch mb: straight lines between measured points in log-log, flat beyond them."""
    xs = sorted(curve)
    lo = max([x for x in xs if x <= mb], default=xs[0])
    hi = min([x for x in xs if x >= mb], default=xs[-1])
    if lo == hi:
        return curve[lo]
    t = (math.log(mb) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return math.exp(math.log(curve[lo]) + t * (math.log(curve[hi]) - math.log(curve[lo])))


def curve_at(curve: dict[int, float], mb: int, shape: dict[int, float]) -> float:
    """A family's tokens/s at mb: its own points where they bracket mb, else `shape` from its nearest point."""
    if min(curve) <= mb <= max(curve):
        return interpolate(curve, mb)
    near = min(curve, key=lambda x: abs(math.log(x / mb)))
    return curve[near] * interpolate(shape, mb) / interpolate(shape, near)


def pair_factor(refs: list, knob: int, before: bool, after: bool) -> float | None:
    """Median tokens/s ratio over reference pairs that differ only in family knob `knob` (before -> after)."""
    ratios = []
    for m1 in refs:
        for m2 in refs:
            r1, r2 = m1.recipe_obj, m2.recipe_obj
            f1, f2 = family(r1), family(r2)
            same_rest = all(f1[k] == f2[k] for k in range(3) if k != knob)
            same_run = (r1.micro_batch, r1.optimizer) == (r2.micro_batch, r2.optimizer)
            if (f1[knob], f2[knob]) == (before, after) and same_rest and same_run:
                ratios.append(m2.tokens_per_s / m1.tokens_per_s)
    return statistics.median(ratios) if ratios else None


def speed_of(recipe: Recipe, references: list) -> Speed:
    """Measured tokens/s of this exact recipe if a reference run has it, else the stated model's."""
    usable = [m for m in references if m.fits and m.tokens_per_s]
    exact = next((m for m in usable if same_setup(m.recipe_obj, recipe)), None)
    if exact is not None:
        return Speed(exact.tokens_per_s, f"measured ({exact.label})", True)
    twin = next((m for m in usable if same_setup(m.recipe_obj, recipe, ignore=("optimizer",))), None)
    if twin is not None:  # the optimizers' speeds differ by less than the run-to-run noise (see the model below)
        return Speed(twin.tokens_per_s, f"measured with {twin.recipe['optimizer']} ({twin.label})", False)
    if is_tuned(recipe):  # a measured recipe with the fewest of the changes left out, times their factors
        on = [k for k in TUNING_KNOBS if _TUNER[k].on(recipe)]
        for n in range(1, len(on)):
            for off in itertools.combinations(on, n):
                near = recipe.with_(**{k: v for knob in off for k, v in _back(knob).items()})
                m = next((m for m in usable if same_setup(m.recipe_obj, near, ignore=("optimizer",))), None)
                if m is not None:
                    factor, parts = tuning_factor(recipe, usable, knobs=off)
                    without = ", ".join(_name(k) for k in off)
                    return Speed(m.tokens_per_s * factor, f"measured ({m.label}) without {without}"
                                 + "".join("; " + p for p in parts), False)
        factor, parts = tuning_factor(recipe, usable)
        plain = recipe.with_(**{t.fields[0]: t.default for t in _BEYOND})
        base = speed_of(plain, [m for m in usable if not is_tuned(m.recipe_obj)])
        if base.tokens_per_s is None:
            return base
        return Speed(base.tokens_per_s * factor, f"{base.basis} without the changes" + "".join("; " + p for p in parts), False)
    usable = [m for m in usable if not is_tuned(m.recipe_obj)]
    pool = [m for m in usable if m.recipe["model"] == recipe.model and m.recipe["precision"] == "bf16"]
    scale, via = 1.0, ""
    if not pool:
        pool = _speed_model_refs()
        scale = model_shapes(SPEED_MODEL).total_params / model_shapes(recipe.model).total_params
        if not 1 / MAX_SPEED_SCALE <= scale <= MAX_SPEED_SCALE:  # a 4 M-parameter model is not 2,000x faster
            size = f"{scale:,.0f}x smaller" if scale > 1 else f"{1 / scale:,.0f}x bigger"
            return Speed(None, f"not modelled: {size} than {SPEED_MODEL} (scaled within {MAX_SPEED_SCALE:.0f}x)",
                         False)
        via = f"; x {scale:.2f}: parameters of {SPEED_MODEL} / {recipe.model}"
    seqs = {m.recipe["max_seq_length"] for m in pool}
    if recipe.max_seq_length not in seqs:
        via += f"; measured at sequence {'/'.join(map(str, sorted(seqs)))}"
    curves = family_curves(pool)
    shape = max(curves.values(), key=len)
    target = family(recipe)
    source = min(curves, key=lambda k: (sum(a != b for a, b in zip(k, target)), -len(curves[k])))
    value = curve_at(curves[source], recipe.micro_batch, shape)
    steps = []
    for knob in range(3):
        if source[knob] != target[knob]:
            f = pair_factor(pool, knob, source[knob], target[knob]) or \
                pair_factor(_speed_model_refs(), knob, source[knob], target[knob]) or 1.0
            value *= f
            steps.append(f"{'+' if target[knob] else 'no '}{_SHORT[knob]} x{f:.2f}")
    measured_mbs = "/".join(str(mb) for mb in sorted(curves[source]))
    basis = f"model: {family_name(source)} runs at micro-batch {measured_mbs}" + "".join(f", {s}" for s in steps) + via
    return Speed(value * scale, basis, False)


_SHORT = {0: "4-bit", 1: "full FT", 2: "ckpt"}


@functools.lru_cache(maxsize=1)
def _speed_model_refs() -> list:
    """The bf16 reference runs of SPEED_MODEL (for a factor another model's runs cannot give)."""

    return [m for m in reference_results() if m.fits and m.tokens_per_s and m.recipe["model"] == SPEED_MODEL
            and m.recipe["precision"] == "bf16" and not is_tuned(m.recipe_obj)]


# ---------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------
def short_name(r: Recipe) -> str:
    """The recipe's description without the sequence length (the plan fixes it)."""
    return r.describe().replace(f", seq {r.max_seq_length}", "")


@dataclass(frozen=True)
class PlanRow:
    """One candidate: its estimate, the memory it needs with the margin, whether it fits, its speed."""

    recipe: Recipe
    estimate: Estimate
    needed: int
    fits: bool
    speed: Speed
    strategy: str = "single"  # or, on several GPUs, "ddp" / "fsdp" (planner.py)
    gpus: int = 1


# ---------------------------------------------------------------------------------------------
# the margin, checked against the reference runs
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MarginCheck:
    """One reference run: what the CUDA allocator reserved against what the planner's rule reserves for it."""

    label: str
    model: str
    estimated: int
    allocated: int
    reserved: int
    needed: int

    @property
    def covered(self) -> bool:
        """True when the rule (without its CUDA-context share) covers what was reserved."""
        return self.reserved <= self.needed - CUDA_CONTEXT_GIB * GiB


CUDA_CONTEXT_GIB = 0.5  # the part of MARGIN_GIB for the CUDA context, which max_memory_reserved does not count


def fits_on_card(reserved_bytes: int, budget_bytes: int) -> bool:
    """Whether a measured run fits a card of `budget_bytes`: what CUDA reserved, plus the CUDA context."""
    return reserved_bytes + CUDA_CONTEXT_GIB * GiB <= budget_bytes


def margin_calibration(references: list | None = None) -> list[MarginCheck]:
    """For each reference run with CUDA counters: estimate, allocated, reserved, and what the rule sets aside."""

    refs = all_reference_results() if references is None else references
    out = []
    for m in refs:
        if m.fits and m.cuda_max_reserved:
            e = estimate(m.recipe_obj, hardware="gpu")
            out.append(MarginCheck(m.label, m.recipe["model"], e.peak_bytes, m.cuda_max_allocated or 0,
                                   m.cuda_max_reserved, needed_bytes(e)))
    return out
