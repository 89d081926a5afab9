"""Exercise answers in the libraries' own code (course_utils/chapter/exercise_library.py): read back through from_library and
checked by the estimator as a Recipe answer is; Recipe answers keep working."""

from __future__ import annotations

import warnings

import pytest

from course_utils.build import library_objects
from course_utils.chapter.exercises import EXERCISES, ExerciseError, check_exercise
from course_utils.machine import get_hardware, resolve_precision
from course_utils.recipe import base_recipe_for

BASE = base_recipe_for("tiny", "cpu")
RECIPE_ANSWERS = [name for name, ex in EXERCISES.items() if ex.answer_kind != "gpus"]


def library_form(name: str, recipe):
    """`recipe` as a learner's script writes it: from_library's arguments, the objects as build makes them."""
    from trl import SFTConfig

    o = library_objects(recipe, resolve_precision(recipe.precision, get_hardware(EXERCISES[name].hw())), fsdp=False)
    args = SFTConfig(**{**o.sft_kwargs, "use_cpu": True})  # use_cpu: bf16 on this CPU (plumbing, not read)
    return dict(model_id=recipe.model, args=args, peft_config=o.lora_config, quantization_config=o.quantization_config,
                prepare_kbit=recipe.prepare_kbit, offload_embeddings=recipe.offload_embeddings)


@pytest.mark.parametrize("name", RECIPE_ANSWERS)
def test_the_worked_solution_in_library_code_passes(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verdict = check_exercise(name, library_form(name, EXERCISES[name].solution(BASE)), BASE)
    assert verdict, verdict


def test_a_wrong_library_answer_fails_with_the_estimators_reason():
    from trl import SFTConfig

    start = EXERCISES["01_gradient_checkpointing"].start(BASE)
    o = library_objects(start, "fp32", fsdp=False)
    off = SFTConfig(**{**o.sft_kwargs, "activation_checkpointing": False, "use_cpu": True})
    verdict = check_exercise("01_gradient_checkpointing", off, BASE)  # one object: the rest stays the start's
    assert not verdict and "gradient_checkpointing is off" in verdict.title


def test_a_lora_config_alone_changes_only_lora():
    from peft import LoraConfig

    from course_utils.chapter.exercise_library import answer_recipe

    start = EXERCISES["01_gradient_checkpointing"].start(BASE)
    got = answer_recipe(LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"],
                                   task_type="CAUSAL_LM"), start, "cpu")
    assert got == start.with_(lora_r=8, lora_alpha=16, lora_targets=("q_proj", "v_proj"), label=start.label)


def test_a_full_fine_tune_is_peft_config_none():
    from course_utils.chapter.exercise_library import answer_recipe

    start = EXERCISES["03_efficient_optimizers"].start(BASE)
    assert answer_recipe({"peft_config": None}, start, "cpu").lora_r is None


def test_other_answers_are_still_refused_by_name():
    with pytest.raises(ExerciseError, match="answer must be the libraries' objects.*SFTConfig.*base.with_"):
        check_exercise("01_gradient_checkpointing", {"gradient_checkpointing": True}, BASE)
