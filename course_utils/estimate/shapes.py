"""The model's shapes, read from its config on the meta device: no weights, no memory.

Part of `course_utils.estimate` (its docstring says how the bytes are counted).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


class EstimateError(ValueError):
    """The estimator cannot model this model or recipe; the message says why."""


@dataclass(frozen=True)
class Shapes:
    """The sizes the arithmetic needs, read from a config and a meta-device model."""

    model_type: str
    layers: int
    hidden: int
    heads: int
    head_dim: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool  # lm_head shares the embedding matrix
    layer_linears: tuple[tuple[str, int, int], ...]  # (name, in_features, out_features) of one layer
    embed_params: int
    lm_head_params: int  # 0 when tied
    small_tensors: tuple[tuple[str, int, int], ...]  # (kind, elements, count): norms and the like
    buffer_bytes: int  # rotary inv_freq and the like (fp32)

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def linear_params(self) -> int:
        """Elements of every linear layer inside the decoder layers (what 4-bit quantizes)."""
        return self.layers * sum(i * o for _, i, o in self.layer_linears)

    @property
    def small_params(self) -> int:
        """Elements of the norms and other small weights."""
        return sum(n * c for _, n, c in self.small_tensors)

    @property
    def total_params(self) -> int:
        return self.linear_params + self.embed_params + self.lm_head_params + self.small_params


def load_config(model: str):
    """The transformers config of a recipe's model: models.load_config (tiny, a preset, a local folder, or a
    hub id read through one probe and a deadline)."""
    from ..models import load_config as read

    return read(model)


def shapes_from_config(config) -> Shapes:
    """Build the model on the meta device (no memory, no weights) and read every shape."""
    import collections

    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    layers = _decoder_layers(model)
    linears = tuple((name.rsplit(".", 1)[-1], m.in_features, m.out_features)
                    for name, m in layers[0].named_modules() if isinstance(m, torch.nn.Linear))
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed
    big = {id(p) for layer in layers for m in layer.modules() if isinstance(m, torch.nn.Linear)
           for p in m.parameters(recurse=False)} | {id(embed)} | ({id(head.weight)} if head is not None else set())
    small = collections.Counter(("norm" if "norm" in name.lower() else "other", p.numel())
                                for name, p in model.named_parameters() if id(p) not in big)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    return Shapes(
        model_type=text.model_type,
        layers=len(layers),
        hidden=text.hidden_size,
        heads=heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        intermediate=getattr(text, "intermediate_size", None) or 4 * text.hidden_size,
        vocab=embed.shape[0],
        tied=tied,
        layer_linears=linears,
        embed_params=embed.numel(),
        lm_head_params=0 if tied or head is None else head.weight.numel(),
        small_tensors=tuple((kind, n, c) for (kind, n), c in sorted(small.items())),
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
    )


def _decoder_layers(model) -> list:
    """The repeated decoder layers (the longest ModuleList in the model)."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise EstimateError(f"{type(model).__name__} has no list of decoder layers the estimator can read.")
    return list(max(lists, key=len))


@functools.lru_cache(maxsize=32)
def model_shapes(model: str) -> Shapes:
    """Shapes of a recipe's model (cached: the meta-device build happens once per model)."""
    return shapes_from_config(load_config(model))
