"""The `course` command's recipe flags, derived from the `Recipe` fields (course_utils/recipe.py).

Each subcommand that takes a recipe names the fields it exposes (FLAGS) and, with the reason, the fields it
leaves out (NOT_EXPOSED); a test holds that every field is in one of the two, so a new field cannot be
forgotten silently. A field's flag is `--field-name` (and its older spelling, ALIASES): a bool is
`--x/--no-x`, an int, float or str a typed value, `lora_r` a rank or 'none', `lora_targets` a comma-separated
list. Every flag defaults to None, so only the flags given change the subcommand's base recipe; the help
shows the base's values.
"""

from __future__ import annotations

import argparse
import typing

from course_utils.recipe import (FIELD_HELP, FIELD_RULES, PRECISIONS, TECHNIQUES, Recipe, RecipeError,
                                  base_recipe_for, check_field, source_chapter_recipe)

# Spellings the CLI had before its flags were derived: each still works, beside --field-name.
ALIASES = {"max_seq_length": ("--seq",), "learning_rate": ("--lr",)}
CHOICES = {"precision": PRECISIONS}

_FIELD_ORDER = list(FIELD_HELP)
FLAGS = {
    # the knobs the estimator reads: everything that changes the memory of one training step (the techniques
    # whose memory it models, TECHNIQUES' `memory`, and LoRA's shape), in the Recipe's order
    "estimate": tuple(sorted({name for t in TECHNIQUES if not t.memory for name in t.fields}
                             | {"lora_targets", "lora_dropout"}, key=_FIELD_ORDER.index)),
    # the ladder's baseline: how long each rung trains and the sizes the rungs start from
    "run": ("steps", "warmup_steps", "max_seq_length", "micro_batch", "grad_accum", "learning_rate", "seed"),
}
_OWN = "not derived: the subcommand's own --model (its default and help differ per subcommand)"
_LABEL = "a display name, not a knob"
_RUNG = "a rung of the ladder sets it: on the baseline it would be overwritten, or make its rung a no-op"
_LORA = "the ladder is the chapter's LoRA, at Recipe's defaults (and a full fine-tune cannot take the 4-bit rung)"
_BEYOND = "notebook 09's technique, beyond the chapter's ladder (scripts/gpu/beyond_recipe.py measures it)"
_NO_MEMORY = "the estimate of one step's memory does not depend on it"
NOT_EXPOSED = {
    "estimate": {
        "model": _OWN, "label": _LABEL,
        "lora_alpha": "it scales the adapter's update: no memory", "steps": _NO_MEMORY, "warmup_steps": _NO_MEMORY,
        "learning_rate": _NO_MEMORY, "seed": _NO_MEMORY,
        **{name: t.memory for t in TECHNIQUES if t.memory for name in t.fields},
    },
    "run": {
        "model": _OWN, "label": "the ladder names its rungs",
        "double_quant": "the 4-bit rung is NF4 with double quant, as its label says",
        "prepare_kbit": "the 4-bit rung uses peft's fp32 upcast, as the chapter does",
        "lora_r": _LORA, "lora_alpha": _LORA, "lora_dropout": _LORA, "lora_targets": _LORA,
        **{name: _BEYOND if t.where == "beyond" else _RUNG for t in TECHNIQUES if t.where != "setup"
           for name in t.fields if name not in ("double_quant", "prepare_kbit", *FLAGS["run"])},
    },
}
_FULL_FINE_TUNE = 0  # what _lora_rank returns for 'none' (None is "not given")


def run_base(model: str) -> Recipe:
    """The baseline `course run` starts from on any machine: the notebooks' CPU base recipe, sized for the tiny
    model (notebook.base_recipe_for; `course run --help` shows its values)."""

    return base_recipe_for(model, "cpu")


def estimate_base(model: str, source: bool = False) -> Recipe:
    """The recipe `course estimate --model M` describes before its flags: plain LoRA at the hardware's
    precision, or with --source the source chapter's complete recipe."""
    return source_chapter_recipe(model) if source else Recipe(model=model, precision="auto")


def run_recipe(args: argparse.Namespace) -> Recipe:
    """`course run`'s baseline: run_base with the flags given applied (its label kept)."""
    base = run_base(args.model)
    return recipe_from_flags(base, args, "run", label=base.label)


def recipe_from_flags(base: Recipe, args: argparse.Namespace, command: str, **fixed) -> Recipe:
    """`base` with the recipe flags of `command` that were given (not None) applied; `fixed` are more changes
    (Recipe.with_ clears the label unless one is passed). An invalid value raises RecipeError."""
    given = {}
    for name in FLAGS[command]:
        value = getattr(args, name)
        if value is not None:
            given[name] = None if name == "lora_r" and value == _FULL_FINE_TUNE else value
    return base.with_(**given, **fixed)


def add_recipe_flags(parser: argparse.ArgumentParser, command: str, bases: dict[str, Recipe], about: str) -> None:
    """`command`'s recipe flags on `parser`, in a group of their own that `about` describes; `bases`
    ({note: recipe}) are the base recipes whose values the help shows as defaults, e.g.
    {"": plain, "with --source": chapter}."""
    group = parser.add_argument_group("recipe", about + ". Each flag changes one field of it (course_utils.Recipe).")
    for name in FLAGS[command]:
        group.add_argument(*spellings(name), dest=name, default=None, help=_help(name, bases), **_kind(name))


def spellings(name: str) -> tuple[str, ...]:
    """The flags of field `name`: its older spelling first (the one the README uses), then --field-name."""
    return (*ALIASES.get(name, ()), "--" + name.replace("_", "-"))


def flag_for(name: str, value) -> str:
    """Field `name` at `value` as its flag is written (the parser reads it back): `--x`/`--no-x` for a bool,
    else its first spelling and the value (`--seq 512`, `--lora-r none`)."""
    flag = spellings(name)[0]
    if isinstance(value, bool):
        return flag if value else "--no-" + flag[2:]
    return f"{flag} {_show(value)}"


def value_flags() -> list[str]:
    """Every recipe flag that takes a value (not the --x/--no-x ones), in any subcommand."""
    names = dict.fromkeys(name for fields in FLAGS.values() for name in fields)
    return [flag for name in names if _hints()[name] is not bool for flag in spellings(name)]


def _kind(name: str) -> dict:
    """How argparse reads field `name`: from its type in the dataclass."""
    hint = _hints()[name]
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    if name == "lora_r":
        return {"type": _lora_rank, "metavar": "RANK"}
    if typing.get_origin(hint) is tuple:
        return {"type": field_type(name, _names), "metavar": "NAME,..."}
    if name in CHOICES:
        return {"type": hint, "choices": CHOICES[name]}
    if hint in (int, float, str):
        return {"type": field_type(name, hint), "metavar": {int: "N", float: "X", str: "NAME"}[hint]}
    raise TypeError(f"Recipe.{name} ({hint}) has no flag type: give it one in cli_recipe._kind.")


def _hints() -> dict:
    """The Recipe fields' types (the annotations are strings: `from __future__ import annotations`)."""
    return typing.get_type_hints(Recipe)


def _help(name: str, bases: dict[str, Recipe]) -> str:
    """FIELD_HELP's text with the base recipes' values: '...; default: 4' or '...; default: 4 (with --source: 1)'."""
    (_, first), *others = [(note, _show(getattr(base, name))) for note, base in bases.items()]
    differ = [f"{note}: {value}" for note, value in others if value != first]
    text = f"{FIELD_HELP[name]}; default: {first}" + (f" ({', '.join(differ)})" if differ else "")
    return text.replace("%", "%%")


def _show(value) -> str:
    """A field's value as the flag would be written."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _lora_rank(text: str) -> int:
    """argparse type for --lora-r: a positive rank, or 'none' (returned as 0) for a full fine-tune."""
    if text.lower() in ("none", "full"):
        return _FULL_FINE_TUNE
    try:
        rank = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--lora-r takes a whole number or 'none' (full fine-tune), got {text!r}") from None
    if rank <= 0:  # 0 used to mean a full fine-tune, silently
        raise argparse.ArgumentTypeError(
            f"--lora-r {text} is not a LoRA rank: give a positive rank such as 16, or 'none' for a full fine-tune")
    return rank


def field_type(name: str, read=None):
    """argparse type for field `name`'s flag: the text read as the field's type (`read`, default its annotation),
    then checked against its FIELD_RULES entry, so the flag refuses what Recipe refuses, in the same words
    ('learning_rate must be a positive, finite number ..., got 'big'.'), before any process starts."""
    read = read or _hints()[name]

    def parse(text: str):
        try:
            value = read(text)
        except (ValueError, TypeError, OverflowError):
            shown = text if len(text) <= 40 else text[:37] + "..."
            raise argparse.ArgumentTypeError(f"{name} must {FIELD_RULES[name].allowed}, got {shown!r}.") from None
        try:
            check_field(name, value)
        except RecipeError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    parse.__name__ = name  # argparse names the type by it
    parse.field, parse.read = name, read  # what a test reads to pick bad values for the flag
    return parse


def _names(text: str) -> tuple[str, ...]:
    """argparse type for --lora-targets: 'q_proj,v_proj' as ('q_proj', 'v_proj'); an empty name stays, so that
    Recipe.validate names the problem."""
    return tuple(name.strip() for name in text.split(","))
