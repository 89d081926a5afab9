"""Notebook 02 (notebooks/02_gradient_accumulation.ipynb, quizzes/02_gradient_accumulation.yaml): Gradient accumulation.

Its room in the package: what the notebook's cells import, what its exercise checks, and what other rooms or the README quote from it. The code the notebook teaches is in the notebook itself.
"""

from __future__ import annotations


from course_utils.chapter.exercises import (Exercise, Verdict, _at, _divisors, _est, _first, _larger_fits, _largest,
                                            _mib, _only, _refuse)
from course_utils.common import GiB, MiB
from course_utils.recipe import Recipe, source_chapter_recipe
from course_utils.results import Measurement
from course_utils.show.speeds import speed_words
from course_utils.show.report import _joined, dated, not_measured
from course_utils.show.tables import wrap

# --- 02: the largest micro-batch within a budget, at the chapter's sequences per step ---------------------
def _budget_02(start: Recipe, hw: str) -> dict:
    n = source_chapter_recipe().effective_batch
    lo, hi = (_mib(_est(_at(start.with_(micro_batch=1, grad_accum=n), m), hw).peak_bytes) for m in (1, n))
    budget = float(lo.replace(",", "")) / 2 + float(hi.replace(",", "")) / 2
    return {"n": n, "lo": lo, "hi": hi, "budget": f"{budget:,.1f}", "budget_bytes": round(budget, 1) * MiB}


def _fig_02(start: Recipe, hw: str) -> dict:
    chapter = source_chapter_recipe()
    return {**_budget_02(start, hw), "mb": chapter.micro_batch, "acc": chapter.grad_accum}


def _check_02(answer: Recipe, start: Recipe, hw: str) -> Verdict:
    b = _budget_02(start, hw)
    refused = _first(_only(answer, start, {"micro_batch", "grad_accum"}), _refuse(
        answer.effective_batch != b["n"], f"train {b['n']} sequences per optimizer step: yours trains "
                                          f"{answer.micro_batch} x {answer.grad_accum} = {answer.effective_batch}"))
    if refused is not None:
        return refused
    fits = lambda r: _est(r, hw).peak_bytes <= b["budget_bytes"]  # noqa: E731
    mine = _est(answer, hw)
    line = (f"micro-batch {answer.micro_batch} x {answer.grad_accum}: estimated {_mib(mine.peak_bytes)} MiB "
            f"of {b['budget']}")
    if not fits(answer):
        return Verdict(False, "over the budget: a smaller micro-batch, more accumulation", (line,))
    larger = _larger_fits(answer, fits)
    if larger:
        return Verdict(False, f"it fits, but micro-batch {larger} fits too", (
            line, f"micro-batch {larger} x {b['n'] // larger}: {_mib(_est(_at(answer, larger), hw).peak_bytes)} MiB"))
    nxt = next((d for d in _divisors(b["n"]) if d > answer.micro_batch), None)
    over = () if nxt is None else (f"micro-batch {nxt} x {b['n'] // nxt}: "
                                   f"{_mib(_est(_at(answer, nxt), hw).peak_bytes)} MiB, over",)
    return Verdict(True, "the largest micro-batch that fits the budget", (line, *over))


def _solve_02(start: Recipe, hw: str) -> Recipe:
    b = _budget_02(start, hw)
    return _largest(start.with_(micro_batch=1, grad_accum=b["n"]),
                    lambda r: _est(r, hw).peak_bytes <= b["budget_bytes"])
_T02 = ("The chapter trains {n} sequences per optimizer step ({mb} x {acc}). Keep that effective batch and find "
        "the **largest micro-batch** whose estimated peak fits a budget halfway between the estimates at "
        "micro-batch 1 ({lo} MiB) and at micro-batch {n} ({hi} MiB): {lo} / 2 + {hi} / 2 = {budget} MiB. Change "
        "only `per_device_train_batch_size` and `gradient_accumulation_steps`, with their product {n}.")


def set_seed_all(seed: int) -> None:
    """Notebooks 01 and 02: seed python, numpy and torch (transformers' set_seed)."""
    from transformers import set_seed

    set_seed(seed)


def closing_02(before: Measurement, after: Measurement, reference) -> str:
    """Notebook 02: what a smaller micro-batch with accumulation did to the peak and the speed, and the
    reference's three batchings of the same 16 sequences."""
    skip = not_measured(before, after)  # on a T4, an 8B model's fp32 rungs do not fit
    here = skip or wrap(
        f"On {after.env['device']}, micro-batch {after.recipe['micro_batch']} x {after.recipe['grad_accum']} instead "
        f"of {before.recipe['micro_batch']} x {before.recipe['grad_accum']} (same {after.recipe_obj.effective_batch} "
        f"sequences per step) took the peak from {before.mib('peak'):.1f} to {after.mib('peak'):.1f} MiB "
        f"({after.peak_bytes / before.peak_bytes - 1:+.0%}), {speed_words(before, after)}.")
    here = here if skip else dated(here, before, after)  # figures read back from the store say so, with their date
    big, mid, small = reference
    return _joined(here, f"Reference (Llama-3.1-8B QLoRA, H200): 16x1 {big.peak_gib:.1f} GiB at "
                   f"{big.tokens_per_s:,.0f} tokens/s; 4x4 {mid.peak_gib:.1f} GiB at {mid.tokens_per_s:,.0f}; "
                   f"1x16 {small.peak_gib:.1f} GiB at {small.tokens_per_s:,.0f}. Micro-batch 1 saves "
                   f"{1 - small.peak_gib / big.peak_gib:.0%} of the peak and runs "
                   f"{big.tokens_per_s / small.tokens_per_s:.1f}x slower: a GPU is fastest with big micro-batches.")


# The notebook's exercise (course_utils.chapter.exercises shows and checks it)
EXERCISE = Exercise("02_gradient_accumulation", "the largest micro-batch within a budget", _T02, _fig_02, _check_02,
             _solve_02, "every micro-batch that divides the effective batch estimated, the largest within "
                          "budget kept")

# The "In your own script" cells of the notebook (kind, the rung they write, the rung they are compared with, the cell
# they follow, what the markdown above them says): `scripts/notebooks/write_notebooks.py own-script` writes them.
OWN_SCRIPT = ("ladder", "+ accumulation (micro-batch 1)", "+ gradient checkpointing", "02-07",
              "Accumulation is `per_device_train_batch_size` and `gradient_accumulation_steps`.")
