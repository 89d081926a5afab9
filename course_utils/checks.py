"""Can this recipe run here? One check, before any process start, download or disk write.

`Recipe.validate` holds the rules that need only the recipe (a positive micro-batch, a finite
learning rate, ...). This module holds the rules that need the machine or the model's shape:
GPU-only features and presets on a CPU, the precision the device can do, the sequence length
against the model's positions, and the micro-batch against the data there is. `measure`, the
ladder, the planner, `course estimate` and `course run` all call it, so a recipe that cannot run
is refused with the same one-line message everywhere, before anything is built.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from course_utils import machine
from course_utils.machine import HardwareError, bitsandbytes_status, device_type, resolve_precision
from course_utils.models import (PRESETS, TINY, TINY_CONFIG, is_preset, load_config, shipped_token_count,
                                 uses_shipped_data)
from course_utils.recipe import LADDER_FIELDS, TECHNIQUES, Recipe, RecipeError, ladder, rungs_through

def check_hardware(recipe: Recipe) -> str:
    """Fail early, with advice, when the recipe asks for what this machine cannot do. Returns the precision."""
    precision = resolve_precision(recipe.precision)
    for t in TECHNIQUES:  # the CUDA-only techniques, each by its row (cuda_only, min_cc, package)
        field = t.fields[0]
        why = _cannot_run(t) if t.cuda_only and getattr(recipe, field) != t.default else ""
        if why:
            raise HardwareError(f"{field}={getattr(recipe, field)!r} {t.cuda_only}, which needs {why}. "
                                f"Set {field}={t.default!r} here.")
    if recipe.uses_bitsandbytes:
        usable, why = bitsandbytes_status()
        if not usable:
            what = "4-bit loading" if recipe.load_in_4bit else f"the {recipe.optimizer} optimizer"
            raise HardwareError(
                f"{what} needs bitsandbytes, which cannot run here: {why}. "
                "Install bitsandbytes>=0.50 (it has CPU and CUDA backends), or use load_in_4bit=False "
                "and optimizer='adamw_torch'."
            )
    return precision


def _cannot_run(t) -> str:
    """What a CUDA-only technique needs that this machine lacks ("" when it can run here)."""
    if device_type() != "cuda":
        return f"a CUDA GPU; this machine trains on {device_type()}"
    cc = machine.compute_capability()
    if t.min_cc and cc is not None and cc < t.min_cc:
        return (f"an NVIDIA GPU of compute capability {t.min_cc[0]}.{t.min_cc[1]} or later; this machine trains on "
                f"{machine.device_name()} (compute capability {cc[0]}.{cc[1]})")
    if t.package and importlib.util.find_spec(t.package) is None:
        return f"{t.package}, which is not installed (pip install {t.package.replace('_', '-')})"
    return ""

BIG_ON_CPU_ENV = "COURSE_CPU_BIG_MODELS"  # set to 1 to train a preset over CPU_PARAM_LIMIT on a CPU anyway
CPU_PARAM_LIMIT = 1_000_000_000  # presets above this are GPU presets (fp32 on 2 cores: hours per step)


def preset_params(name: str) -> int:
    """Parameters of a preset, from its published shape (no transformers import): embeddings, the
    decoder layers' attention and MLP projections, and lm_head unless tied. Norms are left out
    (under 0.01% of any preset)."""

    s = PRESETS[name.lower()]
    h, inter, layers = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"]
    kv = h // s["num_attention_heads"] * s["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter
    tables = s["vocab_size"] * h * (1 if s.get("tie_word_embeddings") else 2)
    return layers * per_layer + tables


def max_positions(model: str) -> int | None:
    """The model's max_position_embeddings where it can be read without the hub: the tiny default,
    a preset, or a local folder's config.json. None for a hub id (build checks it once loaded)."""
    from pathlib import Path


    if model == TINY:
        return TINY_CONFIG["max_position_embeddings"]
    if is_preset(model):
        return PRESETS[model.lower()]["max_position_embeddings"]
    config = Path(model).expanduser() / "config.json"
    if config.is_file():
        try:
            return json.loads(config.read_text()).get("max_position_embeddings")
        except (OSError, ValueError):
            return None
    return None


def check_positions(model: str, seq: int, positions: int | None = None) -> None:
    """A sequence longer than the model's position table cannot be trained or estimated."""
    positions = positions if positions is not None else max_positions(model)
    if positions and seq > positions:
        raise RecipeError(
            f"max_seq_length={seq} is longer than {model!r} can take: its position table has {positions:,} "
            f"positions (max_position_embeddings). Use max_seq_length <= {positions:,}.")


def check_data(recipe: Recipe, world: int = 1) -> None:
    """One micro-batch must come from the data: the shipped records packed into sequences of
    max_seq_length tokens, and so must one optimizer step (micro_batch x grad_accum sequences on each of the
    `world` processes that train together). (An upper bound is enough to refuse here; build checks the packed
    count.)"""
    if not uses_shipped_data(recipe.model):
        return

    tokens = shipped_token_count()
    blocks = tokens // recipe.max_seq_length
    if recipe.micro_batch > blocks:
        raise RecipeError(
            f"micro_batch={recipe.micro_batch} needs {recipe.micro_batch} sequences of {recipe.max_seq_length} "
            f"tokens per step, but the shipped data packs into at most {blocks} ({tokens:,} tokens): the run "
            f"would train {blocks} while recording {recipe.micro_batch}. Use micro_batch <= {blocks}, "
            "or a shorter max_seq_length.")
    if recipe.effective_batch * world > blocks:  # one optimizer step would read the data more than once
        mb, ga = recipe.micro_batch, recipe.grad_accum
        product = (f"micro_batch x grad_accum = {mb} x {ga}" if world == 1 else
                   f"{world} processes x micro_batch {mb} x grad_accum {ga}")  # each process reads its share
        raise RecipeError(
            f"{product} = {recipe.effective_batch * world} sequences of {recipe.max_seq_length} tokens per optimizer "
            f"step, but the shipped data packs into at most {blocks} ({tokens:,} tokens). Use "
            f"{'' if world == 1 else 'gpus x '}micro_batch x grad_accum <= {blocks}, or a shorter max_seq_length.")


# Above this learning rate a run cannot train (issue 32): Adam-type optimizers move every weight by about the learning
# rate each step, so the weights outgrow themselves within a step or two. On the tiny model (`course run`'s ladder base,
# 6 steps) lr 3 and 10 collapsed the loss to 0.0 at step 4, 1e6 at step 3, 1e30 at step 2, while lr 1, 0.5 and 0.2 did
# not collapse; a run of 2 or 3 steps ends before the collapse shows and was stored as a result.
MAX_LEARNING_RATE = 1.0


def check_learning_rate(recipe: Recipe) -> None:
    """A learning rate above MAX_LEARNING_RATE is refused before anything trains: its loss collapses (or, in a run
    too short to show it, would have collapsed a step later), which is no result."""
    if recipe.learning_rate > MAX_LEARNING_RATE:
        raise RecipeError(
            f"learning_rate={recipe.learning_rate:g} cannot train: AdamW (8-bit too) moves each weight by about the rate "
            f"per step, and above {MAX_LEARNING_RATE:g} the loss collapses to 0.0 within a few steps (the tiny model: "
            "lr 3 and 10 at step 4). Try a smaller learning rate such as 1e-3 (course run --lr 1e-3; the chapter "
            "uses 2e-4).")


def check_machine(recipe: Recipe) -> str:
    """The rules that need this machine: precision, CUDA-only techniques, bitsandbytes, and GPU-sized
    presets on a CPU. Returns the resolved precision."""
    precision = check_hardware(recipe)
    if device_type() == "cpu" and is_preset(recipe.model) and os.environ.get(BIG_ON_CPU_ENV) != "1":
        params = preset_params(recipe.model)
        if params > CPU_PARAM_LIMIT:
            raise HardwareError(
                f"{recipe.model} ({params / 1e9:.1f} B parameters) is a GPU preset and there is no CUDA GPU "
                f"here: on this CPU it would write {params * 2 / 1e9:.0f} GB of random weights, then train in fp32 "
                "for hours per step. Use model='tiny' here, or run on a GPU (Colab: Runtime > Change runtime "
                f"type > T4); `course estimate --model {recipe.model}` shows its memory without one "
                f"({BIG_ON_CPU_ENV}=1 trains it here anyway).")
    return precision


# The linear layers of the architectures 'tiny' and the presets have (Llama and Mistral name them alike):
# what LoRA can target, known without building the model.
KNOWN_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


def check_targets(recipe: Recipe) -> None:
    """LoRA targets the embedded default or a preset does not have are refused before anything loads (a hub
    model's names are checked by build, once it is loaded)."""
    if not (recipe.uses_lora and uses_shipped_data(recipe.model)):
        return
    missing = [t for t in recipe.lora_targets if t not in KNOWN_LINEARS]
    if missing:
        raise RecipeError(f"lora_targets: LoRA target module(s) {missing} not found in {recipe.model!r}. Its linear "
                          f"layers are: {sorted(KNOWN_LINEARS)}. Pick lora_targets from those.")


def check_model(recipe: Recipe) -> None:
    """A hub id or a folder must give a config (read through the hub's deadline: a missing, gated or
    unknown model is a one-line ModelUnavailableError here, not a child's traceback), and its sequence
    length must fit the model's positions. 'tiny' and the presets are known without reading anything."""
    if uses_shipped_data(recipe.model):
        check_positions(recipe.model, recipe.max_seq_length)
        return

    config = load_config(recipe.model)
    check_positions(recipe.model, recipe.max_seq_length, getattr(config, "max_position_embeddings", None))


def check_runnable(recipe: Recipe) -> str:
    """Every check that needs only the recipe and this machine; raises RecipeError, HardwareError or
    ModelUnavailableError with the fix in its message. Returns the precision the recipe resolves to here.
    (The recipe's own rules are not checked again: a Recipe validates itself when it is made.)"""
    check_model(recipe)
    check_targets(recipe)
    check_learning_rate(recipe)
    precision = check_machine(recipe)
    check_data(recipe)
    return precision


def ladder_here(base: Recipe, through: str | None = None) -> tuple[list[Recipe], dict[int, str]]:
    """The chapter's ladder from `base` (up to the rung named `through`, one of RUNG_NAMES) as it runs here, each
    rung checked (check_runnable, once: run_ladder measures them without checking again), mixed precision
    resolved, and {position: why} for the rungs that are then the same recipe as the rung above (on a CPU, mixed
    precision is fp32, so that rung is the one before it)."""
    asked = ladder(base)[:rungs_through(through)]
    rungs = [rung.with_(precision=resolve_precision(rung.precision), label=rung.label) for rung in asked]
    same = {i: _same_as_above(asked[i - 1], asked[i], device_type())
            for i in range(1, len(rungs)) if rungs[i].key == rungs[i - 1].key}
    for i, rung in enumerate(rungs):
        if i not in same:
            check_runnable(rung)
    return rungs, same


def _same_as_above(before: Recipe, rung: Recipe, device: str) -> str:
    """Why a rung is the same recipe as the one above it here: what it sets, and why that changes nothing."""
    changed = {f: getattr(rung, f) for f in LADDER_FIELDS if getattr(rung, f) != getattr(before, f)}
    if changed.get("precision") == "auto":
        return f"precision=auto is fp32 on {device}: same recipe as the rung above"
    if not changed:
        return (f"the rung above already has what it sets ({rung.micro_batch}x{rung.grad_accum}, {rung.optimizer}, "
                f"{'ckpt' if rung.gradient_checkpointing else 'no ckpt'}): same recipe")
    said = ", ".join(f"{k}={v}" for k, v in changed.items())
    return f"its change ({said}) is already in the rung above: same recipe"
