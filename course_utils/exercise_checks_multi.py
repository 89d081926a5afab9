"""The check behind notebook 09_more_than_one_gpu's exercise (course_utils.exercises): the smallest number of
24 GiB GPUs on which FSDP-QLoRA of the Llama-3.1-70B architecture, with the published recipe (peft's FSDP-QLoRA
example, estimate.anchor_recipe), fits per GPU by the planner's rule, without CPU offload. The answer is a GPU
count, decided by estimate_distributed; the exercise's figures come from it and from the budget text.
"""

from __future__ import annotations

import functools

from .exercise_checks import Verdict
from .hardware import GiB
from .plan import MARGIN_FACTOR, MARGIN_GIB, needed_bytes
from .recipe import Recipe

MODEL = "llama-3.1-70b"
CARDS = "2 x 24 GiB"  # the learner's pair of cards (RTX 3090/4090); the exercise asks how many such cards
MAX_GPUS = 64


def card_bytes() -> int:
    """One card's memory, read from CARDS as the planner reads a budget."""
    from .plan_multi import parse_gpu_budget

    return parse_gpu_budget(CARDS)[1]


def start_recipe(base: Recipe | None = None) -> Recipe:
    """The exercise's recipe: the anchor's settings on the Llama-3.1-70B preset (whatever the notebook's base)."""
    from .estimate import anchor_recipe

    return anchor_recipe(MODEL)


@functools.lru_cache(maxsize=128)
def _est(recipe: Recipe, gpus: int, hw: str):
    from .estimate import estimate_distributed

    return estimate_distributed(recipe, gpus, "fsdp", hardware=hw)


def _need_line(recipe: Recipe, gpus: int, hw: str) -> str:
    e = _est(recipe, gpus, hw)
    need, card = needed_bytes(e), card_bytes()
    return (f"{gpus} GPUs: estimated {e.per_gpu_gib:.2f} GiB per GPU x {MARGIN_FACTOR} + {MARGIN_GIB} = "
            f"{need / GiB:.2f} GiB needed, {'within' if need <= card else 'over'} {card / GiB:g} GiB")


def _fits(recipe: Recipe, gpus: int, hw: str) -> bool:
    return needed_bytes(_est(recipe, gpus, hw)) <= card_bytes()


def figures(start: Recipe, hw: str) -> dict:
    e = _est(start, 2, hw)
    need = float(f"{e.per_gpu_gib:.2f}") * MARGIN_FACTOR + MARGIN_GIB
    return {"recipe": start.describe(), "two": f"{e.per_gpu_gib:.2f}", "factor": MARGIN_FACTOR, "margin": MARGIN_GIB,
            "need": f"{need:.2f}", "card": f"{card_bytes() / GiB:g}"}


def check(answer, start: Recipe, hw: str) -> Verdict:
    if isinstance(answer, bool) or not isinstance(answer, int) or answer < 1:
        return Verdict(False, f"the answer is a number of GPUs, a whole number of 1 or more (yours: {answer!r})")
    if answer > MAX_GPUS:
        return Verdict(False, f"{answer} GPUs is more than this exercise looks at ({MAX_GPUS}): try fewer")
    lines = [_need_line(start, answer, hw)] + ([_need_line(start, answer - 1, hw)] if answer > 1 else [])
    if not _fits(start, answer, hw):
        return Verdict(False, f"on {answer} GPUs it does not fit one card yet", tuple(lines))
    if answer > 1 and _fits(start, answer - 1, hw):
        return Verdict(False, f"it fits on {answer} GPUs, and on {answer - 1} too: find the smallest",
                       tuple(lines))
    return Verdict(True, f"{answer} GPUs is the smallest count on which each card holds its share", tuple(lines))


def solve(start: Recipe, hw: str) -> int:
    for n in range(1, MAX_GPUS + 1):
        if _fits(start, n, hw):
            return n
    raise ValueError(f"{start.describe()} does not fit {CARDS} cards on {MAX_GPUS} GPUs")
