"""Notebook 01 (notebooks/01_gradient_checkpointing.ipynb, quizzes/01_gradient_checkpointing.yaml): Gradient checkpointing.

Its room in the package: what the notebook's cells import, what its exercise checks, and what other rooms or the README quote from it. The code the notebook teaches is in the notebook itself.
"""

from __future__ import annotations

import json

from course_utils.chapter.every_notebook import lora_grads_under_checkpointing  # noqa: F401  (notebook 01's import)
from course_utils.chapter.exercises import Exercise, Verdict, _first, _mib, _only, _positions, _refuse, _saving
from course_utils.common import GiB, MiB, shipped
from course_utils.recipe import Recipe
from course_utils.results import Measurement
from course_utils.show.speeds import speed_words
from course_utils.show.report import _joined, dated, not_measured
from course_utils.show.tables import Column, Table, wrap

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
_T01 = ("At the base recipe checkpointing takes the estimated peak from {off} to {on} MiB: {off} - {on} = {saved} "
        "MiB, {share} of it, because activations are only part of the peak. Change the tokens of a micro-batch "
        "(`per_device_train_batch_size`, `max_length`: this model has {positions} positions) so that checkpointing "
        "saves **more than half** of the estimated peak. Your answer keeps `activation_checkpointing=True`; the "
        "check estimates it with and without.")


def closing_01(baseline: Measurement, checkpointed: Measurement, reference, model: str) -> str:
    """Notebook 01: what gradient checkpointing did to the activations, the peak and the speed, here and
    on the reference GPU."""
    ref_before, ref_after = reference
    skip = not_measured(baseline, checkpointed)  # on a T4, an 8B model's fp32 rungs do not fit
    if not skip:
        saved = 1 - checkpointed.peak_by_category["activations"] / baseline.peak_by_category["activations"]
        skip = wrap(
            f"On {baseline.env['device']} with model '{model}', gradient checkpointing cut the activations at the "
            f"peak from {baseline.mib('activations'):.1f} to {checkpointed.mib('activations'):.1f} MiB ({saved:.0%} "
            f"less) and the peak from {baseline.mib('peak'):.1f} to {checkpointed.mib('peak'):.1f} MiB "
            f"({checkpointed.peak_bytes / baseline.peak_bytes - 1:+.0%}); {speed_words(baseline, checkpointed)}.")
        skip = dated(skip, baseline, checkpointed)  # figures read back from the store say so, with their date
    return _joined(skip, f"On the reference GPU run (Llama-3.1-8B, LoRA bf16): activations "
                   f"{ref_before.mib('activations'):,.0f} -> {ref_after.mib('activations'):,.0f} MiB, peak "
                   f"{ref_before.peak_gib:.1f} -> {ref_after.peak_gib:.1f} GiB "
                   f"({ref_after.peak_gib / ref_before.peak_gib - 1:+.0%}), {speed_words(ref_before, ref_after)}: "
                   "a bigger speed cost than the chapter's ~20%.")


# The notebook's exercise (course_utils.chapter.exercises shows and checks it)
EXERCISE = Exercise("01_gradient_checkpointing", "when checkpointing saves most", _T01, _fig_01, _check_01, _solve_01,
             "checkpointing on, then the micro-batch doubled until the saving passes half: past the loss's "
             "token tile its temporaries stop growing, the activations do not")


def selective_rows(name: str = "llama-3.1-8b.jsonl") -> list[dict]:
    """The shipped H200 run of none, full and selective checkpointing (scripts/gpu/selective_checkpointing.py,
    course_utils/reference/checkpointing/): one dict per setting and micro-batch."""
    path = shipped("reference", "checkpointing") / name
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def selective_table(name: str = "llama-3.1-8b.jsonl") -> Table:
    """Notebook 01's 'Selective checkpointing, tried': peak and speed of each setting against no checkpointing,
    in the one run the file holds."""
    rows = selective_rows(name)
    none = {r["micro_batch"]: r["tokens_per_s"] for r in rows if r["setting"] == "none"}
    first = rows[0]
    return Table([Column("setting"), Column("micro-batch", fmt="d"), Column("peak allocated", "GiB", fmt=".2f"),
                  Column("kept for the backward", "GiB", fmt=".2f"), Column("tokens/s", fmt=",.0f"),
                  Column("vs none", fmt=".2f")],
                 [(r["setting"], r["micro_batch"], r["peak_allocated_bytes"] / GiB, r["saved_for_backward_bytes"] / GiB,
                   r["tokens_per_s"], r["tokens_per_s"] / none[r["micro_batch"]]) for r in rows],
                 title=f"{first['model']}, {first['recipe']}, sequence {first['seq']}, {first['device']}: median of "
                       f"{first['repeats']} interleaved runs ({first['date'][:10]}, torch {first['env']['versions']['torch']})")

# The "In your own script" cells of the notebook (kind, the rung they write, the rung they are compared with, the cell
# they follow, what the markdown above them says): `scripts/notebooks/write_notebooks.py own-script` writes them.
OWN_SCRIPT = ("ladder", "+ gradient checkpointing", "baseline (LoRA, fp32)", "01-07",
              "Checkpointing is two `SFTConfig` arguments. trl 1.16's `SFTConfig()` turns "
              "it **on** by default, so a recipe without it must say `activation_checkpointing=False`.")
