"""Notebook 05 (and 00's weight count): how 4-bit NF4 weights are stored, counted from the loaded model,
and what peft's prepare_model_for_kbit_training does to the weights around them. Each demonstration that
loads a model gives the memory back before it returns (lessons.releases_memory).
"""

from __future__ import annotations

import math

from .lessons import load_for_inspection, releases_memory
from .common import GiB


def weight_storage(model) -> list[dict]:
    """Notebooks 00 and 05: every weight tensor of a model: its name, how it is stored, how many parameters
    it holds, and its bytes (4-bit weights with their quantization state: scales, nested scales, code
    tables)."""
    from .memtrack import _quant_state_tensors, tensor_bytes

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
    from .hardware import bf16_supported, device_type

    return "bf16" if bf16_supported() or device_type() == "cpu" else "fp16"


@releases_memory
def upcast_demo(model: str) -> tuple[dict, dict, str]:
    """Notebook 05: a 4-bit model loaded in this machine's 16-bit type, its weights by group before and
    after peft's prepare_model_for_kbit_training, and that 16-bit type's name."""
    import torch
    from peft import prepare_model_for_kbit_training

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


def nf4_bits(model: str = "llama-3.1-8b", name: str = "Llama-3.1-8B") -> str:
    """Notebook 05: bits a parameter takes in NF4 (4 bits and one fp32 scale a block of 64) and with double
    quantization (the scales in 8 bits, one fp32 scale a block of 256 of them), and what that makes of the
    model's linear-layer weights (its shapes: estimate.model_shapes) against bf16."""
    from .estimate import model_shapes

    plain = 4 + 32 / 64
    double = 4 + 8 / 64 + 32 / (64 * 256)
    s = model_shapes(model)
    linear = s.layers * sum(i * o for _, i, o in s.layer_linears)  # q, k, v, o and the MLP's, every layer
    return "\n".join([
        f"NF4:                  4 + 32/64             = {plain:.3f} bits per parameter",
        f"NF4 + double quant:   4 + 8/64 + 32/(64*256) = {double:.3f} bits per parameter",
        f"{name}'s {linear / 1e9:.2f} B linear-layer weights: {linear * 2 / GiB:.2f} GiB in bf16, "
        f"{linear * double / 8 / GiB:.2f} GiB in NF4 + double quant"])
