"""Demonstrations that one notebook each needs, run in the notebook's own process. Each loads what it
shows, returns plain numbers, and gives the memory back before it returns: on a T4 the notebook's
kernel shares 14.75 GiB with the measuring processes that start after it.
"""

from __future__ import annotations

import functools

from .hardware import release_memory
from .recipe import Recipe
from .tables import wrap


def releases_memory(fn):
    """Run fn, then give the GPU memory its models held back to the card."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            release_memory()

    return wrapper


def weights_of(model: str, load_in_4bit: bool = False, double_quant: bool = True) -> dict[str, dict]:
    """Notebook 00 and 05: the model's weights by group (parameters, bytes, how stored, bits per parameter).
    4-bit weights are loaded and counted as stored; full-precision weights are counted on a weightless
    (meta) copy in the dtype a recipe loads them in (fp32), so an 8B model needs no 32 GB to count."""
    from .build import weight_groups

    if load_in_4bit:
        return quantized_weights(model, double_quant)[0]
    return weight_groups(skeleton(model))


def skeleton(model: str, dtype=None):
    """The model on the meta device: every shape and dtype, no memory (fp32 unless told)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from .models import resolve_model

    config = AutoConfig.from_pretrained(resolve_model(model))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)


def needs_4bit_here(model: str) -> bool:
    """True when the model's fp32 weights (and as much again for one step) do not fit what this
    process may use: a demonstration then loads it in 4-bit NF4 instead, and says so."""
    from .hardware import available_bytes

    weights = sum(p.numel() for p in skeleton(model).parameters()) * 4
    needed = 1.2 * weights
    if needed <= available_bytes():
        return False
    print(wrap(f"({model} in fp32 needs about {needed / 2**30:.1f} GiB, more than this card leaves this process "
               f"({available_bytes() / 2**30:.1f} GiB): this demonstration loads it in 4-bit NF4 instead.)"))
    return True


@releases_memory
def quantized_weights(model: str, double_quant: bool = True) -> tuple[dict[str, dict], dict]:
    """Notebook 05: the 4-bit model's weights by group, and its biggest 4-bit weight (name, parameters,
    bytes), from one load."""
    from .build import load_for_inspection, weight_groups, weight_storage

    loaded = load_for_inspection(model, load_in_4bit=True, double_quant=double_quant)
    rows = weight_storage(loaded)
    return weight_groups(loaded), max((r for r in rows if r["stored"].startswith("4-bit")), key=lambda r: r["params"])


def half_precision() -> str:
    """The 16-bit type this machine trains in: bf16 where it is native, fp16 on a GPU without it (a T4),
    and bf16 on a CPU (only to see bytes move, as notebook 05 does)."""
    from .hardware import bf16_supported, device_type

    return "bf16" if bf16_supported() or device_type() == "cpu" else "fp16"


@releases_memory
def upcast_demo(model: str) -> tuple[dict, dict, str]:
    """Notebook 05: a 4-bit model loaded in this machine's 16-bit type, its weights by group before and
    after peft's prepare_model_for_kbit_training, and that 16-bit type's name."""
    import torch
    from peft import prepare_model_for_kbit_training

    from .build import load_for_inspection, weight_groups
    from .hardware import HardwareError, resolve_precision

    half = half_precision()
    try:
        loaded = load_for_inspection(model, load_in_4bit=True, precision=resolve_precision(half))
    except HardwareError:  # a CPU without native bf16: load in fp32, then cast, just to see the bytes
        loaded = load_for_inspection(model, load_in_4bit=True, precision="fp32")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[half]
    for p in loaded.parameters():
        if p.dtype == torch.float32:
            p.data = p.data.to(dtype)
    before = weight_groups(loaded)
    prepare_model_for_kbit_training(loaded, use_gradient_checkpointing=False)
    return before, weight_groups(loaded), half


def lora_trainable(model: str, recipe: Recipe) -> dict[str, int]:
    """Notebooks 00 and 03: parameters of the whole model, of the LoRA adapters the recipe adds (r x (in +
    out) per adapted layer) and of the input embedding, counted on a weightless (meta) copy."""
    shape = skeleton(model)
    lora = sum(recipe.lora_r * (m.in_features + m.out_features) for name, m in shape.named_modules()
               if name.rsplit(".", 1)[-1] in recipe.lora_targets)
    return {"all": sum(p.numel() for p in shape.parameters()), "lora": lora,
            "embedding": shape.get_input_embeddings().weight.numel()}


def paging(model: str = "llama-3.1-8b") -> str:
    """Notebook 03: which optimizer states bitsandbytes pages (tensors of at least estimate.BNB_PAGE_MIN elements:
    none of LoRA's, nearly all of a full fine-tune's), and the H200 pair that shows what paging does to the
    measured peak (paged buffers live outside PyTorch's allocator). Lines are at most 100 characters."""
    from .estimate import BNB_PAGE_MIN, lora_shapes, model_shapes
    from .facts import ref
    from .recipe import source_chapter_recipe

    s, recipe, least = model_shapes(model), source_chapter_recipe(model), BNB_PAGE_MIN
    lora = [n for _, i, o in lora_shapes(recipe, s) for n in (recipe.lora_r * i, recipe.lora_r * o)] * s.layers
    full = [i * o for _, i, o in s.layer_linears] * s.layers + [s.embed_params] + (
        [s.lm_head_params] if s.lm_head_params else []) + [n for _, n, count in s.small_tensors for _ in range(count)]
    paged_full = [n for n in full if n >= least]
    lines = [f"bitsandbytes pages the optimizer state of tensors with at least {least:,} elements ({model}):",
             f"  LoRA r={recipe.lora_r} on q/k/v/o: {len(lora)} tensors of {min(lora):,} to {max(lora):,} elements: "
             f"{sum(n >= least for n in lora)} paged",
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


def sweep_base(base: Recipe) -> Recipe:
    """Notebook 06: the recipe its sweeps start from, with 1 warm-up, 1 tracked and 2 timed steps (enough for
    the bytes). A GPU-sized preset sweeps in 4-bit at the device's precision: in fp32 LoRA not one point of
    the Llama-3.1-8B sweep fits a free T4, so the picture would be empty there."""
    short = base.with_(steps=4, warmup_steps=1)
    if needs_4bit_here(base.model):
        short = short.with_(load_in_4bit=True, precision="auto")
    return short


def growth(measurements, category: str) -> str:
    """Notebook 06: how much a category grows each time the knob doubles, point to point ('x1.98 x2.01 ...');
    a point that did not fit has no figure and is left out."""
    values = [m.peak_by_category[category] for m in measurements if m.fits]
    return " ".join(f"x{b / a:.2f}" for a, b in zip(values, values[1:]))
