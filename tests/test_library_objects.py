"""build.library_objects: the one map from a Recipe to the libraries' objects, which build trains with and the
README's field table is generated from."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from course_utils import build as build_mod
from course_utils.chapter import library_map
from course_utils.build import library_objects
from course_utils.recipe import Recipe, RecipeError, source_chapter_recipe

README = Path(__file__).resolve().parents[1] / "README.md"


def block(name: str) -> str:
    text = README.read_text(encoding="utf-8")
    return text.split(f"<!-- {name} -->\n", 1)[1].split(f"\n<!-- /{name} -->", 1)[0]


def test_readme_field_table_is_generated():
    assert block("library-table") == library_map.field_table()


def test_every_recipe_field_is_in_the_table():
    toggled = {field for field, _, _ in library_map.TOGGLES}
    fields = {f.name for f in dataclasses.fields(Recipe)}
    assert toggled | set(library_map.NOT_TOGGLED) == fields
    assert not toggled & set(library_map.NOT_TOGGLED)


def test_source_recipe_objects():
    o = library_objects(source_chapter_recipe(), fsdp=False)
    assert o.precision == "bf16"
    q = o.quantization_config
    assert (q.load_in_4bit, q.bnb_4bit_quant_type, q.bnb_4bit_use_double_quant) == (True, "nf4", True)
    assert q.bnb_4bit_compute_dtype == torch.bfloat16 and q.bnb_4bit_quant_storage == torch.uint8
    assert o.model_kwargs["dtype"] == torch.bfloat16 and o.model_kwargs["quantization_config"] is q
    assert o.prepare_kbit_kwargs == {"use_gradient_checkpointing": True,
                                     "activation_checkpointing_kwargs": {"use_reentrant": False}}
    assert (o.lora_config.r, o.lora_config.lora_alpha, o.lora_config.lora_dropout) == (16, 32, 0.05)
    kw = o.sft_kwargs
    assert (kw["per_device_train_batch_size"], kw["gradient_accumulation_steps"], kw["max_length"]) == (1, 16, 512)
    assert (kw["optim"], kw["bf16"], kw["fp16"], kw["packing"], kw["packing_strategy"]) == (
        "paged_adamw_8bit", True, False, True, "wrapped")
    assert kw["activation_checkpointing"] is True and kw["activation_checkpointing_kwargs"] == {"use_reentrant": False}
    # no fp32 recast in bf16; the block filter and whole steps always
    assert not any("fp32" in s for s in o.course_steps) and len(o.course_steps) == 2


def test_fsdp_stores_4bit_weights_in_the_compute_dtype():
    o = library_objects(source_chapter_recipe(), fsdp=True)
    assert o.quantization_config.bnb_4bit_quant_storage == torch.bfloat16
    assert o.model_kwargs["device_map"] is None


def test_full_fine_tune_has_no_lora_config_and_fp16_keeps_fp32_masters():
    o = library_objects(Recipe(lora_r=None, precision="auto"), "fp16")
    assert o.lora_config is None and o.quantization_config is None and o.prepare_kbit_kwargs is None
    assert o.model_kwargs["dtype"] == torch.float32
    assert o.sft_kwargs["fp16"] is True and o.sft_kwargs["bf16"] is False


def test_precision_resolves_only_auto():
    with pytest.raises(RecipeError, match="precision='fp32'"):
        library_objects(Recipe(precision="fp32"), "bf16")


def test_sft_config_is_made_from_the_kwargs(tmp_path):
    r = Recipe(micro_batch=3, grad_accum=5, gradient_checkpointing=True, optimizer="adamw_8bit")
    o = library_objects(r, output_dir=str(tmp_path))
    args = o.sft_config
    direct = build_mod.sft_config(r, "fp32", str(tmp_path))
    for name in build_mod.sft_config_kwargs_used():
        assert getattr(args, name) == getattr(direct, name), name


def test_build_trains_with_library_objects(monkeypatch):
    """build() asks library_objects once and loads the model with its from_pretrained arguments."""
    seen = {}
    real = build_mod.library_objects

    def spy(*a, **k):
        seen["objects"] = real(*a, **k)
        return seen["objects"]

    class Loaded(Exception):
        pass

    def load(recipe, precision, kwargs=None):
        seen["kwargs"] = kwargs
        raise Loaded

    monkeypatch.setattr(build_mod, "library_objects", spy)
    monkeypatch.setattr(build_mod, "load_model", load)
    with pytest.raises(Loaded):
        build_mod.build(Recipe(load_in_4bit=True))
    assert seen["kwargs"] is seen["objects"].model_kwargs
    assert seen["kwargs"]["quantization_config"] is seen["objects"].quantization_config


def test_changes_names_each_argument():
    a = library_objects(Recipe(), output_dir="out", fsdp=False)
    b = library_objects(Recipe(gradient_checkpointing=True, micro_batch=1), output_dir="out", fsdp=False)
    assert library_map.changes(a, b) == [
        'SFTConfig(per_device_train_batch_size=1, activation_checkpointing=True, '
        'activation_checkpointing_kwargs={"use_reentrant": False})']
