"""Try it: one exercise per notebook, after its measurement and before its quiz (issue 15).

Each `Exercise` is a short task that changes the notebook's recipe, done with the course's own calls
(`base.with_(...)`, `estimate`, `plan`), and decided by the estimator, which on the embedded tiny model on a
CPU equals the measured tensor-level peak to the byte (tests/test_estimate.py):

- `task(base)`: the task as Markdown. Every figure in it is computed from the notebook's base recipe (its
  estimate, the model's config, the planner's rule, the source chapter's text), and a derived figure shows
  its arithmetic; the templates hold no typed figure (tests/test_exercises.py runs facts.unsourced on them).
- `check(answer, base)`: a Verdict, passed or not, and why: the estimated figures it decided on.
- `solution(base)`: the worked solution, found as a learner would (one change at a time, the estimator in
  the loop); `show_solution` shows it as code. The checks and searches live in course_utils.exercise_checks.

The notebook's cells (scripts/insert_exercises.py writes them): `show_exercise(name, base)`,
`answer = None`, `show_solution(name, base)` (collapsed) and `check_exercise(name, answer, base)`, which
checks the worked solution while `answer is None`, so the cell passes under nbval with the solution applied.

Hardware: on a CPU the estimate's CPU; on a GPU this machine's kind ('gpu' with bf16; 't4' without it or
under COURSE_PROFILE=t4). Exercises 04, 05 and 07 are about a free T4, 08 about the chapter's claim for a
bf16 GPU and 09 about bf16 cards of 24 GiB: those estimate for that hardware wherever they run. Exercise 09's
answer is a number of GPUs (answer_kind="gpus"; its check: exercise_checks_multi), the others' a Recipe.
"""

from __future__ import annotations

import dataclasses
import html
from dataclasses import dataclass
from typing import Callable

from . import exercise_checks as C
from . import exercise_checks_multi as M
from .exercise_checks import Verdict
from .recipe import Recipe, source_chapter_recipe
from .tables import wrap

__all__ = ["EXERCISES", "Exercise", "ExerciseError", "Shown", "Verdict", "check_exercise", "exercise",
           "hardware_here", "show_exercise", "show_solution"]


HARDWARE_WORDS = {"cpu": "this CPU", "gpu": "a bf16 GPU", "t4": "a free T4 (fp16)"}


class ExerciseError(ValueError):
    """An exercise call that cannot work (unknown notebook, an answer that is not a Recipe), or a worked
    solution that fails its own check; the message says what to do."""


def hardware_here() -> str:
    """The estimator's hardware for this machine: 'cpu', 'gpu' (bf16) or 't4' (no bf16, or the T4 profile)."""
    from .hardware import active_profile, bf16_supported, device_type

    if device_type() == "cpu":
        return "cpu"
    profile = active_profile()
    return profile.name if profile else ("gpu" if bf16_supported() else "t4")


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
    answer_kind: str = "recipe"  # or "gpus": the answer is a whole number of GPUs (notebook 09)

    def hw(self, hardware: str | None = None) -> str:
        """The estimator's hardware for this exercise: fixed by the exercise, else `hardware` (this machine's by
        default)."""
        return self.hardware or hardware or hardware_here()

    def task(self, base: Recipe, hardware: str | None = None) -> str:
        """The task as Markdown, its figures computed from `base`."""
        return self.template.format(**self.figures(self.start(_recipe(base, "base")), self.hw(hardware)))

    def check(self, answer: Recipe, base: Recipe, hardware: str | None = None) -> Verdict:
        """Whether `answer` holds, decided by the estimator, with the figures it decided on."""
        answer = answer if self.answer_kind == "gpus" else _recipe(answer, "answer")
        return self.checker(answer, self.start(_recipe(base, "base")), self.hw(hardware))

    @property
    def answer_hint(self) -> str:
        """What the learner writes after `answer = `."""
        return "a number of GPUs" if self.answer_kind == "gpus" else f"{self.start_code}.with_(...)"

    def solution(self, base: Recipe, hardware: str | None = None) -> Recipe:
        """The worked solution for this base recipe."""
        return self.solver(self.start(_recipe(base, "base")), self.hw(hardware))

    def code(self, base: Recipe, hardware: str | None = None) -> str:
        """The worked solution as the line a learner writes: answer = base.with_(...)."""
        start, answer = self.start(base), self.solution(base, hardware)
        if self.answer_kind == "gpus":
            return f"answer = {answer}"
        args = [f"{f.name}={getattr(answer, f.name)!r}" for f in dataclasses.fields(Recipe)
                if f.name != "label" and getattr(answer, f.name) != getattr(start, f.name)]
        line = f"answer = {self.start_code}.with_({', '.join(args)})" if args else f"answer = {self.start_code}"
        if len(line) <= 100:
            return line
        return f"answer = {self.start_code}.with_(\n" + "".join(f"    {a},\n" for a in args) + ")"


def _recipe(value, what: str) -> Recipe:
    """`value` when it is a Recipe, else an ExerciseError that says what to pass."""
    if not isinstance(value, Recipe):
        raise ExerciseError(f"{what} must be a Recipe, such as base.with_(gradient_checkpointing=True); got "
                            f"{type(value).__name__} {value!r:.60}.")
    return value


# --- the exercises -------------------------------------------------------------------------------------
_T00 = ("The base recipe ({recipe}) holds {model} MiB at its estimated peak that scale with the model (weights, "
        "gradients, optimizer state) and {tokens} MiB that scale with the tokens of a micro-batch (activations, "
        "temporaries). Make it a **full fine-tune** (`lora_r=None`: every weight trains) and choose the tokens of "
        "a micro-batch (`micro_batch`, `max_seq_length`) so that at the estimated peak what scales with the model "
        "outweighs what scales with the tokens. Change nothing else.")
_T01 = ("At the base recipe checkpointing takes the estimated peak from {off} to {on} MiB: {off} - {on} = {saved} "
        "MiB, {share} of it, because activations are only part of the peak. Change the tokens of a micro-batch "
        "(`micro_batch`, `max_seq_length`: this model has {positions} positions) so that checkpointing saves "
        "**more than half** of the estimated peak. Your answer is the recipe with `gradient_checkpointing=True`; "
        "the check estimates it with and without.")
_T02 = ("The chapter trains {n} sequences per optimizer step ({mb} x {acc}). Keep that effective batch and find "
        "the **largest micro-batch** whose estimated peak fits a budget halfway between the estimates at "
        "micro-batch 1 ({lo} MiB) and at micro-batch {n} ({hi} MiB): {lo} / 2 + {hi} / 2 = {budget} MiB. "
        "Change only `micro_batch` and `grad_accum`, with `micro_batch * grad_accum` = {n}.")
_T03 = ("A full fine-tune of this model (`lora_r=None`) with AdamW keeps {adamw} MiB of optimizer state at the "
        "estimated peak. Which of the chapter's optimizers ({names}) keeps the **least**? Show it: your answer "
        "is the full fine-tune with that optimizer; the check lists what each one keeps. Paged state counts: "
        "paging moves state out of PyTorch's allocator, it does not make it smaller.")
_T04 = ("A free Colab T4 (compute capability {cc}) has no native bf16. Change only the base recipe's "
        "`precision` so that the estimator accepts it for a T4 (`hardware=\"t4\"`) and estimates a **lower "
        "peak** there than fp32 does ({fp32} MiB). Try `\"bf16\"` first, and read why it is refused.")
_T05 = ("The base recipe on the Llama-3.1-8B architecture (`base.with_(model=\"llama-3.1-8b\")`: {recipe}) is "
        "estimated at {peak} GiB on a free T4. With the planner's margin for the allocator's reserve and the "
        "CUDA context it needs {peak} x {factor} + {margin} = {need} GiB, and a T4 has {t4} GiB. Make it "
        "**fit**: store the frozen weights in 4 bits (`load_in_4bit=True`), then add what the estimate says is "
        "still missing. Train the same data: keep the sequence length ({seq}) and the sequences per optimizer "
        "step ({n}).")
_T06 = ("Without checkpointing the base recipe (micro-batch {mb}, sequence {seq}) is estimated at {budget} MiB. "
        "With `gradient_checkpointing=True`, find the **longest** `max_seq_length`, in steps of {step} tokens, "
        "whose estimated peak stays within those {budget} MiB. Keep the micro-batch; this model has {positions} "
        "positions.")
_T07 = ("The chapter's recipe (`chapter`: {recipe}) trains {n} sequences of {seq} tokens per optimizer step as "
        "{mb} x {acc}. On a free T4, where `precision=\"auto\"` is fp16, it is estimated at {peak} GiB and needs "
        "{peak} x {factor} + {margin} = {need} GiB by the planner's rule, of the card's {t4} GiB. A bigger "
        "micro-batch with less accumulation trains the same thing faster: find the **largest micro-batch** that "
        "still fits a T4 at the same {n} sequences per step. Change only `micro_batch`, `grad_accum` and "
        "`precision`.")
_T09 = ("The published FSDP-QLoRA recipe (`anchor_recipe()`, peft's example: {recipe}) on the Llama-3.1-70B "
        "architecture is estimated at {two} GiB per GPU on two bf16 GPUs under FSDP, and needs {two} x {factor} + "
        "{margin} = {need} GiB by the planner's rule: more than a {card} GiB card. FSDP divides the weights, "
        "gradients and optimizer state by the number of GPUs; the gathered units and the activations stay whole. "
        "Find the **smallest number of {card} GiB GPUs** on which it fits, without CPU offload "
        "(`estimate_distributed(anchor_recipe(), gpus, \"fsdp\")` is the estimate). Your answer is a whole number.")
_T08 = ("The chapter says \"{claim}\". Its own recipe on Llama-3.1-8B (`source_chapter_recipe(\"llama-3.1-8b\")`) "
        "is estimated to allocate {alloc} GiB at its peak on a bf16 GPU (what `torch.cuda.max_memory_allocated()` "
        "reads), against {gb} GB = {budget} GiB. With this notebook's changes (`prepare_kbit=False`, "
        "`offload_embeddings=True`, `liger_kernels=True`, `offload_activations=True`, another micro-batch at "
        "the same {n} sequences per step), make the estimate allocate **at most** that while training the same "
        "thing: the same model, 4-bit weights, LoRA, precision and sequence length.")

EXERCISES: dict[str, Exercise] = {e.notebook: e for e in (
    Exercise("00_where_memory_goes", "what grows with the model, what with the tokens", _T00, C._fig_00,
             C._check_00, C._solve_00, "a full fine-tune, then the micro-batch halved (then the sequence) until "
                                       "the model's part is the larger"),
    Exercise("01_gradient_checkpointing", "when checkpointing saves most", _T01, C._fig_01, C._check_01, C._solve_01,
             "checkpointing on, then the micro-batch doubled until the saving passes half: past the loss's "
             "token tile its temporaries stop growing, the activations do not"),
    Exercise("02_gradient_accumulation", "the largest micro-batch within a budget", _T02, C._fig_02, C._check_02,
             C._solve_02, "every micro-batch that divides the effective batch estimated, the largest within "
                          "budget kept"),
    Exercise("03_efficient_optimizers", "the optimizer that keeps the least state", _T03, C._fig_03, C._check_03,
             C._solve_03, "the full fine-tune estimated with each of the chapter's optimizers, the least state kept"),
    Exercise("04_mixed_precision", "a precision a free T4 runs", _T04, C._fig_04, C._check_04, C._solve_04,
             "precision='auto': the estimator resolves it to fp16 for a T4", hardware="t4"),
    Exercise("05_qlora_4bit", "Llama-3.1-8B on a free T4", _T05, C._fig_05, C._check_05, C._solve_05,
             "4-bit weights, then mixed precision, checkpointing, micro-batch 1 and a paged 8-bit optimizer, "
             "each added only while the estimate does not fit yet", hardware="t4"),
    Exercise("06_sequence_length_and_batch", "the longest sequence in the same memory", _T06, C._fig_06,
             C._check_06, C._solve_06, "a bisection over the sequence lengths, each estimated"),
    Exercise("07_complete_recipe", "use the room the chapter leaves on a T4", _T07, C._fig_07, C._check_07,
             C._solve_07, "precision='auto', then every micro-batch that divides the effective batch estimated, "
                          "the largest that fits kept", hardware="t4", start_code="chapter",
             start=lambda base: source_chapter_recipe(C.REFERENCE_MODEL)),
    Exercise("08_beyond_the_recipe", "the chapter's claim for a small card", _T08, C._fig_08, C._check_08, C._solve_08,
             "no fp32 upcast, then embeddings on CPU, activations on CPU and Liger kernels, each added only while "
             "the estimate is over", hardware="gpu", start_code='source_chapter_recipe("llama-3.1-8b")',
             start=lambda base: source_chapter_recipe(C.REFERENCE_MODEL),
             setup="from course_utils.recipe import source_chapter_recipe", base_name="path[0]"),
    Exercise("09_more_than_one_gpu", "how many cards a 70B model needs", _T09, M.figures, M.check, M.solve,
             "the FSDP estimate per GPU for one GPU, then one more at a time, the first count that fits kept",
             hardware="gpu",
             start_code="anchor_recipe()", start=M.start_recipe, answer_kind="gpus",
             setup="from course_utils.estimate import anchor_recipe\n\nanchor = anchor_recipe()", base_name="anchor"),
)}


# --- the notebook's calls ---------------------------------------------------------------------------------
def exercise(notebook: str) -> Exercise:
    """The exercise of a notebook, by its name ("01_gradient_checkpointing")."""
    try:
        return EXERCISES[notebook]
    except KeyError:
        raise ExerciseError(f"No exercise for {notebook!r}; the notebooks with one: {', '.join(EXERCISES)}.") from None


def show_exercise(notebook: str, base: Recipe, hardware: str | None = None) -> Shown:
    """The task, as Markdown in Jupyter and wrapped text elsewhere."""
    ex = exercise(notebook)
    task, where = ex.task(base, hardware), HARDWARE_WORDS.get(ex.hw(hardware), ex.hw(hardware))
    foot = (f"Write your answer in the next cell (`answer = {ex.answer_hint}`) and run the check; it "
            f"estimates for {where}.")
    return Shown(text=wrap(f"Try it: {ex.title}\n{task}\n{foot}".replace("**", "")),
                 markdown=f"**Try it: {ex.title}**\n\n{task}\n\n{foot}")


def show_solution(notebook: str, base: Recipe, hardware: str | None = None) -> Shown:
    """The worked solution's code, folded away in Jupyter (click to open), as text elsewhere."""
    ex = exercise(notebook)
    code, how = ex.code(base, hardware), f"How it was found: {ex.how}."
    return Shown(text=wrap(f"Worked solution:\n{code}\n{how}"),
                 html=f"<details><summary>Worked solution (click to open)</summary><pre>{html.escape(code)}</pre>"
                      f"<p>{html.escape(how)}</p></details>")


def check_exercise(notebook: str, answer: Recipe | None, base: Recipe, hardware: str | None = None) -> Verdict:
    """Check the learner's answer; with `answer is None`, check the worked solution instead (and say so), raising
    ExerciseError if the worked solution fails its own check."""
    ex = exercise(notebook)
    if answer is not None:
        return ex.check(answer, base, hardware)
    verdict = ex.check(ex.solution(base, hardware), base, hardware)
    if not verdict:
        raise ExerciseError(f"The worked solution of {notebook} fails its own check here ({verdict.title}); "
                            "please report it, with this notebook's first cells' output.")
    return dataclasses.replace(verdict, note="No answer yet: here is the worked solution, checked.\n"
                                             + ex.code(base, hardware))
