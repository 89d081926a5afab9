"""Notebook 03 (notebooks/03_efficient_optimizers.ipynb, quizzes/03_efficient_optimizers.yaml): 8-bit and paged optimizers.

Its room in the package: what the notebook's cells import, what its exercise checks, and what other rooms or the README quote from it. The code the notebook teaches is in the notebook itself.
"""

from __future__ import annotations


from course_utils.chapter.every_notebook import _paged_all_linear
from course_utils.chapter.exercises import Exercise, Verdict, _est, _first, _mib, _only, _still_lora
from course_utils.chapter.facts import ref
from course_utils.common import GiB, MiB
from course_utils.estimate.peak import estimate
from course_utils.estimate.shapes import model_shapes
from course_utils.estimate.terms import BNB_PAGE_MIN, lora_shapes
from course_utils.recipe import CHAPTER_OPTIMIZERS, Recipe, source_chapter_recipe
from course_utils.results import Measurement
from course_utils.show.report import _joined, dated, not_measured
from course_utils.show.tables import wrap

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
_T03 = ("A full fine-tune of this model (`peft_config = None`) with AdamW keeps {adamw} MiB of optimizer state at "
        "the estimated peak. Which of the chapter's optimizers (`optim=`: {names}) keeps the **least**? Show it: "
        "your answer is the full fine-tune with that optimizer; the check lists what each one keeps. Paged state "
        "counts: paging moves state out of PyTorch's allocator, it does not make it smaller.")


def paging(model: str = "llama-3.1-8b") -> str:
    """Notebook 03: which optimizer states bitsandbytes pages (tensors of at least estimate.BNB_PAGE_MIN elements:
    none of LoRA's, nearly all of a full fine-tune's), and the H200 pair that shows what paging does to the
    measured peak (paged buffers live outside PyTorch's allocator). Lines are at most 100 characters."""

    s, recipe, least = model_shapes(model), source_chapter_recipe(model), BNB_PAGE_MIN
    lora = [n for _, i, o in lora_shapes(recipe, s) for n in (recipe.lora_r * i, recipe.lora_r * o)] * s.layers
    full = [i * o for _, i, o in s.layer_linears] * s.layers + [s.embed_params] + (
        [s.lm_head_params] if s.lm_head_params else []) + [n for _, n, count in s.small_tensors for _ in range(count)]
    paged_full = [n for n in full if n >= least]
    lines = [f"bitsandbytes pages the optimizer state of tensors with at least {least:,} elements ({model}):",
             f"  LoRA r={recipe.lora_r} on q/k/v/o: {len(lora)} tensors of {min(lora):,} to {max(lora):,} elements: "
             f"{sum(n >= least for n in lora)} paged",
             _paged_all_linear(recipe, s, least),
             f"  a full fine-tune: {len(paged_full)} of {len(full)} tensors paged, "
             f"{sum(paged_full) / sum(full):.4%} of the parameters"]
    unpaged, paged = ref("full FT bf16, ckpt, 1x16, adamw_8bit", model), ref("full FT bf16, ckpt, 1x16, paged 8-bit", model)
    if unpaged.run_id != paged.run_id:
        raise ValueError("the paged and unpaged reference runs come from different measurement runs")
    lines += [f"Measured on the {paged.env['device']} (run {paged.run_id}), a full fine-tune, 8-bit AdamW:",
              f"  unpaged: optimizer state {unpaged.mib('optimizer'):,.0f} MiB in PyTorch's allocator, "
              f"allocated peak {unpaged.cuda_max_allocated / 2**30:.1f} GiB",
              f"  paged:   {paged.mib('optimizer'):,.0f} MiB there, allocated peak {paged.cuda_max_allocated / 2**30:.1f} GiB: "
              "the rest is in unified memory, which PyTorch does not count",
              f"  same training: final loss {unpaged.final_loss:.3f} and {paged.final_loss:.3f}; "
              f"{unpaged.tokens_per_s:,.0f} and {paged.tokens_per_s:,.0f} tokens/s"]
    return wrap("\n".join(lines))


def closing_03(adamw: Measurement, eight: Measurement, paged: Measurement, full, reference) -> str:
    """Notebook 03: the optimizer state with AdamW, 8-bit and paged 8-bit AdamW (LoRA), and AdamW against
    8-bit for a full fine-tune (`full`: that pair), here and on the reference GPU."""
    skip = not_measured(adamw, eight, paged, *full)  # on a T4, an 8B model's fp32 rungs do not fit
    here = [skip] if skip else [
        f"LoRA on {adamw.env['device']}: optimizer state {adamw.mib('optimizer'):.2f} MiB with AdamW, "
        f"{eight.mib('optimizer'):.2f} MiB 8-bit, {paged.mib('optimizer'):.2f} MiB paged 8-bit; "
        f"the peak moved {eight.peak_bytes / adamw.peak_bytes - 1:+.1%}.",
        f"Full fine-tune: optimizer state {full[0].mib('optimizer'):.1f} -> {full[1].mib('optimizer'):.1f} MiB "
        f"({full[1].peak_by_category['optimizer'] / full[0].peak_by_category['optimizer'] - 1:+.0%}), "
        f"peak {full[0].mib('peak'):.1f} -> {full[1].mib('peak'):.1f} MiB."]
    here[-1] = here[-1] if skip else dated(here[-1], adamw, eight, paged, *full)  # read back from the store: dated
    r_adam, r_8bit, r_paged = reference
    return _joined(*here, f"Reference (Llama-3.1-8B LoRA, H200): optimizer state {r_adam.mib('optimizer'):.0f} -> "
                   f"{r_8bit.mib('optimizer'):.0f} MiB of a {r_adam.peak_gib:.1f} GiB peak; paged: "
                   f"{r_paged.peak_gib:.1f} GiB, the same as 8-bit.")


# The notebook's exercise (course_utils.chapter.exercises shows and checks it)
EXERCISE = Exercise("03_efficient_optimizers", "the optimizer that keeps the least state", _T03, _fig_03, _check_03,
             _solve_03, "the full fine-tune estimated with each of the chapter's optimizers, the least state kept")

# The "In your own script" cells of the notebook (kind, the rung they write, the rung they are compared with, the cell
# they follow, what the markdown above them says): `scripts/notebooks/write_notebooks.py own-script` writes them.
OWN_SCRIPT = ("ladder", "+ paged 8-bit AdamW", "+ accumulation (micro-batch 1)", "03-07",
              "The optimizer is one string, `optim=`: `\"adamw_8bit\"` for 8-bit state, "
              "`\"paged_adamw_8bit\"` for 8-bit state that can be paged out.")
