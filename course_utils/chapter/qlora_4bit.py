"""Notebook 05 (notebooks/05_qlora_4bit.ipynb, quizzes/05_qlora_4bit.yaml): 4-bit QLoRA: NF4 and double quantization.

Notebook 05 (and 00's weight count): how 4-bit NF4 weights are stored, counted from the loaded model,
and what peft's prepare_model_for_kbit_training does to the weights around them. Each demonstration that
loads a model gives the memory back before it returns (lessons.releases_memory).
"""

from __future__ import annotations

import math

from course_utils import machine
from course_utils.chapter.every_notebook import load_for_inspection, releases_memory
from course_utils.chapter.exercises import (Exercise, REFERENCE_MODEL, Verdict, _est, _first, _gib, _need_line,
                                            _refuse, _same_steps, _t4_bytes, _t4_fits, _try_est)
from course_utils.common import GiB, MiB
from course_utils.estimate.peak import estimate
from course_utils.estimate.shapes import model_shapes
from course_utils.estimate.plan import MARGIN_FACTOR, MARGIN_GIB, needed_bytes
from course_utils.memtrack import _quant_state_tensors, tensor_bytes
from course_utils.recipe import Recipe
from course_utils.results import Measurement, from_store_note
from course_utils.show.speeds import speed_words
from course_utils.show.report import _joined, not_measured

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
_T05 = ("The base recipe on the Llama-3.1-8B architecture (`model_id = \"meta-llama/Llama-3.1-8B\"`: {recipe}) is "
        "estimated at {peak} GiB on a free T4. With the planner's margin for the allocator's reserve and the CUDA "
        "context it needs {peak} x {factor} + {margin} = {need} GiB, and a T4 has {t4} GiB. Make it **fit**: store "
        "the frozen weights in 4 bits (`bnb_config = BitsAndBytesConfig(load_in_4bit=True, ...)`), then add what "
        "the estimate says is still missing. Train the same data: keep the sequence length ({seq}) and the "
        "sequences per optimizer step ({n}).")


def closing_05(before: Measurement, after: Measurement, reference) -> str:
    """Notebook 05: what 4-bit NF4 did to the parameters, the peak and the speed, here and on the
    reference GPU."""
    skip = not_measured(before, after)  # on a T4, an 8B model's fp32 rungs do not fit
    here = skip or (
        f"On {after.env['device']}, 4-bit NF4 + double quant took the parameter memory from "
        f"{before.mib('parameters'):.1f} to {after.mib('parameters'):.1f} MiB and the peak from "
        f"{before.mib('peak'):.1f} to {after.mib('peak'):.1f} MiB ({after.peak_bytes / before.peak_bytes - 1:+.0%}), "
        f"{speed_words(before, after)}.")
    stored = from_store_note([before, after])  # figures read back from the store say so, with their date
    here = f"{here} {stored}" if stored and not skip else here
    lora, qlora = reference
    return _joined(here, f"Reference (Llama-3.1-8B, H200): parameters {lora.mib('parameters') / 1024:.1f} -> "
                   f"{qlora.mib('parameters') / 1024:.1f} GiB, peak {lora.peak_gib:.1f} -> {qlora.peak_gib:.1f} GiB, "
                   f"{speed_words(lora, qlora)}.")


def weight_storage(model) -> list[dict]:
    """Notebooks 00 and 05: every weight tensor of a model: its name, how it is stored, how many parameters
    it holds, and its bytes (4-bit weights with their quantization state: scales, nested scales, code
    tables)."""

    rows = []
    for name, p in model.named_parameters():
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            numel = math.prod(qs.shape)
            rows.append(dict(name=name, stored=f"4-bit {qs.quant_type}" + (" +DQ" if qs.nested else ""),
                             params=numel, bytes=tensor_bytes([p] + _quant_state_tensors(qs))))
        else:
            rows.append(dict(name=name, stored=str(p.dtype).replace("torch.", ""), params=p.numel(),
                             bytes=p.numel() * p.element_size()))
    return rows


def weight_groups(model) -> dict[str, dict]:
    """Notebooks 00 and 05: weight_storage() summed by what the weights are: quantized linear layers,
    LoRA, embeddings, the output layer, norms. Each group: parameters, bytes, how stored, bits per
    parameter."""
    groups: dict[str, dict] = {}
    for row in weight_storage(model):
        name = row["name"]
        group = ("LoRA adapters" if "lora_" in name else "embeddings" if "embed" in name
                 else "lm_head (output layer)" if "lm_head" in name else "norms" if "norm" in name
                 else "linear layers")
        g = groups.setdefault(group, dict(params=0, bytes=0, stored=set()))
        g["params"] += row["params"]
        g["bytes"] += row["bytes"]
        g["stored"].add(row["stored"])
    for g in groups.values():
        g["stored"] = ", ".join(sorted(g["stored"]))
        g["bits_per_param"] = 8 * g["bytes"] / g["params"]
    return groups


@releases_memory
def quantized_weights(model: str, double_quant: bool = True) -> tuple[dict[str, dict], dict]:
    """Notebook 05: the 4-bit model's weights by group, and its biggest 4-bit weight (name, parameters,
    bytes), from one load."""
    loaded = load_for_inspection(model, load_in_4bit=True, double_quant=double_quant)
    rows = weight_storage(loaded)
    return weight_groups(loaded), max((r for r in rows if r["stored"].startswith("4-bit")), key=lambda r: r["params"])


def half_precision() -> str:
    """The 16-bit type this machine trains in: bf16 where it is native, fp16 on a GPU without it (a T4),
    and bf16 on a CPU (only to see bytes move, as notebook 05 does)."""

    return "bf16" if machine.bf16_supported() or machine.device_type() == "cpu" else "fp16"


def nf4_bits(model: str = "llama-3.1-8b", name: str = "Llama-3.1-8B") -> str:
    """Notebook 05: bits a parameter takes in NF4 (4 bits and one fp32 scale a block of 64) and with double
    quantization (the scales in 8 bits, one fp32 scale a block of 256 of them), and what that makes of the
    model's linear-layer weights (its shapes: estimate.model_shapes) against bf16."""

    plain = 4 + 32 / 64
    double = 4 + 8 / 64 + 32 / (64 * 256)
    s = model_shapes(model)
    linear = s.layers * sum(i * o for _, i, o in s.layer_linears)  # q, k, v, o and the MLP's, every layer
    return "\n".join([
        f"NF4:                  4 + 32/64             = {plain:.3f} bits per parameter",
        f"NF4 + double quant:   4 + 8/64 + 32/(64*256) = {double:.3f} bits per parameter",
        f"{name}'s {linear / 1e9:.2f} B linear-layer weights: {linear * 2 / GiB:.2f} GiB in bf16, "
        f"{linear * double / 8 / GiB:.2f} GiB in NF4 + double quant"])


# The notebook's exercise (course_utils.chapter.exercises shows and checks it)
EXERCISE = Exercise("05_qlora_4bit", "Llama-3.1-8B on a free T4", _T05, _fig_05, _check_05, _solve_05,
             "4-bit weights, then mixed precision, checkpointing, micro-batch 1 and a paged 8-bit optimizer, "
             "each added only while the estimate does not fit yet", hardware="t4")

# The "In your own script" cells of the notebook (kind, the rung they write, the rung they are compared with, the cell
# they follow, what the markdown above them says): `scripts/notebooks/write_notebooks.py own-script` writes them.
OWN_SCRIPT = ("ladder", "+ 4-bit QLoRA (NF4, double quant)", "+ mixed precision", "05-11",
              "QLoRA is a `BitsAndBytesConfig` passed to `from_pretrained`, then "
              "`prepare_model_for_kbit_training` (the fp32 upcast notebook 09 removes) before the "
              "`LoraConfig`. On a T4: `bnb_4bit_compute_dtype=torch.float16` and `fp16=True`.")
