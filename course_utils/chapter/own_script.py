"""The notebooks' "In your own script" cells: which recipe each one writes in the libraries' own code.

A cell names its recipe on its second line, e.g. `# recipe: ladder "+ gradient checkpointing" (after "baseline
(LoRA, fp32)")`: a kind (ladder, beyond, chapter, multi), the recipe's label, and the recipe the notebook before left
the learner with (its changed arguments carry `# <- new in this notebook`). Every cell writes the recipe as it
trains Llama-3.1-8B on a GPU: an 'auto' precision is bf16 there (fp16 on a T4). tests/test_own_script.py parses
each cell and compares every argument with build.library_objects of that recipe.
"""

from __future__ import annotations

import re

from course_utils import build
from course_utils.chapter import shipped_runs as beyond
from course_utils.chapter.library_map import flat
from course_utils.recipe import Recipe, RecipeError, base_recipe_for, gpu_recipe, ladder, source_chapter_recipe

MODEL = "llama-3.1-8b"
GPU_PRECISION = "bf16"  # what precision='auto' resolves to on the GPUs the references ran on (A100, H100, H200)
HEADER = "# In your own script"
RECIPE_LINE = re.compile(r'^# recipe: (?P<kind>ladder|beyond|chapter|multi) "(?P<label>[^"]+)"'
                         r'(?: \(after "(?P<after>[^"]+)"\))?', re.M)
NEW = "# <- new in this notebook"


def recipes(kind: str) -> list[Recipe]:
    """The recipes of one kind, as a GPU notebook trains them on Llama-3.1-8B."""
    if kind == "ladder":

        return ladder(base_recipe_for(MODEL, "cuda"))
    if kind == "beyond":

        return beyond.path_from(beyond.source(MODEL))
    if kind == "chapter":

        return [source_chapter_recipe(MODEL)]
    if kind == "multi":

        return [gpu_recipe(MODEL, four_bit=True)]
    raise RecipeError(f"unknown recipe kind {kind!r}: ladder, beyond, chapter or multi")


def find(kind: str, label: str) -> Recipe:
    """The recipe of `kind` labelled `label`; an error lists the labels there are."""
    found = {r.label: r for r in recipes(kind)}
    if label not in found:
        raise RecipeError(f"no {kind} recipe labelled {label!r}; there are {sorted(found)}")
    return found[label]


def cell_recipes(source: str) -> tuple[Recipe, Recipe | None]:
    """(the recipe a cell writes, the one before it or None) from its `# recipe:` line."""
    m = RECIPE_LINE.search(source)
    if m is None:
        raise RecipeError('an "In your own script" cell needs a line: # recipe: <kind> "<label>"')
    before = find(m["kind"], m["after"]) if m["after"] else None
    return find(m["kind"], m["label"]), before


def objects(recipe: Recipe):
    """build.library_objects of `recipe` as a GPU trains it (one process: no FSDP)."""

    precision = GPU_PRECISION if recipe.precision == "auto" else recipe.precision
    return build.library_objects(recipe, precision, fsdp=False)


# SFTConfig arguments that change no byte of a training step: the run's length and output, logging, seeds and the
# data loader's plumbing. A cell may set them as it likes; every other argument must be build's.
SFT_RUN_ARGS = frozenset({"output_dir", "max_steps", "logging_steps", "save_strategy", "report_to", "seed",
                          "data_seed", "dataloader_num_workers", "dataloader_drop_last", "dataloader_pin_memory",
                          "disable_tqdm", "use_cpu"})
MODEL_RUN_ARGS = frozenset({"device_map"})  # from_pretrained's placement: one GPU, or this rank's under DDP


def defaults() -> dict[str, dict]:
    """Each call's default argument values, from the installed libraries."""
    import dataclasses
    import inspect

    import torch
    from peft import LoraConfig, prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig
    from trl import SFTConfig

    def of_dataclass(cls):
        return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}

    def of_function(func):
        return {k: p.default for k, p in inspect.signature(func).parameters.items() if p.default is not p.empty}

    return {"SFTConfig": of_dataclass(SFTConfig), "LoraConfig": of_dataclass(LoraConfig),
            # None is bitsandbytes' uint8 (BitsAndBytesConfig.__init__)
            "BitsAndBytesConfig": {**of_function(BitsAndBytesConfig), "bnb_4bit_quant_storage": torch.uint8},
            "prepare_model_for_kbit_training": of_function(prepare_model_for_kbit_training),
            "from_pretrained": {"dtype": "auto", "quantization_config": None}}


def expected(objects) -> dict[tuple[str, str], object]:
    """library_map.flat(objects) without the run's plumbing: what a cell must agree with."""

    run = {("SFTConfig", n) for n in SFT_RUN_ARGS} | {("from_pretrained", n) for n in MODEL_RUN_ARGS}
    return {k: v for k, v in flat(objects).items() if k not in run and k[0] != "build"}
