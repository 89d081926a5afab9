"""The map from a Recipe field to the libraries' arguments, read off build.library_objects (README's table).

Each field is set to another value on a base recipe, and the library objects of the two recipes are compared
argument by argument: what changes is what that field means to transformers, peft, trl and bitsandbytes.
Nothing here is written by hand but the values tried (TOGGLES: a technique's field is turned on, others are tried
by hand); a test holds that every field has one.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

from course_utils import build
from course_utils.recipe import TECHNIQUES, Recipe

# (field, value tried, changes to the base that the field needs to mean anything): the values tried by hand, then
# each other technique's field (recipe.TECHNIQUES) turned on, on a base that has what it needs
FOUR_BIT = {"load_in_4bit": True}
_TRIED: tuple[tuple[str, Any, dict], ...] = (
    ("load_in_4bit", True, {}),
    ("double_quant", False, FOUR_BIT),
    ("prepare_kbit", False, FOUR_BIT),
    ("lora_r", 8, {}),
    ("lora_r", None, {}),
    ("lora_alpha", 64, {}),
    ("lora_dropout", 0.1, {}),
    ("lora_targets", ("q_proj", "v_proj"), {}),
    ("precision", "bf16", {}),
    ("precision", "fp16", {}),
    ("gradient_checkpointing", True, {}),
    ("micro_batch", 1, {}),
    ("grad_accum", 16, {}),
    ("optimizer", "adamw_8bit", {}),
    ("optimizer", "paged_adamw_8bit", {}),
    ("max_seq_length", 512, {}),
    ("steps", 100, {}),
    ("warmup_steps", 1, {}),
    ("learning_rate", 1e-4, {}),
    ("seed", 1, {}),
)
TOGGLES: tuple[tuple[str, Any, dict], ...] = _TRIED + tuple(
    (t.fields[0], t.on_value, dict(t.needs)) for t in TECHNIQUES
    if t.fields[0] not in {field for field, _, _ in _TRIED})
NOT_TOGGLED = {"model": "the model id: from_pretrained's first argument", "label": "a display name"}
BASE = Recipe(model="llama-3.1-8b")
BASE_TEXT = "Recipe() (LoRA r=16, fp32, no checkpointing, 4 x 1, adamw_torch, sequence 256)"
SHOWN_ALWAYS = ("packing", "packing_strategy")  # build's constants that every recipe trains with


def call_keywords(func, callee: str) -> list[str]:
    """Keyword names of the one call to `callee(...)` in `func`'s source, in the order written."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == callee]
    return [kw.arg for kw in calls[0].keywords if kw.arg is not None]


def flat(objects) -> dict[tuple[str, str], Any]:
    """Every argument of `objects` (build.LibraryObjects) as {(call, argument): value}; a call not made is
    {(call, ""): None}; the course's own steps are {("build", step): True}."""

    out: dict[tuple[str, str], Any] = {}
    for name, value in objects.model_kwargs.items():
        if name == "quantization_config":
            value = _Name("bnb_config") if value is not None else None
        out[("from_pretrained", name)] = value
    bnb = objects.quantization_config
    if bnb is None:
        out[("BitsAndBytesConfig", "")] = None
    else:
        for name in call_keywords(build.quantization_config, "BitsAndBytesConfig"):
            out[("BitsAndBytesConfig", name)] = getattr(bnb, name)
    if objects.prepare_kbit_kwargs is None:
        out[("prepare_model_for_kbit_training", "")] = None
    else:
        for name, value in objects.prepare_kbit_kwargs.items():
            out[("prepare_model_for_kbit_training", name)] = value
    lora = objects.lora_config
    if lora is None:
        out[("LoraConfig", "")] = None
    else:
        for name in call_keywords(build.lora_config, "LoraConfig"):
            value = getattr(lora, name)
            value = sorted(value) if isinstance(value, (set, frozenset)) else value
            out[("LoraConfig", name)] = getattr(value, "value", value)  # task_type is an enum
    for name, value in objects.sft_kwargs.items():
        out[("SFTConfig", name)] = value
    for step in objects.course_steps:
        out[("build", step)] = True
    return out


class _Name(str):
    """A variable's name in the code shown (from_pretrained(quantization_config=bnb_config))."""

    def __repr__(self) -> str:
        return str(self)


def show(value) -> str:
    """A value as a learner writes it in Python."""
    import torch

    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, _Name):
        return str(value)
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{" + ", ".join(f"{show(k)}: {show(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return repr(value)


def changes(before, after) -> list[str]:
    """What differs from `before` to `after` (LibraryObjects), one entry per call: 'SFTConfig(a=1, b=2)'."""
    a, b = flat(before), flat(after)
    calls: dict[str, list[str]] = {}
    for key in list(b) + [k for k in a if k not in b]:
        call, name = key
        if a.get(key, "absent") == b.get(key, "absent"):
            continue
        if call == "build":
            calls.setdefault(call, []).append(name if key in b else f"no longer: {name}")
        elif name == "":
            if key in b:
                calls[call] = ["not called"]
        elif key in b:
            calls.setdefault(call, []).append(f"{name}={show(b[key])}")
    out = []
    for call, parts in calls.items():
        if call == "build":
            out.extend(f"course: {p}" for p in parts)
        elif parts == ["not called"]:
            out.append({"LoraConfig": "no LoraConfig (every weight trains)"}.get(call, f"{call} not called"))
        else:
            out.append(f"{call}({', '.join(parts)})")
    return out


def rows() -> list[tuple[str, str, list[str]]]:
    """(field, value tried, what changes in the libraries' arguments) for every toggle, from BASE."""
    out = []
    for field, value, needs in TOGGLES:
        base = BASE.with_(**needs)
        before = build.library_objects(base, output_dir="out", fsdp=False)
        after = build.library_objects(base.with_(**{field: value}), output_dir="out", fsdp=False)
        tried = f"`{show(value)}`" + (" (on a 4-bit recipe)" if needs else "")
        out.append((field, tried, changes(before, after) or ["none: the course's own measuring (no library argument)"]))
    return out


def field_table() -> str:
    """README's markdown table: Recipe field, the value tried, the library arguments it changes."""
    base = flat(build.library_objects(BASE, output_dir="out", fsdp=False))
    always = ", ".join(f"{name}={show(base[('SFTConfig', name)])}" for name in SHOWN_ALWAYS)
    lines = [f"From {BASE_TEXT}; every recipe also passes `SFTConfig({always})`.", "",
             "| Recipe field | set to | what changes in the libraries' arguments (build.library_objects) |",
             "|---|---|---|"]
    for field, tried, what in rows():
        cell = "<br>".join(f"`{w}`" if not w.startswith(("course:", "none:")) else w for w in what)
        lines.append(f"| `{field}` | {tried} | {cell} |")
    return "\n".join(lines)
