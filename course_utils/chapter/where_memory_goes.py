"""Notebook 00 (notebooks/00_where_memory_goes.ipynb, quizzes/00_where_memory_goes.yaml): Where training memory goes.

Its room in the package: what the notebook's cells import, what its exercise checks, and what other rooms or the README quote from it. The code the notebook teaches is in the notebook itself.
"""

from __future__ import annotations


from course_utils.chapter.every_notebook import skeleton
from course_utils.chapter.exercises import (Exercise, Verdict, _est, _first, _mib, _only, _sides, _still_lora,
                                            _sum_line)
from course_utils.common import GiB, MiB
from course_utils.recipe import Recipe
from course_utils.results import Measurement
from course_utils.show.report import _joined, dated, not_measured
from course_utils.show.tables import wrap

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


# --- the exercises -------------------------------------------------------------------------------------
_T00 = ("The base recipe ({recipe}) holds {model} MiB at its estimated peak that scale with the model (weights, "
        "gradients, optimizer state) and {tokens} MiB that scale with the tokens of a micro-batch (activations, "
        "temporaries). Make it a **full fine-tune** (`peft_config = None`: no LoraConfig, every weight trains) and "
        "choose the tokens of a micro-batch (`per_device_train_batch_size`, `max_length`) so that at the estimated "
        "peak what scales with the model outweighs what scales with the tokens. Change nothing else.")


def lora_trainable(model: str, recipe: Recipe) -> dict[str, int]:
    """Notebooks 00 and 03: parameters of the whole model, of the LoRA adapters the recipe adds (r x (in +
    out) per adapted layer) and of the input embedding, counted on a weightless (meta) copy."""
    shape = skeleton(model)
    lora = sum(recipe.lora_r * (m.in_features + m.out_features) for name, m in shape.named_modules()
               if name.rsplit(".", 1)[-1] in recipe.lora_targets)
    return {"all": sum(p.numel() for p in shape.parameters()), "lora": lora,
            "embedding": shape.get_input_embeddings().weight.numel()}


def closing_00(baseline: Measurement, full: Measurement, reference, model: str) -> str:
    """Notebook 00: where this run's memory went (LoRA baseline, full fine-tune) and the reference's
    8B figures beside the chapter's 'about 14 GB'."""
    skip = not_measured(baseline, full)  # on a T4, an 8B model's fp32 rungs do not fit
    here = skip or wrap(
        f"On {baseline.env['device']} with model '{model}': the LoRA baseline peaked at {baseline.mib('peak'):.1f} MiB "
        f"(weights {baseline.mib('parameters'):.1f}, activations {baseline.mib('activations'):.1f}, temporaries "
        f"{baseline.mib('temporaries'):.1f}); the full fine-tune at {full.mib('peak'):.1f} MiB, with gradients "
        f"{full.mib('gradients'):.1f} and optimizer state {full.mib('optimizer'):.1f} MiB.")
    here = here if skip else dated(here, baseline, full)  # figures read back from the store say so, with their date
    lora8b, full8b = reference
    return _joined(here, f"Reference, Llama-3.1-8B on an H200: LoRA in fp32 {lora8b.peak_gib:.1f} GiB; "
                   f"full fine-tune in bf16 {full8b.peak_gib:.1f} GiB, of which optimizer state "
                   f"{full8b.mib('optimizer') / 1024:.1f} GiB. The chapter's 'about 14 GB without optimization' for "
                   "7B is the bf16 weights alone.")


# The notebook's exercise (course_utils.chapter.exercises shows and checks it)
EXERCISE = Exercise("00_where_memory_goes", "what grows with the model, what with the tokens", _T00, _fig_00,
             _check_00, _solve_00, "a full fine-tune, then the micro-batch halved (then the sequence) until "
                                       "the model's part is the larger")

# The "In your own script" cells of the notebook (kind, the rung they write, the rung they are compared with, the cell
# they follow, what the markdown above them says): `scripts/notebooks/write_notebooks.py own-script` writes them.
OWN_SCRIPT = ("ladder", "baseline (LoRA, fp32)", None, "00-11",
              "The baseline you just measured, as your own training script writes it, with the lines "
              "that read the GPU's peak memory around `trainer.train()`.")
