"""The closing cell of each notebook: what this run measured, beside the shipped GPU reference points,
as prose. Every figure is read from the measurements; a comparison that cannot be made here (a point
that did not fit) says why instead (results.not_measured). Lines are at most 100 characters.
"""

from __future__ import annotations

from .results import Measurement, not_measured
from .tables import wrap
from .common import GiB


def _joined(*paragraphs: str) -> str:
    """The paragraphs, each wrapped at 100 characters, one under the other."""
    return "\n".join(wrap(p) for p in paragraphs)


def closing_00(baseline: Measurement, full: Measurement, reference, model: str) -> str:
    """Notebook 00: where this run's memory went (LoRA baseline, full fine-tune) and the reference's
    8B figures beside the chapter's 'about 14 GB'."""
    skip = not_measured(baseline, full)  # on a T4, an 8B model's fp32 rungs do not fit
    here = skip or wrap(
        f"On {baseline.env['device']} with model '{model}': the LoRA baseline peaked at {baseline.mib('peak'):.1f} MiB "
        f"(weights {baseline.mib('parameters'):.1f}, activations {baseline.mib('activations'):.1f}, temporaries "
        f"{baseline.mib('temporaries'):.1f}); the full fine-tune at {full.mib('peak'):.1f} MiB, with gradients "
        f"{full.mib('gradients'):.1f} and optimizer state {full.mib('optimizer'):.1f} MiB.")
    lora8b, full8b = reference
    return _joined(here, f"Reference, Llama-3.1-8B on an H200: LoRA in fp32 {lora8b.peak_gib:.1f} GiB; "
                   f"full fine-tune in bf16 {full8b.peak_gib:.1f} GiB, of which optimizer state "
                   f"{full8b.mib('optimizer') / 1024:.1f} GiB. The chapter's 'about 14 GB without optimization' for "
                   "7B is the bf16 weights alone.")


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
            f"({checkpointed.peak_bytes / baseline.peak_bytes - 1:+.0%}); speed went "
            f"{checkpointed.tokens_per_s / baseline.tokens_per_s - 1:+.0%}.")
    return _joined(skip, f"On the reference GPU run (Llama-3.1-8B, LoRA bf16): activations "
                   f"{ref_before.mib('activations'):,.0f} -> {ref_after.mib('activations'):,.0f} MiB, peak "
                   f"{ref_before.peak_gib:.1f} -> {ref_after.peak_gib:.1f} GiB "
                   f"({ref_after.peak_gib / ref_before.peak_gib - 1:+.0%}), speed "
                   f"{ref_after.tokens_per_s / ref_before.tokens_per_s - 1:+.0%}: a bigger speed cost than the "
                   "chapter's ~20%.")


def closing_02(before: Measurement, after: Measurement, reference) -> str:
    """Notebook 02: what a smaller micro-batch with accumulation did to the peak and the speed, and the
    reference's three batchings of the same 16 sequences."""
    skip = not_measured(before, after)  # on a T4, an 8B model's fp32 rungs do not fit
    here = skip or wrap(
        f"On {after.env['device']}, micro-batch {after.recipe['micro_batch']} x {after.recipe['grad_accum']} instead "
        f"of {before.recipe['micro_batch']} x {before.recipe['grad_accum']} (same {after.recipe_obj.effective_batch} "
        f"sequences per step) took the peak from {before.mib('peak'):.1f} to {after.mib('peak'):.1f} MiB "
        f"({after.peak_bytes / before.peak_bytes - 1:+.0%}) at {after.tokens_per_s / before.tokens_per_s - 1:+.0%} speed.")
    big, mid, small = reference
    return _joined(here, f"Reference (Llama-3.1-8B QLoRA, H200): 16x1 {big.peak_gib:.1f} GiB at "
                   f"{big.tokens_per_s:,.0f} tokens/s; 4x4 {mid.peak_gib:.1f} GiB at {mid.tokens_per_s:,.0f}; "
                   f"1x16 {small.peak_gib:.1f} GiB at {small.tokens_per_s:,.0f}. Micro-batch 1 saves "
                   f"{1 - small.peak_gib / big.peak_gib:.0%} of the peak and runs "
                   f"{big.tokens_per_s / small.tokens_per_s:.1f}x slower: a GPU is fastest with big micro-batches.")


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
    r_adam, r_8bit, r_paged = reference
    return _joined(*here, f"Reference (Llama-3.1-8B LoRA, H200): optimizer state {r_adam.mib('optimizer'):.0f} -> "
                   f"{r_8bit.mib('optimizer'):.0f} MiB of a {r_adam.peak_gib:.1f} GiB peak; paged: "
                   f"{r_paged.peak_gib:.1f} GiB, the same as 8-bit.")


def closing_04(before: Measurement, after: Measurement, reference) -> str:
    """Notebook 04: what the 16-bit rung did to the parameters and the peak here (or that it was not
    measured: this machine runs fp32), and fp32 against bf16 on the reference GPU."""
    skip = not_measured(before, after)  # on a T4, an 8B model's fp32 rungs do not fit
    if not skip and after.precision != before.precision:
        skip = (f"On {after.env['device']}: {before.precision} -> {after.precision} took the parameters from "
                f"{before.mib('parameters'):.1f} to {after.mib('parameters'):.1f} MiB and the peak from "
                f"{before.mib('peak'):.1f} to {after.mib('peak'):.1f} MiB ({after.peak_bytes / before.peak_bytes - 1:+.0%}).")
    elif not skip:
        skip = f"On {after.env['device']} mixed precision was not measured: {after.precision} is what runs here."
    fp32, bf16 = reference
    return _joined(skip, f"Reference (Llama-3.1-8B LoRA, H200): fp32 {fp32.peak_gib:.1f} GiB at "
                   f"{fp32.tokens_per_s:,.0f} tokens/s, bf16 {bf16.peak_gib:.1f} GiB at {bf16.tokens_per_s:,.0f} "
                   f"tokens/s: {1 - bf16.peak_gib / fp32.peak_gib:.0%} less memory, "
                   f"{bf16.tokens_per_s / fp32.tokens_per_s:.1f}x the speed.")


def closing_05(before: Measurement, after: Measurement, reference) -> str:
    """Notebook 05: what 4-bit NF4 did to the parameters, the peak and the speed, here and on the
    reference GPU."""
    skip = not_measured(before, after)  # on a T4, an 8B model's fp32 rungs do not fit
    here = skip or (
        f"On {after.env['device']}, 4-bit NF4 + double quant took the parameter memory from "
        f"{before.mib('parameters'):.1f} to {after.mib('parameters'):.1f} MiB and the peak from "
        f"{before.mib('peak'):.1f} to {after.mib('peak'):.1f} MiB ({after.peak_bytes / before.peak_bytes - 1:+.0%}), "
        f"at {after.tokens_per_s / before.tokens_per_s - 1:+.0%} speed.")
    lora, qlora = reference
    return _joined(here, f"Reference (Llama-3.1-8B, H200): parameters {lora.mib('parameters') / 1024:.1f} -> "
                   f"{qlora.mib('parameters') / 1024:.1f} GiB, peak {lora.peak_gib:.1f} -> {qlora.peak_gib:.1f} GiB, "
                   f"speed {lora.tokens_per_s:,.0f} -> {qlora.tokens_per_s:,.0f} tokens/s "
                   f"({qlora.tokens_per_s / lora.tokens_per_s - 1:+.0%}).")


def closing_07(first: Measurement, last: Measurement, reference, model: str) -> str:
    """Notebook 07: the plain LoRA baseline against the chapter's full recipe here, and the chapter's
    recipe at micro-batch 1 and 16 on the reference GPU (`reference`: every shipped 8B point)."""
    skip = not_measured(first, last)  # on a T4, an 8B model's fp32 rungs do not fit
    here = skip or (
        f"On {first.env['device']} ({model}): from the plain LoRA baseline to the chapter's full recipe the peak "
        f"went {first.mib('peak'):.1f} -> {last.mib('peak'):.1f} MiB ({last.peak_bytes / first.peak_bytes - 1:+.0%}) "
        f"and the speed {first.tokens_per_s:,.0f} -> {last.tokens_per_s:,.0f} tokens/s.")
    ref = {m.label: m for m in reference}
    src, fast = ref["source chapter recipe (QLoRA 1x16)"], ref["QLoRA 16x1"]
    return _joined(here, f"Reference, Llama-3.1-8B on an H200: the chapter's recipe peaks at {src.peak_gib:.2f} "
                   f"GiB ({src.cuda_max_reserved / GiB:.2f} GiB reserved) at {src.tokens_per_s:,.0f} tokens/s; "
                   f"the same recipe at micro-batch 16 uses {fast.peak_gib:.1f} GiB "
                   f"({fast.cuda_max_reserved / GiB:.2f} GiB reserved) at {fast.tokens_per_s:,.0f} tokens/s, "
                   f"{fast.tokens_per_s / src.tokens_per_s:.1f}x faster.")
