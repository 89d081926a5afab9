"""The `course` command's recipe flags (course_utils/cli_recipe.py): derived from the Recipe fields, each field a
flag or deliberately left out, flags landing in the recipe, the older spellings, and bad values as one line.
Parsing only: nothing here trains or estimates a model."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from course_utils import cli_recipe as C
from course_utils.cli import VALUE_OPTIONS, _glue_negative_values, _recipe_from_args, build_parser, main
from course_utils.recipe import FIELD_HELP, Recipe, source_chapter_recipe

FIELDS = [f.name for f in dataclasses.fields(Recipe)]
HINTS = typing.get_type_hints(Recipe)
COMMANDS = ("estimate", "run")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_field_has_a_flag_or_is_left_out_with_a_reason(command):
    exposed, left_out = C.FLAGS[command], C.NOT_EXPOSED[command]
    assert not set(exposed) & set(left_out), "a field is both a flag and left out"
    missing = [name for name in FIELDS if name not in exposed and name not in left_out]
    assert not missing, f"Recipe field(s) {missing}: give `course {command}` a flag (cli_recipe.FLAGS) or say " \
                        "why not (cli_recipe.NOT_EXPOSED)"
    assert set(exposed) | set(left_out) == set(FIELDS), "cli_recipe names a field Recipe lacks"
    assert all(isinstance(why, str) and why for why in left_out.values())


def test_each_flag_has_its_help_in_one_place():
    assert set(FIELD_HELP) <= set(FIELDS)
    assert {name for fields in C.FLAGS.values() for name in fields} <= set(FIELD_HELP)


def _other(name: str, value):
    """A valid value of field `name` other than `value`, and the flags that give it (derived spelling)."""
    hint, flag = HINTS[name], C.spellings(name)[-1]
    if hint is bool:
        return (not value), [flag if not value else "--no-" + flag[2:]]
    if name == "lora_r":
        return 8, [flag, "8"]
    if name == "precision":
        new = next(p for p in C.CHOICES["precision"] if p != value)
    elif name == "optimizer":
        new = "adamw_8bit" if value != "adamw_8bit" else "adamw_torch"
    elif typing.get_origin(hint) is tuple:
        return value[:2], [flag, ",".join(value[:2])]
    elif hint is int:
        new = value + 1
    elif hint is float:
        new = value * 2
    else:
        raise AssertionError(f"no sample value for {name} ({hint}): add one to this test")
    return new, [flag, str(new)]


def _estimate(*flags: str, source: bool = False) -> Recipe:
    argv = ["estimate", "--model", "tiny", *(["--source"] * source), *flags]
    return _recipe_from_args(build_parser().parse_args(argv))


def _run(*flags: str) -> Recipe:
    return C.run_recipe(build_parser().parse_args(["run", *flags]))


@pytest.mark.parametrize("source", [False, True], ids=["plain", "source"])
@pytest.mark.parametrize("name", C.FLAGS["estimate"])
def test_each_estimate_flag_lands_in_its_field_and_nothing_else(name, source):
    base = C.estimate_base("tiny", source)
    value, flags = _other(name, getattr(base, name))
    assert _estimate(*flags, source=source) == base.with_(**{name: value})


@pytest.mark.parametrize("name", C.FLAGS["run"])
def test_each_run_flag_lands_in_its_field_and_nothing_else(name):
    base = C.run_base("tiny")
    value, flags = _other(name, getattr(base, name))
    recipe = _run(*flags)
    assert recipe == base.with_(**{name: value}) and recipe.label == base.label


def test_all_the_flags_at_once():
    base = C.estimate_base("tiny")
    changes, flags = {}, []
    for name in set(C.FLAGS["estimate"]) - {"reentrant_checkpointing"}:  # refused with offload_activations
        changes[name], more = _other(name, getattr(base, name))
        flags += more
    assert _estimate(*flags) == base.with_(**changes)


def test_only_the_flags_given_change_the_base_recipe():
    assert _estimate() == Recipe(model="tiny", precision="auto")
    assert _estimate(source=True) == source_chapter_recipe("tiny")
    args = build_parser().parse_args(["run"])
    assert all(getattr(args, name) is None for name in C.FLAGS["run"])
    assert _run() == C.run_base("tiny") and _run().label == "baseline (LoRA, fp32)"
    assert _run("--model", "llama-3.1-8b").model == "llama-3.1-8b"


def test_course_runs_defaults_are_unchanged_and_its_help_shows_the_base_recipes():
    base = _run()
    assert (base.steps, base.max_seq_length, base.micro_batch, base.learning_rate) == (6, 256, 4, 1e-3)
    text = " ".join(build_parser()._subparsers._group_actions[0].choices["run"].format_help().split())
    for expected in ("--steps N optimizer steps", "default: 6", "--seq N, --max-seq-length N", "default: 256",
                     "default: 4", "--lr X, --learning-rate X", "default: 0.001"):
        assert expected in text, expected
    est = " ".join(build_parser()._subparsers._group_actions[0].choices["estimate"].format_help().split())
    assert "default: 4 (with --source: 1)" in est and FIELD_HELP["offload_activations"] in est


@pytest.mark.parametrize("old, new", [
    (["--seq", "128"], ["--max-seq-length", "128"]),
    (["--lr", "5e-4"], ["--learning-rate", "5e-4"]),
])
def test_old_spellings_still_work(old, new):
    assert _run(*old) == _run(*new) != _run()


@pytest.mark.parametrize("flags, changes", [
    (["--seq", "128"], {"max_seq_length": 128}),
    (["--lora-r", "none"], {"lora_r": None}),
    (["--lora-r", "full"], {"lora_r": None}),
    (["--lora-r", "4"], {"lora_r": 4}),
    (["--load-in-4bit", "--no-double-quant"], {"load_in_4bit": True, "double_quant": False}),
    (["--gradient-checkpointing", "--micro-batch", "1", "--grad-accum", "8"],
     {"gradient_checkpointing": True, "micro_batch": 1, "grad_accum": 8}),
    (["--precision", "bf16", "--optimizer", "paged_adamw_8bit"],
     {"precision": "bf16", "optimizer": "paged_adamw_8bit"}),
    (["--lora-targets", "q_proj, v_proj"], {"lora_targets": ("q_proj", "v_proj")}),
])
def test_the_documented_estimate_spellings(flags, changes):
    assert _estimate(*flags) == Recipe(model="tiny", precision="auto").with_(**changes)


def test_every_value_flag_takes_a_negative_number_to_its_own_check():
    for flag in C.value_flags():
        assert flag in VALUE_OPTIONS
        assert _glue_negative_values([flag, "-1"]) == [f"{flag}=-1"]


@pytest.mark.parametrize("args, knob", [
    (["--micro-batch", "0"], "micro_batch"),
    (["--grad-accum", "0"], "grad_accum"),
    (["--seq", "-5"], "max_seq_length"),
    (["--lora-dropout", "1.5"], "lora_dropout"),
    (["--lora-dropout", "-0.1"], "lora_dropout"),
    (["--lora-targets", ""], "lora_targets"),
    (["--lora-targets", "q_proj,,v_proj"], "lora_targets"),
    (["--optimizer", "adamw8bit"], "adamw_8bit"),  # the hint: did you mean
    (["--load-in-4bit", "--lora-r", "none"], "load_in_4bit"),
])
def test_a_bad_estimate_value_is_one_line(capsys, args, knob):
    assert refused(["estimate", "--model", "tiny", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(("course: error:", "course estimate: error:")) and err.count("\n") == 1 and knob in err


def refused(argv) -> int:
    """main(argv)'s exit code: a value its flag's field rule refuses stops argparse (SystemExit), the rules between
    fields are checked after it (main returns 2)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("args, knob", [
    (["--warmup-steps", "-1"], "warmup_steps"),
    (["--steps", "4", "--warmup-steps", "3"], "warmup_steps"),
    (["--seed", "-1"], "seed"),
    (["--grad-accum", "0"], "grad_accum"),
    (["--learning-rate", "0"], "learning_rate"),
    (["--max-seq-length", "0"], "max_seq_length"),
])
def test_a_bad_run_value_is_one_line_and_nothing_is_written(capsys, tmp_path, args, knob):
    out_dir, store = tmp_path / "out", tmp_path / "r.jsonl"
    assert refused(["run", *args, "--out", str(out_dir), "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(("course: error:", "course run: error:")) and err.count("\n") == 1 and knob in err
    assert not out_dir.exists() and not store.exists()


@pytest.mark.parametrize("argv, says", [
    (["estimate", "--model", "tiny", "--lora-r", "0"], "is not a LoRA rank"),
    (["estimate", "--model", "tiny", "--lora-r", "many"], "takes a whole number or 'none'"),
    (["estimate", "--model", "tiny", "--precision", "fp8"], "invalid choice"),
    (["estimate", "--model", "tiny", "--micro-batch", "many"], "micro_batch must be a whole number from 1 to"),
    (["run", "--lr", "fast"], "learning_rate must be a positive, finite number (the chapter uses 2e-4), got 'fast'"),
    (["run", "--optimizer", "adamw_8bit"], "unrecognized arguments"),  # a rung sets it: not a `run` flag
    (["run", "--lora-r", "8"], "unrecognized arguments"),
])
def test_an_unparseable_value_is_argparses_error(capsys, argv, says):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and says in capsys.readouterr().err.splitlines()[-1]
