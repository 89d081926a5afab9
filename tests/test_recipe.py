"""Recipe: identity (key), copies with one change, derived sizes, the ladder, and bad input."""

from __future__ import annotations

import dataclasses
import json
import string

import pytest

from course_utils.recipe import DEFAULT_TARGETS, LADDER_STEPS, Recipe, RecipeError, ladder, source_chapter_recipe

# One changed value per knob that is part of the key (each differs from the default and is valid).
KNOB_CHANGES = {
    "model": "llama-3.1-8b",
    "load_in_4bit": True,
    "double_quant": False,
    "lora_r": 8,
    "lora_alpha": 16,
    "lora_dropout": 0.1,
    "lora_targets": ("q_proj", "v_proj"),
    "precision": "auto",
    "gradient_checkpointing": True,
    "micro_batch": 2,
    "grad_accum": 2,
    "optimizer": "adamw_8bit",
    "max_seq_length": 128,
    "steps": 9,
    "warmup_steps": 1,
    "learning_rate": 1e-3,
    "seed": 1,
    "prepare_kbit": False,
    "offload_embeddings": True,
    "liger_kernels": True,
    "torch_compile": True,
    "offload_activations": True,
    "tf32": True,
    "lean_host": True,
    "fused_lora": True,
    "reentrant_checkpointing": True,
    "compile_layers": True,
}


def test_every_field_has_a_knob_change():
    """Guard for the test below: a new Recipe field must get a case in KNOB_CHANGES."""
    names = {f.name for f in dataclasses.fields(Recipe)} - {"label"}
    assert names == set(KNOB_CHANGES)


# --- key -----------------------------------------------------------------------------------------


def test_key_is_12_hex_digits():
    key = Recipe().key
    assert len(key) == 12
    assert set(key) <= set(string.hexdigits.lower())


def test_equal_recipes_have_equal_keys():
    a = Recipe(micro_batch=2, optimizer="adamw_8bit")
    b = Recipe(micro_batch=2, optimizer="adamw_8bit")
    assert a == b
    assert a.key == b.key
    assert a.key == a.key  # stable on repeated access


@pytest.mark.parametrize("knob", sorted(KNOB_CHANGES))
def test_any_changed_knob_changes_the_key(knob):
    base = Recipe()
    changed = base.with_(**{knob: KNOB_CHANGES[knob]})
    assert getattr(changed, knob) != getattr(base, knob)
    assert changed.key != base.key


def test_label_does_not_change_the_key():
    a = Recipe(label="one")
    b = Recipe(label="two")
    assert a == b
    assert a.key == b.key == Recipe().key


def test_key_survives_dict_round_trip():
    r = Recipe(load_in_4bit=True, lora_targets=("q_proj", "v_proj"), micro_batch=1, grad_accum=8, label="x")
    d = json.loads(json.dumps(r.to_dict()))  # what the store writes and reads back
    assert d["lora_targets"] == ["q_proj", "v_proj"]  # JSON has lists
    back = Recipe.from_dict(d)
    assert back.lora_targets == ("q_proj", "v_proj")
    assert isinstance(back.lora_targets, tuple)
    assert back == r
    assert back.key == r.key
    assert back.label == "x"
    hash(back)  # still hashable after list -> tuple


def test_from_dict_rejects_unknown_fields():
    d = Recipe().to_dict() | {"batch_size": 8}
    with pytest.raises(RecipeError, match="batch_size"):
        Recipe.from_dict(d)


def test_int_and_float_spellings_of_one_value_share_a_key():
    a, b = Recipe(lora_dropout=0), Recipe(lora_dropout=0.0)
    assert a == b
    assert a.key == b.key


# --- with_ and derived values --------------------------------------------------------------------


def test_with_changes_one_field():
    base = Recipe(label="base")
    r = base.with_(gradient_checkpointing=True)
    assert r.gradient_checkpointing is True
    assert base.gradient_checkpointing is False  # frozen: the original is untouched
    diff = {k for k, v in r.to_dict().items() if base.to_dict()[k] != v}
    assert diff == {"gradient_checkpointing", "label"}  # the label is reset unless given
    assert r.label == ""
    assert base.with_(micro_batch=2, label="kept").label == "kept"


def test_with_rejects_unknown_fields_naming_them():
    with pytest.raises(RecipeError) as exc:
        Recipe().with_(gradient_checkpoint=True, batchsize=2)
    assert "gradient_checkpoint" in str(exc.value)
    assert "batchsize" in str(exc.value)
    assert "gradient_checkpointing" in str(exc.value)  # the valid names are listed


def test_with_validates_the_new_value():
    with pytest.raises(RecipeError, match="micro_batch"):
        Recipe().with_(micro_batch=0)


@pytest.mark.parametrize("micro_batch, grad_accum, seq", [(4, 1, 256), (1, 16, 512), (2, 3, 100)])
def test_effective_batch_and_tokens_per_step(micro_batch, grad_accum, seq):
    r = Recipe(micro_batch=micro_batch, grad_accum=grad_accum, max_seq_length=seq)
    assert r.effective_batch == micro_batch * grad_accum
    assert r.tokens_per_step == micro_batch * grad_accum * seq


def test_uses_lora_and_bitsandbytes():
    assert Recipe().uses_lora and not Recipe().uses_bitsandbytes
    assert not Recipe(lora_r=None).uses_lora
    assert Recipe(load_in_4bit=True).uses_bitsandbytes
    assert Recipe(optimizer="adamw_8bit").uses_bitsandbytes
    assert Recipe(optimizer="paged_adamw_32bit").uses_bitsandbytes


def test_name_is_label_or_description():
    assert Recipe(label="mine").name == "mine"
    r = Recipe(load_in_4bit=True, gradient_checkpointing=True, micro_batch=1, grad_accum=8)
    assert r.name == r.describe()
    for part in ("4-bit NF4 +DQ", "LoRA r=16", "ckpt", "1x8", "adamw_torch", "seq 256"):
        assert part in r.describe()
    assert "full FT" in Recipe(lora_r=None).describe()


# --- the ladder ----------------------------------------------------------------------------------


def _changed(before: Recipe, after: Recipe) -> dict:
    a, b = before.to_dict(), after.to_dict()
    a.pop("label"), b.pop("label")
    return {k: b[k] for k in b if a[k] != b[k]}


def test_ladder_adds_exactly_one_technique_per_rung():
    base = Recipe()
    rungs = ladder(base)
    assert [r.label for r in rungs] == [label for label, _ in LADDER_STEPS]
    expected = [
        {},
        {"gradient_checkpointing": True},
        {"micro_batch": 1, "grad_accum": 4},  # one technique, two knobs
        {"optimizer": "adamw_8bit"},
        {"optimizer": "paged_adamw_8bit"},
        {"precision": "auto"},
        {"load_in_4bit": True},
        {"max_seq_length": 128},
    ]
    previous = base
    for rung, want in zip(rungs, expected, strict=True):
        assert _changed(previous, rung) == want, rung.label
        previous = rung


def test_ladder_keeps_the_effective_batch_across_accumulation():
    for base in (Recipe(), Recipe(micro_batch=2, grad_accum=3), Recipe(micro_batch=8)):
        rungs = ladder(base)
        assert {r.effective_batch for r in rungs} == {base.effective_batch}
        accum = rungs[[label for label, _ in LADDER_STEPS].index("+ accumulation (micro-batch 1)")]
        assert accum.micro_batch == 1
        assert accum.grad_accum == base.effective_batch


def test_ladder_halves_the_sequence_but_not_below_16():
    assert ladder(Recipe(max_seq_length=64))[-1].max_seq_length == 32
    assert ladder(Recipe(max_seq_length=20))[-1].max_seq_length == 16


def test_ladder_keys_are_distinct():
    keys = [r.key for r in ladder()]
    assert len(set(keys)) == len(keys)


def test_source_chapter_recipe_matches_the_chapter():
    r = source_chapter_recipe()
    assert r.model == "llama-3.1-8b"
    assert r.load_in_4bit is True
    assert r.double_quant is True
    assert r.lora_r == 16
    assert r.lora_alpha == 32
    assert r.lora_dropout == 0.05
    assert r.lora_targets == ("q_proj", "k_proj", "v_proj", "o_proj") == DEFAULT_TARGETS
    assert r.precision == "bf16"
    assert r.gradient_checkpointing is True
    assert (r.micro_batch, r.grad_accum) == (1, 16)
    assert r.effective_batch == 16
    assert r.optimizer == "paged_adamw_8bit"
    assert r.max_seq_length == 512
    assert r.learning_rate == 2e-4
    assert source_chapter_recipe("mistral-7b").model == "mistral-7b"


# --- bad input -----------------------------------------------------------------------------------


def test_unknown_optimizer_names_it_and_suggests_close_matches():
    with pytest.raises(RecipeError) as exc:
        Recipe(optimizer="adamw8bit")
    msg = str(exc.value)
    assert "'adamw8bit'" in msg
    assert "Did you mean" in msg and "adamw_8bit" in msg


def test_unknown_optimizer_without_close_match_still_lists_the_chapters():
    with pytest.raises(RecipeError) as exc:
        Recipe(optimizer="zzzzzz")
    assert "'zzzzzz'" in str(exc.value)
    assert "paged_adamw_8bit" in str(exc.value)


def test_any_transformers_optimizer_name_is_accepted():
    assert Recipe(optimizer="adafactor").optimizer == "adafactor"


@pytest.mark.parametrize("knob", ["micro_batch", "grad_accum", "max_seq_length", "steps"])
@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_non_positive_or_non_integer_sizes_name_the_knob(knob, value):
    kwargs = {knob: value}
    if knob == "steps":
        kwargs["warmup_steps"] = 0
    with pytest.raises(RecipeError, match=knob):
        Recipe(**kwargs)


def test_steps_must_exceed_warmup_by_two():
    Recipe(steps=4, warmup_steps=2)  # the minimum is fine
    with pytest.raises(RecipeError) as exc:
        Recipe(steps=3, warmup_steps=2)
    assert "steps (3)" in str(exc.value) and "warmup_steps" in str(exc.value)
    with pytest.raises(RecipeError, match="warmup_steps"):
        Recipe(warmup_steps=-1)


def test_4bit_needs_lora():
    with pytest.raises(RecipeError) as exc:
        Recipe(load_in_4bit=True, lora_r=None)
    assert "load_in_4bit" in str(exc.value) and "lora_r" in str(exc.value)


@pytest.mark.parametrize("precision", ["fp8", "BF16", "", "float32"])
def test_bad_precision(precision):
    with pytest.raises(RecipeError) as exc:
        Recipe(precision=precision)
    assert "precision" in str(exc.value) and repr(precision) in str(exc.value)


@pytest.mark.parametrize("kwargs, knob", [
    ({"lora_r": 0}, "lora_r"),
    ({"lora_r": -4}, "lora_r"),
    ({"lora_targets": ()}, "lora_targets"),
    ({"learning_rate": 0}, "learning_rate"),
    ({"learning_rate": -1e-4}, "learning_rate"),
])
def test_other_bad_values_name_the_knob(kwargs, knob):
    with pytest.raises(RecipeError, match=knob):
        Recipe(**kwargs)


def test_recipe_error_is_a_value_error():
    assert issubclass(RecipeError, ValueError)


@pytest.mark.parametrize("kwargs", [{"lora_r": True}, {"warmup_steps": True}])
def test_bools_are_not_sizes(kwargs):
    with pytest.raises(RecipeError):
        Recipe(**kwargs)


@pytest.mark.parametrize("lr", [float("inf"), float("nan"), -1e-4, 0, True])
def test_a_learning_rate_that_cannot_train_is_refused_up_front(lr):
    """inf trained to losses of 0.0 and was stored as a result; nan slipped past `<= 0` (issue 14)."""
    with pytest.raises(RecipeError, match="learning_rate must be a positive, finite number"):
        Recipe(learning_rate=lr)


@pytest.mark.parametrize("knobs, message", [
    ({"lora_targets": "q_proj"}, "not the string 'q_proj'"),
    ({"lora_targets": ("q_proj", "")}, "module names"),
    ({"model": ""}, "model must name a model"),
    ({"lora_dropout": 1.5}, "lora_dropout must be at least 0 and below 1"),
    ({"lora_dropout": float("nan")}, "lora_dropout"),
    ({"seed": -1}, "seed must be a whole number"),
    ({"seed": 2**32}, "seed must be a whole number"),
])
def test_knobs_a_training_run_would_fail_on_are_refused_before_any_process_starts(knobs, message):
    """Each of these used to fail only inside the measuring child, 7-9 s later, under a traceback (issue 14)."""
    with pytest.raises(RecipeError, match=message):
        Recipe(**knobs)
