"""The model's shapes, read from its config on the meta device: no weights, no memory.

Part of `course_utils.estimate` (its docstring says how the bytes are counted).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path
from course_utils import models
from course_utils.models import load_config as read
from course_utils.estimate.terms import Shapes


class EstimateError(ValueError):
    """The estimator cannot model this model or recipe; the message says why."""


def load_config(model: str):
    """The transformers config of a recipe's model: models.load_config (tiny, a preset, a local folder, or a
    hub id read through one probe and a deadline)."""

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
    """Shapes of a recipe's model (cached: the meta-device build happens once per model). Those of tiny and the
    presets are also kept in COURSE_HOME, so another process (a quiz's kernel, `course estimate`) reads them
    without importing transformers and torch (~8 s on 2 cores)."""
    kept = _kept_shapes(model)
    if kept is not None and kept.is_file():
        try:
            d = json.loads(kept.read_text())
            return Shapes(**{**d, "layer_linears": tuple(map(tuple, d["layer_linears"])),
                             "small_tensors": tuple(map(tuple, d["small_tensors"]))})
        except (OSError, ValueError, TypeError, KeyError):
            pass  # unreadable: read the shapes again
    shapes = shapes_from_config(load_config(model))
    if kept is not None:
        with contextlib.suppress(OSError):  # a read-only COURSE_HOME only loses the copy
            kept.parent.mkdir(parents=True, exist_ok=True)
            tmp = kept.with_name(f"{kept.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(dataclasses.asdict(shapes)))
            os.replace(tmp, kept)
    return shapes


def _kept_shapes(model: str) -> Path | None:
    """The file for tiny's or a preset's shapes, named after everything they are read from: tiny's config.json
    (or the preset's spec), the transformers and torch versions, and the code that reads them (this file,
    models.py). None for any other model: a folder or a hub id can change under the same name."""
    from importlib import metadata


    if models.is_preset(model):
        source = json.dumps(models.PRESETS[model.lower()], sort_keys=True).encode()
    elif model == models.TINY:
        source = (models.tiny_model_path() / "config.json").read_bytes()
    else:
        return None
    h = hashlib.sha256(source)
    for part in (metadata.version("transformers"), metadata.version("torch")):
        h.update(part.encode())
    for code in (__file__, models.__file__):
        h.update(Path(code).read_bytes())
    return models.course_home() / "shapes" / f"{model.lower()}-{h.hexdigest()[:16]}.json"
