"""Notebook 08 (after training): merging a LoRA adapter into its base, measured beside the estimate.

`merge_adapter(folder)` beside `merge_estimate(model, ...)`: peft 0.21's merge_and_unload on a
bitsandbytes 4-bit layer (peft/tuners/lora/bnb.py, Linear4bit.merge) warns "Merge lora module to 4-bit
linear may get different generations due to rounding errors", dequantizes the NF4 weight, adds
B @ A x scale, and quantizes the sum to NF4 again (Params4bit(...).to(device)): the merged model stays
4-bit, as small as the base, but an update smaller than half a step between NF4 levels rounds back to
the code it had, so most of the adapter is lost. A 16/32-bit base keeps it, and needs the whole model
at that width. Measured: tensor bytes, the peak while merging, how much of the adapter the merge keeps.
A merge whose estimated peak is more than the device has free (an 8B model's 16-bit merge on a T4) is
not started: its Merged says why, and the estimate stands in for it.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from course_utils import machine
from course_utils.chapter.after_training import (AdapterError, RECIPE_FILE, check_adapter, data_prompts, fmt,
                                                 in_fresh_process, load_base, saved_recipe)
from course_utils.estimate.shapes import model_shapes
from course_utils.estimate.terms import nf4_bytes
from course_utils.machine import release_memory, resolve_precision
from course_utils.memtrack import MemoryTracker, model_state_tensors, tensor_bytes
from course_utils.show.tables import wrap

@dataclass
class Merged:
    """What merging an adapter did, measured on this machine."""

    load_in_4bit: bool
    bytes_before: int = 0  # base weights + LoRA weights (tensor bytes)
    bytes_after: int = 0  # the merged model
    peak_bytes: int = 0  # tensor-level peak while merging, the weights included
    stored_as: str = ""  # how a merged attention projection is stored
    warnings: list[str] = field(default_factory=list)
    logit_change: dict = field(default_factory=dict)  # mean abs logit gap: adapter vs base, merged vs adapter
    # ("merge"), merged vs base ("kept")
    skipped: str = ""  # why it was not run here (the estimate did not fit the device); "" when it ran


def merge_adapter(adapter: str | os.PathLike, load_in_4bit: bool = True, base: str | None = None,
                  isolate: bool | None = None) -> Merged:
    """Load the base (NF4 if load_in_4bit) with the adapter on it and merge_and_unload under the tensor
    tracker (what peft does: the module docstring). The models are gone when it returns (release_memory).
    On a GPU, a merge whose estimated peak (merge_estimate) is more than this process can take
    (hardware.available_bytes: under the T4 profile, the T4's) is not started; its Merged.skipped says why.
    isolate=None: a merge that runs does so in a fresh process on a GPU (`python -m course_utils.chapter.merging`),
    so this kernel keeps none of its CUDA memory; in this process on a CPU."""

    folder = check_adapter(adapter)
    recipe = saved_recipe(folder)
    base = base or (recipe.model if recipe else None)
    if base is None:
        raise AdapterError(f"{folder} has no {RECIPE_FILE}: pass base=, the model the adapter was trained on.")
    if machine.device_type() == "cuda":
        release_memory()
        need, free = merge_estimate(base, load_in_4bit)["peak"], machine.available_bytes()
        if need > free:
            return Merged(load_in_4bit=load_in_4bit,
                          skipped=f"not run here: its estimated peak, {fmt(need)}, is more than the {fmt(free)} "
                                  "this process can take on this card")
    if isolate or (isolate is None and machine.device_type() == "cuda"):
        args = ["--adapter", str(folder), "--base", base] + (["--load-in-4bit"] if load_in_4bit else [])
        return Merged(**in_fresh_process(args, base, "merging", module="course_utils.chapter.merging"))
    try:
        return _merge(folder, recipe, load_in_4bit, base)
    finally:
        release_memory()


def main(argv: list[str] | None = None) -> int:
    """`python -m course_utils.chapter.merging --adapter F --base B [--load-in-4bit]`: merge_adapter in this process,
    its Merged as one JSON line (what merge_adapter runs on a GPU)."""
    import argparse
    import dataclasses
    import json
    import sys

    parser = argparse.ArgumentParser(prog="python -m course_utils.chapter.merging")
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--load-in-4bit", action="store_true")
    args = parser.parse_args(argv)
    try:
        merged = merge_adapter(args.adapter, args.load_in_4bit, args.base, isolate=False)
    except AdapterError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(dataclasses.asdict(merged)))
    return 0


def _merge(folder: Path, recipe, load_in_4bit: bool, base: str) -> Merged:
    """merge_adapter's body: load, measure the logits, merge under the tracker, measure again."""
    import torch
    from peft import PeftModel


    model, tokenizer = load_base(base, load_in_4bit, recipe.precision if recipe else "auto")
    model = PeftModel.from_pretrained(model, str(folder)).eval()
    # Bytes are counted before any forward pass (build.one_4bit_format_on_every_cpu says why a forward could
    # change them).
    before = tensor_bytes(model_state_tensors(model))
    ids = tokenizer(data_prompts(1)[0]["prompt"], return_tensors="pt")["input_ids"].to(model.device)
    with torch.no_grad():
        with model.disable_adapter():
            plain = model(input_ids=ids).logits.float()
        adapted = model(input_ids=ids).logits.float()
    tracker = MemoryTracker(machine.device_type())
    tracker.classify(model_state_tensors(model), "parameters")
    with warnings.catch_warnings(record=True) as caught, tracker:
        warnings.simplefilter("always")
        merged = model.merge_and_unload()
    merged_bytes = tensor_bytes(model_state_tensors(merged))  # before its forward pass, as `before`
    with torch.no_grad():
        after_logits = merged(input_ids=ids).logits.float()
    q_proj = next(m for n, m in merged.named_modules() if n.endswith("q_proj"))
    w = q_proj.weight
    qs = getattr(w, "quant_state", None)
    stored = (f"{type(q_proj).__name__}: {w.dtype} packed, NF4 codes of {qs.dtype} weights" if qs is not None
              else f"{type(q_proj).__name__}: {w.dtype}")
    change = {k: (a - b).abs().mean().item() for k, a, b in (("adapter", adapted, plain),
              ("merge", after_logits, adapted), ("kept", after_logits, plain))}
    return Merged(load_in_4bit=load_in_4bit, bytes_before=before, bytes_after=merged_bytes,
                  peak_bytes=tracker.peak, stored_as=stored, warnings=sorted({str(c.message) for c in caught}),
                  logit_change=change)


def merge_estimate(model: str, load_in_4bit: bool, weight_bytes: int | None = None, lora_r: int = 16,
                   targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj"),
                   double_quant: bool = True) -> dict:
    """The merge's memory from the model's shapes (course_utils.estimate): the merged model (NF4 linear layers,
    or `weight_bytes` per weight; default: 4 where this machine trains in fp32, else 2), the fp32 LoRA weights
    held until they are merged, and the largest adapted layer's work, in fp32: B @ A and B @ A x scale, plus,
    for an NF4 layer, its weight dequantized and the sum (3 copies at once; 2 for a 16/32-bit layer, which
    peft adds in place)."""

    weight_bytes = weight_bytes or (4 if resolve_precision("auto") == "fp32" else 2)
    s = model_shapes(model)
    adapted = [(n, i, o) for n, i, o in s.layer_linears if n in targets]
    if not adapted:
        raise AdapterError(f"none of the LoRA targets {list(targets)} is a linear layer of {model}; its layers: "
                           f"{sorted({n for n, _, _ in s.layer_linears})}.")
    if load_in_4bit:
        linears = s.layers * sum(nf4_bytes(i * o, double_quant) for _, i, o in s.layer_linears)
    else:
        linears = s.linear_params * weight_bytes
    rest = (s.embed_params + s.lm_head_params + s.small_params) * weight_bytes + s.buffer_bytes
    lora = s.layers * sum(lora_r * (i + o) for _, i, o in adapted) * 4
    work = (3 if load_in_4bit else 2) * max(i * o for _, i, o in adapted) * 4
    return dict(model=model, load_in_4bit=load_in_4bit, merged=linears + rest, lora=lora, work=work,
                copies=3 if load_in_4bit else 2, peak=linears + rest + lora + work, params=s.total_params,
                weight_bytes=weight_bytes)


def format_merge(measured: list[Merged], estimates: list[dict]) -> str:
    """Measured merges beside their estimates (same order), then estimates of larger models."""

    kind = lambda e: "NF4 base" if e["load_in_4bit"] else f"{8 * e['weight_bytes']}-bit base"  # noqa: E731
    lines = []
    for m, e in zip(measured, estimates):
        if m.skipped:
            lines += [f"merge into the {kind(e)} of {e['model']}: {m.skipped}",
                      f"  estimated: merged model {fmt(e['merged'])}, peak {fmt(e['peak'])} (merged {fmt(e['merged'])} "
                      f"+ LoRA {fmt(e['lora'])} + {e['copies']} fp32 copies of the largest layer {fmt(e['work'])})"]
            continue
        c = m.logit_change
        lines += [f"merge into the {kind(e)} of {e['model']}: stored as {m.stored_as}",
                  f"  merged model   measured {fmt(m.bytes_after):>11}   estimated {fmt(e['merged']):>11}",
                  f"  peak merging   measured {fmt(m.peak_bytes):>11}   estimated {fmt(e['peak']):>11} "
                  f"(merged {fmt(e['merged'])} + LoRA {fmt(e['lora'])} + {e['copies']} fp32 copies of the largest layer "
                  f"{fmt(e['work'])})",
                  f"  mean |logit change| on a prompt: adapter vs base {c['adapter']:.2e}; merged vs base "
                  f"{c['kept']:.2e} ({c['kept'] / (c['adapter'] or 1):.0%} of that), merged vs adapter {c['merge']:.2e}"]
        lines += [f"  peft warned: {w}" for w in m.warnings]
    lines += [f"estimate, merge into the {kind(e)} of {e['model']} ({e['params'] / 1e9:.2f} B parameters): merged "
              f"model {fmt(e['merged'])}, peak {fmt(e['peak'])}" for e in estimates[len(measured):]]
    return wrap("\n".join(lines), indent="    ")


if __name__ == "__main__":
    raise SystemExit(main())
