"""Try it: one exercise per notebook, after its measurement and before its quiz (issue 15), answered in the
libraries' own code (issue 29).

Each `Exercise` is a short task that changes the notebook's recipe, decided by the estimator, which on the embedded
tiny model on a CPU equals the measured tensor-level peak to the byte (tests/test_estimate.py):

- `task(base)`: the task as Markdown. Every figure in it is computed from the notebook's base recipe (its
  estimate, the model's config, the planner's rule, the source chapter's text), and a derived figure shows
  its arithmetic; the templates hold no typed figure (tests/test_exercises.py runs facts.unsourced on them).
- `answer_cell(base)`: the cell the learner edits, the libraries' objects (SFTConfig, LoraConfig,
  BitsAndBytesConfig; notebook 11 an accelerate config) of the rung the task starts from, with the lines to
  change marked `# <- ?` (course_utils/chapter/exercise_library.py writes it).
- `check(answer, base)`: a Verdict, passed or not, and why: the estimated figures it decided on. The answer's
  objects are read back into a Recipe through course_utils/from_library.py, whose messages name a setting the
  course does not model; a Recipe (`base.with_(...)`) is still accepted.
- `solution(base)`: the worked solution, found as a learner would (one change at a time, the estimator in
  the loop); `code` shows it as the answer cell filled in.

The notebook's cells (`scripts/notebooks/write_notebooks.py exercises` writes them): `show_exercise(name, base)`, the answer
cell, `show_solution(name, base)` (collapsed) and `check_exercise(name, answer, base)`, which checks the worked
solution while the answer is still the cell's starting rung, so the cell passes under nbval as committed.

Hardware: on a CPU the estimate's CPU; on a GPU this machine's kind ('gpu' with bf16; 't4' without it or
under COURSE_PROFILE=t4). Exercises 04, 05 and 07 are about a free T4, 09 about the chapter's claim for a
bf16 GPU and 11 about bf16 cards of 24 GiB: those estimate for that hardware wherever they run. Exercise 11's
answer is a number of GPUs, num_processes in its accelerate config (answer_kind="gpus"; its check:
more_than_one_gpu.check), the others' a Recipe.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import html
import re
from dataclasses import dataclass
from typing import Callable

from course_utils import machine
from course_utils.chapter.exercise_library import ANSWER_TYPES, answer_code, cell_start, library_name, read_answer
from course_utils.common import GiB, MiB
from course_utils.estimate import EstimateError, estimate, load_config
from course_utils.estimate.plan import MARGIN_FACTOR, MARGIN_GIB, needed_bytes, parse_budget
from course_utils.machine import HardwareError, get_hardware
from course_utils.recipe import TECHNIQUES, Recipe, RecipeError
from course_utils.show.tables import wrap

REFERENCE_MODEL = "llama-3.1-8b"
NOT_MEMORY = ("label", "steps", "warmup_steps", "learning_rate", "seed")  # knobs that do not move the peak
SEQ_STEP = 64  # exercise 06 searches sequence lengths in steps of this many tokens
CLAIM = "QLoRA + all optimizations enable 7B on 6GB"  # the source chapter's words (tested to be there)


@dataclass(frozen=True)
class Verdict:
    """Whether an answer holds, and why: the estimated figures the check decided on."""

    passed: bool
    title: str
    lines: tuple[str, ...] = ()
    note: str = ""  # a line above the verdict ("No answer yet: ...")

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        head = [self.note] if self.note else []
        body = [("Holds: " if self.passed else "Not yet: ") + self.title] + [f"- {line}" for line in self.lines]
        return wrap("\n".join(head + body))

    __repr__ = __str__

    def _repr_pretty_(self, p, cycle: bool) -> None:
        p.text(str(self))


# --- shared helpers ---------------------------------------------------------------------------------
@functools.lru_cache(maxsize=512)
def _est(recipe: Recipe, hw: str):
    """The estimate of `recipe` on `hw` (cached: a check and its solution search ask for the same ones)."""
    return estimate(recipe, hardware=hw)


def _try_est(recipe: Recipe, hw: str):
    """(estimate, None), or (None, the estimator's reason) when it refuses the recipe on that hardware."""
    try:
        return _est(recipe, hw), None
    except (HardwareError, EstimateError, RecipeError) as error:
        return None, str(error)


def _mib(nbytes: float) -> str:
    return f"{nbytes / MiB:,.1f}"


def _gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.2f}"


def _sum_line(parts: list[tuple[str, int]], unit=_mib) -> tuple[str, str]:
    """'weights 16.9 + gradients 0.0 = 16.9' from (name, bytes) pairs: the total is the sum of the shown parts."""
    shown = [unit(b) for _, b in parts]
    total = sum(float(s.replace(",", "")) for s in shown)
    digits = len(shown[0].split(".")[1]) if "." in shown[0] else 0
    return " + ".join(f"{name} {s}" for (name, _), s in zip(parts, shown)), f"{total:,.{digits}f}"


def _changed(answer: Recipe, start: Recipe) -> list[str]:
    """The memory knobs in which `answer` differs from `start`."""
    return [f.name for f in dataclasses.fields(Recipe)
            if f.name not in NOT_MEMORY and getattr(answer, f.name) != getattr(start, f.name)]


def _only(answer: Recipe, start: Recipe, allowed: set[str]) -> Verdict | None:
    """A failing Verdict when `answer` changes a knob outside `allowed`, else None."""
    extra = [f for f in _changed(answer, start) if f not in allowed]
    if not extra:
        return None
    was = ", ".join(f"{library_name(f)}: {getattr(start, f)!r} (yours: {getattr(answer, f)!r})" for f in extra)
    allowed_names = ", ".join(sorted(map(library_name, allowed)))
    return Verdict(False, f"change only {allowed_names}; your answer also changes {was}")


def _refuse(condition: bool, title: str, lines: tuple[str, ...] = ()) -> Verdict | None:
    """A failing Verdict when `condition` holds, else None."""
    return Verdict(False, title, lines) if condition else None


def _still_lora(a: Recipe) -> Verdict | None:
    return _refuse(a.uses_lora, f"still LoRA (LoraConfig r={a.lora_r}): a full fine-tune is peft_config = None")


def _first(*verdicts: Verdict | None) -> Verdict | None:
    """The first refusal (a Verdict is falsy when it fails, so `or` cannot pick it)."""
    return next((v for v in verdicts if v is not None), None)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _same_steps(answer: Recipe, start: Recipe) -> Verdict | None:
    """A failing Verdict when `answer` trains another number of sequences per step, or other lengths."""
    if answer.effective_batch != start.effective_batch:
        return Verdict(False, f"keep {start.effective_batch} sequences per optimizer step: yours trains "
                              f"{answer.micro_batch} x {answer.grad_accum} = {answer.effective_batch}")
    if answer.max_seq_length != start.max_seq_length:
        return Verdict(False, f"keep the sequence length at {start.max_seq_length} (yours: {answer.max_seq_length})")
    return None


def _at(r: Recipe, micro_batch: int) -> Recipe:
    """`r` at another micro-batch, with the accumulation that keeps its effective batch."""
    return r.with_(micro_batch=micro_batch, grad_accum=r.effective_batch // micro_batch)


def _largest(start: Recipe, fits: Callable[[Recipe], bool]) -> Recipe:
    """`start` at the largest micro-batch (a divisor of its effective batch) that `fits`, else at micro-batch 1."""
    return _at(start, max([d for d in _divisors(start.effective_batch) if fits(_at(start, d))] or [1]))


def _larger_fits(answer: Recipe, fits: Callable[[Recipe], bool]) -> int | None:
    """A micro-batch above the answer's, at the same effective batch, that fits too; None when none does."""
    return next((d for d in _divisors(answer.effective_batch) if d > answer.micro_batch and fits(_at(answer, d))), None)


def _positions(model: str) -> int:
    """How many positions the model has (its longest sequence)."""
    return int(getattr(load_config(model), "max_position_embeddings", None) or 2**20)


def _t4_bytes() -> int:
    return int(get_hardware("t4").memory_gib * GiB)


def _need_line(e, budget: int) -> str:
    """'estimated 8.54 GiB x 1.15 + 0.75 = 10.57 GiB needed of 14.70 GiB' (the planner's rule, course_utils.plan)."""
    return (f"estimated {_gib(e.peak_bytes)} GiB x {MARGIN_FACTOR} + {MARGIN_GIB} = {_gib(needed_bytes(e))} GiB "
            f"needed (the planner's rule) of {_gib(budget)} GiB")


def _t4_fits(recipe: Recipe) -> bool:
    e, _ = _try_est(recipe, "t4")
    return e is not None and needed_bytes(e) <= _t4_bytes()


# --- 00: what grows with the model, what with the tokens ----------------------------------------------
def _sides(e) -> tuple[list, list]:
    c = e.by_category
    return ([("weights", c["parameters"]), ("gradients", c["gradients"]), ("optimizer state", c["optimizer"])],
            [("activations", c["activations"]), ("temporaries", c["temporaries"])])


# --- 01: when checkpointing saves most ---------------------------------------------------------------
def _saving(r: Recipe, hw: str) -> tuple:
    on, off = _est(r.with_(gradient_checkpointing=True), hw), _est(r.with_(gradient_checkpointing=False), hw)
    return on, off, 1 - on.peak_bytes / off.peak_bytes


# --- 09: the chapter's "7B on 6GB", with notebook 09's changes --------------------------------------------
# what an answer may change: notebook 09's techniques (recipe.TECHNIQUES), and another micro-batch at the same
# sequences per step
BEYOND_KNOBS = {name for t in TECHNIQUES if t.where == "beyond" for name in t.fields} | {"micro_batch", "grad_accum"}


def claim_bytes() -> tuple[str, int]:
    """The chapter's memory in CLAIM ('6GB'), as written and in bytes (a GB is 10^9 bytes)."""
    written = re.search(r"on (\d+(?:\.\d+)?GB)$", CLAIM).group(1)
    return written, parse_budget(written)

__all__ = ["EXERCISES", "Exercise", "ExerciseError", "Shown", "Verdict", "check_exercise", "exercise",
           "hardware_here", "show_exercise", "show_solution"]


HARDWARE_WORDS = {"cpu": "this CPU", "gpu": "a bf16 GPU", "t4": "a free T4 (fp16)"}


class ExerciseError(ValueError):
    """An exercise call that cannot work (unknown notebook, an answer that is not a Recipe), or a worked
    solution that fails its own check; the message says what to do."""


def hardware_here() -> str:
    """The estimator's hardware for this machine: 'cpu', 'gpu' (bf16) or 't4' (no bf16, or the T4 profile)."""

    if machine.device_type() == "cpu":
        return "cpu"
    profile = machine.active_profile()
    return profile.name if profile else ("gpu" if machine.bf16_supported() else "t4")


@dataclass(frozen=True)
class Shown:
    """A cell's output: Markdown or HTML in Jupyter, text (at most 100 characters a line) elsewhere."""

    text: str
    markdown: str = ""
    html: str = ""

    def __repr__(self) -> str:
        return self.text

    def _repr_pretty_(self, p, cycle: bool) -> None:
        p.text(self.text)

    def _repr_markdown_(self) -> str | None:
        return self.markdown or None

    def _repr_html_(self) -> str | None:
        return self.html or None


@dataclass(frozen=True)
class Exercise:
    """One notebook's exercise: its task (a template filled from the base recipe), check and worked solution."""

    notebook: str  # the notebook's name, e.g. "01_gradient_checkpointing"
    title: str
    template: str  # Markdown with {fields}: every figure comes from `figures`
    figures: Callable[[Recipe, str], dict]  # (start, hw) -> the template's fields
    checker: Callable[[Recipe, Recipe, str], Verdict]  # (answer, start, hw)
    solver: Callable[[Recipe, str], Recipe]  # (start, hw) -> the worked solution
    how: str  # how the worked solution was found, in a sentence
    hardware: str | None = None  # fixed hardware ('t4', 'gpu'); None: this machine's
    start_code: str = "base"  # how the notebook names the recipe the exercise starts from
    start: Callable[[Recipe], Recipe] = lambda base: base
    setup: str = ""  # an import the notebook's cell needs for start_code
    base_name: str = "base"  # what the notebook's cells pass as `base`
    answer_kind: str = "recipe"  # or "gpus": the answer is a whole number of GPUs (notebook 11)

    def hw(self, hardware: str | None = None) -> str:
        """The estimator's hardware for this exercise: fixed by the exercise, else `hardware` (this machine's by
        default)."""
        return self.hardware or hardware or hardware_here()

    def task(self, base: Recipe, hardware: str | None = None) -> str:
        """The task as Markdown, its figures computed from `base`."""
        return self.template.format(**self.figures(self.start(_recipe(base, "base")), self.hw(hardware)))

    def check(self, answer, base: Recipe, hardware: str | None = None) -> Verdict:
        """Whether `answer` holds, decided by the estimator, with the figures it decided on. The answer is the
        answer cell's library objects (read back through course_utils/from_library.py), an accelerate config
        (notebook 11), or a Recipe."""
        start, hw = self.start(_recipe(base, "base")), self.hw(hardware)
        answer, problem = read_answer(self.notebook, answer, start, hw, gpus=self.answer_kind == "gpus")
        if problem:
            return Verdict(False, problem)
        answer = answer if self.answer_kind == "gpus" else _recipe(answer, "answer")
        return self.checker(answer, start, hw)

    def unchanged(self, answer, base: Recipe, hardware: str | None = None) -> bool:
        """Whether `answer` is still the answer cell's starting rung, as the cell holds it (nothing changed yet; a
        Recipe answer is always checked)."""
        if isinstance(answer, Recipe):
            return False
        start, hw = self.start(_recipe(base, "base")), self.hw(hardware)
        read, problem = read_answer(self.notebook, answer, start, hw, gpus=self.answer_kind == "gpus")
        first = cell_start(self.notebook, start)
        if problem or self.answer_kind == "gpus" or not isinstance(read, Recipe):
            return problem is None and read == first
        return not _changed(read, first)

    @property
    def answer_hint(self) -> str:
        """What the learner changes in the answer cell."""
        if self.answer_kind == "gpus":
            return "the lines marked `# <- ?` (num_processes, in the accelerate config)"
        return "the lines marked `# <- ?`"

    def solution(self, base: Recipe, hardware: str | None = None) -> Recipe:
        """The worked solution for this base recipe."""
        return self.solver(self.start(_recipe(base, "base")), self.hw(hardware))

    def answer_cell(self, base: Recipe, hardware: str | None = None, committed: bool = True) -> str:
        """The answer cell the notebook holds: the libraries' objects of the rung it starts from."""
        return answer_code(self.notebook, cell_start(self.notebook, self.start(base)), self.hw(hardware),
                           committed=committed)

    def code(self, base: Recipe, hardware: str | None = None) -> str:
        """The worked solution as the learner's answer cell, filled in (the libraries' own code)."""
        return answer_code(self.notebook, self.solution(base, hardware), self.hw(hardware))


def _recipe(value, what: str) -> Recipe:
    """`value` when it is a Recipe, else an ExerciseError that says what to pass."""
    if not isinstance(value, Recipe) and what == "base":
        raise ExerciseError(f"base must be a Recipe: the notebook's base recipe (`base`); got {type(value).__name__} "
                            f"{value!r:.60}.")
    if not isinstance(value, Recipe):
        raise ExerciseError(f"{what} must be the libraries' objects ({ANSWER_TYPES}), or a Recipe such as "
                            f"base.with_(gradient_checkpointing=True); got {type(value).__name__} {value!r:.60}.")
    return value

NOTEBOOKS = ("00_where_memory_goes", "01_gradient_checkpointing", "02_gradient_accumulation", "03_efficient_optimizers", "04_mixed_precision", "05_qlora_4bit", "06_sequence_length_and_batch", "07_complete_recipe", "09_beyond_the_recipe", "11_more_than_one_gpu")  # the notebooks with a Try it, in order
# Notebooks without a Try it, and why (tests/test_exercises.py: every other notebook has one)
WITHOUT_EXERCISE = {"08_after_training": "it loads, merges and reads memory; the planner it shows is notebook 07's exercise",
                    "10_toward_the_limit": "it reads shipped H200 runs only; nothing in it is a recipe to change"}


@functools.cache
def _registry() -> dict[str, Exercise]:
    """Every notebook's exercise, from its room: course_utils/chapter/<slug>.py's EXERCISE."""
    return {nb: importlib.import_module(f"course_utils.chapter.{nb[3:]}").EXERCISE for nb in NOTEBOOKS}


def __getattr__(name: str):
    if name == "EXERCISES":  # {notebook: Exercise}, read from the rooms on first use
        return _registry()
    raise AttributeError(name)


# --- the notebook's calls ---------------------------------------------------------------------------------
def exercise(notebook: str) -> Exercise:
    """The exercise of a notebook, by its name ("01_gradient_checkpointing")."""
    try:
        return _registry()[notebook]
    except KeyError:
        raise ExerciseError(f"No exercise for {notebook!r}; the notebooks with one: {', '.join(NOTEBOOKS)}.") from None


def show_exercise(notebook: str, base: Recipe, hardware: str | None = None) -> Shown:
    """The task, as Markdown in Jupyter and wrapped text elsewhere."""
    ex = exercise(notebook)
    task, where = ex.task(base, hardware), HARDWARE_WORDS.get(ex.hw(hardware), ex.hw(hardware))
    foot = (f"Answer in the next cell, in the libraries' own code: it holds the rung you start from; change "
            f"{ex.answer_hint}, run it, and run the check; it estimates for {where}.")
    return Shown(text=wrap(f"Try it: {ex.title}\n{task}\n{foot}".replace("**", "")),
                 markdown=f"**Try it: {ex.title}**\n\n{task}\n\n{foot}")


def show_solution(notebook: str, base: Recipe, hardware: str | None = None, reveal: bool = False):
    """The worked solution, only when the learner asks: a "Show the worked solution" button
    (course_utils.solution_reveal; its static copy says how to ask), or with `reveal=True` the solution's
    code itself, folded away in Jupyter (click to open), as text elsewhere."""
    from course_utils.chapter.solution_reveal import SolutionReveal

    ex = exercise(notebook)
    if not reveal:
        return SolutionReveal(notebook, lambda: show_solution(notebook, base, hardware, reveal=True).html,
                              base_name=ex.base_name)
    code, how = ex.code(base, hardware), f"How it was found: {ex.how}."
    return Shown(text=wrap(f"Worked solution (the answer cell, filled in):\n{code}\n{how}"),
                 html=f"<details><summary>Worked solution (click to open)</summary><p>The answer cell, filled in:</p>"
                      f"<pre>{html.escape(code)}</pre><p>{html.escape(how)}</p></details>")


def check_exercise(notebook: str, answer, base: Recipe, hardware: str | None = None) -> Verdict:
    """Check the learner's answer. While it is still the answer cell's starting rung (or None), check the worked
    solution without showing it (the verdict asks for a change), raising ExerciseError if the worked solution
    fails its own check."""
    ex = exercise(notebook)
    if answer is not None and not ex.unchanged(answer, base, hardware):
        return ex.check(answer, base, hardware)
    verdict = ex.check(ex.solution(base, hardware), base, hardware)
    if not verdict:
        raise ExerciseError(f"The worked solution of {notebook} fails its own check here ({verdict.title}); "
                            "please report it, with this notebook's first cells' output.")
    # the worked solution holds (checked above), but it stays hidden: nothing of it is printed here
    what = "no answer yet" if answer is None else "nothing changed yet: `answer` is still the rung you start from"
    return Verdict(False, f"{what}. In the answer cell change {ex.answer_hint}, run it, then run this cell again",
                   ("the worked solution passes this check here; it shows only when you ask for it (the "
                    '"Show the worked solution" button above)',))
