"""The checks behind course_utils.exercises: for each notebook's exercise, the figures its task shows, the
check of an answer and the search for the worked solution, all on the course's estimator (cached here).

Each check takes (answer, start, hw): the learner's Recipe, the recipe the exercise starts from and the
estimator's hardware name, and returns a Verdict with the estimated figures it decided on.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Callable

from .estimate import EstimateError, estimate, load_config
from .hardware import GiB, MiB, HardwareError, get_hardware
from .plan import MARGIN_FACTOR, MARGIN_GIB, needed_bytes, parse_budget
from .recipe import CHAPTER_OPTIMIZERS, Recipe, RecipeError, source_chapter_recipe
from .tables import wrap

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
    was = ", ".join(f"{f}={getattr(start, f)!r} (yours: {getattr(answer, f)!r})" for f in extra)
    return Verdict(False, f"change only {', '.join(sorted(allowed))}; your answer also changes {was}")


def _refuse(condition: bool, title: str, lines: tuple[str, ...] = ()) -> Verdict | None:
    """A failing Verdict when `condition` holds, else None."""
    return Verdict(False, title, lines) if condition else None


def _still_lora(a: Recipe) -> Verdict | None:
    return _refuse(a.uses_lora, f"still LoRA (lora_r={a.lora_r}): a full fine-tune is lora_r=None")


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


def _fig_00(start: Recipe, hw: str) -> dict:
    model, tokens = _sides(_est(start, hw))
    return {"recipe": start.describe(), "model": _sum_line(model)[1], "tokens": _sum_line(tokens)[1]}


def _check_00(answer: Recipe, start: Recipe, hw: str) -> Verdict:
    refused = _first(_only(answer, start, {"lora_r", "micro_batch", "max_seq_length"}), _still_lora(answer))
    if refused is not None:
        return refused
    e = _est(answer, hw)
    model, tokens = _sides(e)
    holds = sum(b for _, b in model) > sum(b for _, b in tokens)
    (m_text, m_sum), (t_text, t_sum) = _sum_line(model), _sum_line(tokens)
    return Verdict(holds, "what scales with the model outweighs what scales with the tokens" if holds else
                   "what scales with the tokens is still the larger part: fewer tokens per micro-batch",
                   (f"{m_text} = {m_sum} MiB: scale with the model", f"{t_text} = {t_sum} MiB: scale with the "
                    f"{answer.micro_batch * answer.max_seq_length:,} tokens of a micro-batch",
                    f"estimated peak {_mib(e.peak_bytes)} MiB, {e.moment}"))


def _solve_00(start: Recipe, hw: str) -> Recipe:
    r = start.with_(lora_r=None)
    while not _check_00(r, start, hw) and (r.micro_batch > 1 or r.max_seq_length > 16):
        r = (r.with_(micro_batch=r.micro_batch // 2) if r.micro_batch > 1
             else r.with_(max_seq_length=r.max_seq_length // 2))
    return r


# --- 01: when checkpointing saves most ---------------------------------------------------------------
def _saving(r: Recipe, hw: str) -> tuple:
    on, off = _est(r.with_(gradient_checkpointing=True), hw), _est(r.with_(gradient_checkpointing=False), hw)
    return on, off, 1 - on.peak_bytes / off.peak_bytes


def _fig_01(start: Recipe, hw: str) -> dict:
    on, off, share = _saving(start, hw)
    a, b = _mib(off.peak_bytes), _mib(on.peak_bytes)
    saved = float(a.replace(",", "")) - float(b.replace(",", ""))
    return {"off": a, "on": b, "saved": f"{saved:,.1f}", "share": f"{share:.0%}",
            "positions": f"{_positions(start.model):,}"}


def _check_01(answer: Recipe, start: Recipe, hw: str) -> Verdict:
    refused = _first(_only(answer, start, {"gradient_checkpointing", "micro_batch", "max_seq_length", "grad_accum"}),
                     _refuse(not answer.gradient_checkpointing, "gradient_checkpointing is off: the answer is the "
                             "recipe with it on (the check estimates it with and without)"))
    if refused is not None:
        return refused
    if answer.max_seq_length > _positions(answer.model):
        return Verdict(False, f"max_seq_length={answer.max_seq_length} is longer than the model's "
                              f"{_positions(answer.model):,} positions")
    on, off, share = _saving(answer, hw)
    c_on, c_off = on.by_category, off.by_category
    holds = share > 0.5
    return Verdict(holds, f"checkpointing saves {share:.1%} of the estimated peak"
                   + ("" if holds else ", not more than half"),
                   (f"without checkpointing {_mib(off.peak_bytes)} MiB (activations {_mib(c_off['activations'])}, "
                    f"temporaries {_mib(c_off['temporaries'])})",
                    f"with it {_mib(on.peak_bytes)} MiB (activations {_mib(c_on['activations'])}, temporaries "
                    f"{_mib(c_on['temporaries'])}), at {answer.micro_batch} x {answer.max_seq_length} tokens per "
                    "micro-batch"))


def _solve_01(start: Recipe, hw: str) -> Recipe:
    r = start.with_(gradient_checkpointing=True)
    while _saving(r, hw)[2] <= 0.5 and r.micro_batch < 4096:
        r = r.with_(micro_batch=2 * r.micro_batch)
    return r


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


# --- 03: the optimizer that keeps the least state in a full fine-tune -----------------------------------
def _held_state(r: Recipe, hw: str) -> int:
    """Optimizer state held, paged or not: a paged 8-bit state is the 8-bit state, in unified memory on a GPU."""
    opt = r.optimizer
    if opt.startswith("paged_") and "8bit" in opt:
        opt = opt.removeprefix("paged_")
    return _est(r.with_(optimizer=opt), hw).by_category["optimizer"]


def _fig_03(start: Recipe, hw: str) -> dict:
    return {"adamw": _mib(_held_state(start.with_(lora_r=None, optimizer="adamw_torch"), hw)),
            "names": ", ".join(f"`{o}`" for o in CHAPTER_OPTIMIZERS)}


def _check_03(answer: Recipe, start: Recipe, hw: str) -> Verdict:
    refused = _first(_only(answer, start, {"lora_r", "optimizer"}), _still_lora(answer))
    if refused is not None:
        return refused
    if answer.optimizer not in CHAPTER_OPTIMIZERS:
        return Verdict(False, f"{answer.optimizer!r} is not one of the chapter's optimizers "
                              f"({', '.join(CHAPTER_OPTIMIZERS)}), the ones the estimator models")
    held = {o: _held_state(answer.with_(optimizer=o), hw) for o in CHAPTER_OPTIMIZERS}
    holds = held[answer.optimizer] == min(held.values())
    lines = tuple(f"{o}: {_mib(b)} MiB of optimizer state" + (" (yours)" if o == answer.optimizer else "")
                  for o, b in held.items())
    return Verdict(holds, f"{answer.optimizer} keeps the least state" if holds else
                   f"{answer.optimizer} keeps {_mib(held[answer.optimizer])} MiB; another keeps less",
                   lines + ("paged: the same state as unpaged, in unified memory on a GPU (outside PyTorch's count)",))


def _solve_03(start: Recipe, hw: str) -> Recipe:
    full = start.with_(lora_r=None)
    return full.with_(optimizer=min(CHAPTER_OPTIMIZERS, key=lambda o: _held_state(full.with_(optimizer=o), hw)))


# --- 04: a precision a free T4 runs ----------------------------------------------------------------------
def _fig_04(start: Recipe, hw: str) -> dict:
    cc = get_hardware("t4").compute_capability
    return {"fp32": _mib(_est(start.with_(precision="fp32"), hw).peak_bytes), "cc": ".".join(map(str, cc))}


def _check_04(answer: Recipe, start: Recipe, hw: str) -> Verdict:
    refused = _only(answer, start, {"precision"})
    if refused is not None:
        return refused
    e, why = _try_est(answer, hw)
    if e is None:
        return Verdict(False, f"the estimator refuses precision={answer.precision!r} on a T4", (why,))
    fp32 = _est(answer.with_(precision="fp32"), hw)
    holds = e.peak_bytes < fp32.peak_bytes
    return Verdict(holds, f"precision={answer.precision!r} runs as {e.precision} on a T4"
                   + (", with a lower peak than fp32" if holds else ", no lower than fp32"),
                   (f"estimated {_mib(e.peak_bytes)} MiB against fp32's {_mib(fp32.peak_bytes)} MiB (activations "
                    f"{_mib(e.by_category['activations'])} against {_mib(fp32.by_category['activations'])})",
                    "'auto' is the setting that travels: fp16 on a T4, bf16 on Ampere and later, fp32 on a CPU"))


def _solve_04(start: Recipe, hw: str) -> Recipe:
    return start.with_(precision="auto")


# --- 05: Llama-3.1-8B on a free T4 ---------------------------------------------------------------------
def _fig_05(start: Recipe, hw: str) -> dict:
    s8 = start.with_(model=REFERENCE_MODEL)
    e = _est(s8, hw)
    need = float(_gib(e.peak_bytes)) * MARGIN_FACTOR + MARGIN_GIB
    return {"recipe": s8.describe(), "peak": _gib(e.peak_bytes), "factor": MARGIN_FACTOR, "margin": MARGIN_GIB,
            "need": f"{need:.2f}", "t4": _gib(_t4_bytes()), "seq": start.max_seq_length, "n": start.effective_batch}


def _check_05(answer: Recipe, start: Recipe, hw: str) -> Verdict:
    if answer.model != REFERENCE_MODEL:
        return Verdict(False, f"this exercise is about Llama-3.1-8B: set model={REFERENCE_MODEL!r} "
                              f"(yours: {answer.model!r})")
    e, why = _try_est(answer, hw)
    refused = _first(_same_steps(answer, start), _refuse(e is None, "the estimator refuses it on a T4", (why,)))
    if refused is not None:
        return refused
    if not answer.load_in_4bit:
        return Verdict(False, "the frozen weights are not 4-bit yet (load_in_4bit=True): this notebook's technique",
                       (_need_line(e, _t4_bytes()),))
    c = e.by_category
    holds = needed_bytes(e) <= _t4_bytes()
    return Verdict(holds, "the estimator says it fits a free T4" if holds else "it does not fit a T4 yet",
                   (_need_line(e, _t4_bytes()), f"weights {_gib(c['parameters'])} GiB, activations "
                    f"{_gib(c['activations'])} GiB, temporaries {_gib(c['temporaries'])} GiB ({e.moment})"))


def _solve_05(start: Recipe, hw: str) -> Recipe:
    r = start.with_(model=REFERENCE_MODEL, load_in_4bit=True)
    for change in ({"precision": "auto"}, {"gradient_checkpointing": True},
                   {"micro_batch": 1, "grad_accum": start.effective_batch}, {"optimizer": "paged_adamw_8bit"}):
        if _t4_fits(r):
            break
        r = r.with_(**change)
    return r


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


# --- 07: the largest micro-batch of the chapter's recipe on a free T4 ------------------------------------
def _fig_07(start: Recipe, hw: str) -> dict:
    e = _est(start.with_(precision="auto"), hw)
    need = float(_gib(e.peak_bytes)) * MARGIN_FACTOR + MARGIN_GIB
    return {"recipe": start.describe(), "n": start.effective_batch, "seq": start.max_seq_length,
            "mb": start.micro_batch, "acc": start.grad_accum, "peak": _gib(e.peak_bytes), "factor": MARGIN_FACTOR,
            "margin": MARGIN_GIB, "need": f"{need:.2f}", "t4": _gib(_t4_bytes())}


def _check_07(answer: Recipe, start: Recipe, hw: str) -> Verdict:
    refused = _first(_only(answer, start, {"micro_batch", "grad_accum", "precision"}), _same_steps(answer, start))
    if refused is not None:
        return refused
    e, why = _try_est(answer, hw)
    if e is None:
        return Verdict(False, "the estimator refuses this recipe on a T4: precision='auto' is fp16 there", (why,))
    line = f"micro-batch {answer.micro_batch} x {answer.grad_accum}: {_need_line(e, _t4_bytes())}"
    if needed_bytes(e) > _t4_bytes():
        return Verdict(False, "it does not fit a T4: a smaller micro-batch", (line,))
    larger = _larger_fits(answer, _t4_fits)
    if larger:
        return Verdict(False, f"it fits, but micro-batch {larger} fits a T4 too",
                       (line, _need_line(_est(_at(answer, larger), hw), _t4_bytes())))
    return Verdict(True, "the largest micro-batch that fits a free T4 at the same sequences per step", (line,))


def _solve_07(start: Recipe, hw: str) -> Recipe:
    return _largest(start.with_(precision="auto"), _t4_fits)


# --- 08: the chapter's "7B on 6GB", with notebook 08's changes --------------------------------------------
BEYOND_KNOBS = {"prepare_kbit", "offload_embeddings", "liger_kernels", "offload_activations", "torch_compile",
                "micro_batch", "grad_accum"}


def claim_bytes() -> tuple[str, int]:
    """The chapter's memory in CLAIM ('6GB'), as written and in bytes (a GB is 10^9 bytes)."""
    written = re.search(r"on (\d+(?:\.\d+)?GB)$", CLAIM).group(1)
    return written, parse_budget(written)


def _fig_08(start: Recipe, hw: str) -> dict:
    written, budget = claim_bytes()
    return {"claim": CLAIM, "alloc": _gib(_est(start, hw).cuda_allocated_bytes), "gb": written.removesuffix("GB"),
            "budget": _gib(budget), "n": start.effective_batch}


def _check_08(answer: Recipe, start: Recipe, hw: str) -> Verdict:
    refused = _first(_only(answer, start, BEYOND_KNOBS), _same_steps(answer, start))
    if refused is not None:
        return refused
    written, budget = claim_bytes()
    e = _est(answer, hw)
    holds = e.cuda_allocated_bytes <= budget
    return Verdict(holds, f"the estimate allocates {'at most' if holds else 'more than'} the chapter's {written}", (
        f"estimated peak {_gib(e.peak_bytes)} GiB + CUDA libraries' {_gib(e.cuda_extra.nbytes)} GiB = "
        f"{_gib(e.cuda_allocated_bytes)} GiB allocated, against {written} = {_gib(budget)} GiB",
        f"a card holds more than the allocated peak (the allocator's reserve, the CUDA context): by the planner's "
        f"rule this recipe needs {_gib(needed_bytes(e))} GiB"))


def _solve_08(start: Recipe, hw: str) -> Recipe:
    r, budget = start, claim_bytes()[1]
    for change in ({"prepare_kbit": False}, {"offload_embeddings": True}, {"offload_activations": True},
                   {"liger_kernels": True}):
        if _est(r, hw).cuda_allocated_bytes <= budget:
            break
        r = r.with_(**change)
    return r
