"""Exercise answers in the libraries' own code: a learner may answer a "Try it" with what their script passes, read
onto the exercise's starting recipe through course_utils/from_library.py and checked by the estimator as a Recipe is.

An answer is a trl SFTConfig, a peft LoraConfig, a transformers BitsAndBytesConfig, a tuple of them, or a dict of
from_library's arguments: model_id, args, peft_config (None: a full fine-tune), quantization_config, dtype,
prepare_kbit (whether the script calls peft's prepare_model_for_kbit_training), and offload_embeddings (the course's
own hook, course_utils.build.offload_input_embeddings). Each object given is taken whole, as the script would pass
it (an SFTConfig's defaults included: SFTConfig() turns bf16 and checkpointing on); what is not given stays the
starting recipe's. The weights' dtype and the 4-bit compute dtype follow the precision unless given.
"""

from __future__ import annotations


from course_utils import build
from course_utils.chapter.library_map import changes
from course_utils.from_library import dtype_name, read_settings, settings_of
from course_utils.machine import HardwareError, get_hardware, resolve_precision
from course_utils.models import PRESETS
from course_utils.recipe import Recipe

BY_TYPE = {"SFTConfig": "args", "LoraConfig": "peft_config", "BitsAndBytesConfig": "quantization_config"}
KEYS = ("model_id", "args", "peft_config", "quantization_config", "dtype", "prepare_kbit", "offload_embeddings")


def library_answer(value) -> dict | None:
    """The answer as from_library's arguments, or None when it is not a library answer."""
    if isinstance(value, dict):
        return dict(value) if value and set(value) <= set(KEYS) else None
    items = value if isinstance(value, (tuple, list)) else (value,)
    if not items or not all(type(v).__name__ in BY_TYPE for v in items):
        return None
    return {BY_TYPE[type(v).__name__]: v for v in items}


def is_library_answer(value) -> bool:
    return library_answer(value) is not None


def answer_recipe(value, start: Recipe, hardware: str) -> Recipe:
    """The recipe a library answer trains, read onto `start` for the estimator's `hardware`."""

    given = library_answer(value)
    hw = get_hardware(hardware)
    try:
        precision = resolve_precision(start.precision, hw)
    except HardwareError:  # a start this hardware cannot train (the exercise is to change it)
        precision = resolve_precision("auto", hw)
    o = build.library_objects(start.with_(precision="auto"), precision, fsdp=False)
    s = settings_of(args=given["args"]) if "args" in given else dict(o.sft_kwargs)
    lora = given.get("peft_config", o.lora_config)
    bnb = given.get("quantization_config", o.quantization_config)
    s.update(settings_of(peft_config=lora, quantization_config=bnb))
    if "quantization_config" not in given:
        s.pop("bnb_4bit_compute_dtype", None)  # follows the precision, as build makes it
    if given.get("dtype") is not None:
        s["dtype"] = dtype_name(given["dtype"])
    read = read_settings(str(given.get("model_id", start.model)), s, "your answer",
                         dtype_given=given.get("dtype") is not None,
                         prepare_kbit=given.get("prepare_kbit", start.prepare_kbit))
    recipe = read.recipe.with_(steps=start.steps, warmup_steps=start.warmup_steps,
                               offload_embeddings=given.get("offload_embeddings", start.offload_embeddings))
    if recipe.precision == precision and start.precision in ("auto", precision):
        recipe = recipe.with_(precision=start.precision)  # 'auto' stays 'auto'
    return recipe


def solution_lines(start: Recipe, solution: Recipe, hardware: str) -> list[str]:
    """The worked solution in the libraries' own code: what changes from the start's arguments (library_map)."""

    def objects(recipe: Recipe):
        hw = get_hardware(hardware)
        try:
            precision = resolve_precision(recipe.precision, hw)
        except HardwareError:
            precision = resolve_precision("auto", hw)
        return build.library_objects(recipe.with_(precision="auto"), precision, fsdp=False)

    lines = []
    if solution.model != start.model:
        lines.append(f'model_id = "{PRESETS.get(solution.model, {}).get("hub_id", solution.model)}"')
    return lines + changes(objects(start), objects(solution))
