"""Notebook 06 (notebooks/06_sequence_length_and_batch.ipynb, quizzes/06_sequence_length_and_batch.yaml): Sequence length and micro-batch.

Its room in the package: what the notebook's cells import, what its exercise checks, and what other rooms or the README quote from it. The code the notebook teaches is in the notebook itself.
"""

from __future__ import annotations


from course_utils.chapter.exercises import (Exercise, SEQ_STEP, Verdict, _est, _first, _mib, _only, _positions,
                                            _refuse)
from course_utils.common import MiB
from course_utils.recipe import Recipe
from course_utils.show.report import dated, not_measured
from course_utils.show.tables import wrap

# --- 06: the longest sequence in the base recipe's memory, with checkpointing ----------------------------
def _fig_06(start: Recipe, hw: str) -> dict:
    return {"budget": _mib(_est(start.with_(gradient_checkpointing=False), hw).peak_bytes), "mb": start.micro_batch,
            "seq": start.max_seq_length, "step": SEQ_STEP, "positions": f"{_positions(start.model):,}"}


def _check_06(answer: Recipe, start: Recipe, hw: str) -> Verdict:
    seq, positions = answer.max_seq_length, _positions(answer.model)
    refused = _first(_only(answer, start, {"gradient_checkpointing", "max_seq_length"}),
                     _refuse(not answer.gradient_checkpointing, "gradient_checkpointing is off: this exercise "
                             "turns it on"))
    if refused is not None:
        return refused
    if seq % SEQ_STEP or seq > positions:
        return Verdict(False, f"max_seq_length={seq}: give a multiple of {SEQ_STEP} up to the model's "
                              f"{positions:,} positions")
    budget = _est(start.with_(gradient_checkpointing=False), hw).peak_bytes
    e = _est(answer, hw)
    line = f"sequence {seq:,}: estimated {_mib(e.peak_bytes)} MiB of {_mib(budget)}"
    if e.peak_bytes > budget:
        return Verdict(False, "over the base recipe's memory: a shorter sequence", (line,))
    if seq + SEQ_STEP > positions:
        return Verdict(True, "the longest sequence the model has fits", (line,))
    longer = _est(answer.with_(max_seq_length=seq + SEQ_STEP), hw)
    holds = longer.peak_bytes > budget
    return Verdict(holds, "the longest sequence that fits" if holds else f"sequence {seq + SEQ_STEP:,} fits too",
                   (line, f"sequence {seq + SEQ_STEP:,}: {_mib(longer.peak_bytes)} MiB" + (", over" if holds else "")))


def _solve_06(start: Recipe, hw: str) -> Recipe:
    budget = _est(start.with_(gradient_checkpointing=False), hw).peak_bytes
    at = lambda k: start.with_(gradient_checkpointing=True, max_seq_length=k * SEQ_STEP)  # noqa: E731
    lo, hi = 1, _positions(start.model) // SEQ_STEP  # bisect for the last k that fits: the peak grows with k
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _est(at(mid), hw).peak_bytes <= budget else (lo, mid - 1)
    return at(lo)
_T06 = ("Without checkpointing the base recipe (micro-batch {mb}, sequence {seq}) is estimated at {budget} MiB. "
        "With `activation_checkpointing=True`, find the **longest** `max_length`, in steps of {step} tokens, whose "
        "estimated peak stays within those {budget} MiB. Keep the micro-batch; this model has {positions} "
        "positions.")


def growth(measurements, category: str) -> str:
    """Notebook 06: how much a category grows each time the knob doubles, point to point ('x1.98 x2.01 ...');
    a point that did not fit has no figure and is left out."""
    values = [m.peak_by_category[category] for m in measurements if m.fits]
    return " ".join(f"x{b / a:.2f}" for a, b in zip(values, values[1:]))


def closing_06(no: list, yes: list) -> str:
    """Notebook 06: the sequence sweep's first and last points, without checkpointing (`no`) and with it (`yes`):
    the peak and how many times the activations grew for that many times the tokens (or why nothing compares)."""
    skip = not_measured(*no, *yes)  # a point that did not fit leaves nothing to compare
    if skip:
        return skip
    first, last = no[0].recipe_obj, no[-1].recipe_obj
    grew = lambda ms: ms[-1].peak_by_category["activations"] / ms[0].peak_by_category["activations"]  # noqa: E731
    return dated(wrap(f"On {no[0].env['device']}, from sequence {first.max_seq_length} to {last.max_seq_length} at "
                f"micro-batch {first.micro_batch}: peak {no[0].mib('peak'):.1f} -> {no[-1].mib('peak'):.1f} MiB "
                f"without checkpointing, {yes[0].mib('peak'):.1f} -> {yes[-1].mib('peak'):.1f} MiB with it; "
                f"activations x{grew(no):.1f} and x{grew(yes):.1f} for "
                f"{last.max_seq_length // first.max_seq_length}x the tokens."), *no, *yes)  # read back: dated


# The notebook's exercise (course_utils.chapter.exercises shows and checks it)
EXERCISE = Exercise("06_sequence_length_and_batch", "the longest sequence in the same memory", _T06, _fig_06,
             _check_06, _solve_06, "a bisection over the sequence lengths, each estimated")

# The "In your own script" cells of the notebook (kind, the rung they write, the rung they are compared with, the cell
# they follow, what the markdown above them says): `scripts/notebooks/write_notebooks.py own-script` writes them.
OWN_SCRIPT = ("ladder", "+ shorter sequences", "+ 4-bit QLoRA (NF4, double quant)", "06-09",
              "The ladder's rung for this notebook: the sequence length is `max_length` (the "
              "source chapter's `max_seq_length` was renamed in trl), and the micro-batch "
              "`per_device_train_batch_size`.")
