"""Notebook 09 (notebooks/09_beyond_the_recipe.ipynb, quizzes/09_beyond_the_recipe.yaml): Beyond the source recipe: leaner and faster.

Beyond the source recipe: a leaner and a faster QLoRA recipe, one measured change at a time.

The source chapter's complete script is the baseline. Every change here keeps what is trained the
same (the same LoRA on the same frozen 4-bit model, the same data, the same tokens per optimizer
step) and changes only where bytes live, which kernels run, and how the tokens are batched:

  no fp32 upcast   peft's prepare_model_for_kbit_training casts every weight that is not 4-bit
                   (embeddings, lm_head, norms) to fp32. For Llama-3.1-8B that is 1.96 GiB more,
                   and the fp32 embedding output makes the whole residual stream fp32.
  embeddings on CPU  the input embedding table (1 GiB in bf16) is frozen, and a step reads only
                   micro_batch x sequence rows of it: it can stay in CPU memory.
  Liger kernels    fused RMSNorm, SwiGLU and RoPE from Liger (Triton, CUDA only). trl keeps its own
                   fused, chunked loss, which already never materializes the 128k-wide logits.
  micro-batch      at micro-batch 1 an 8B step is launch-bound: the GPU waits for Python. More
                   sequences per micro-batch, fewer accumulation steps, same tokens per step.

The GPU figures come from scripts/gpu/beyond_recipe.py, shipped in course_utils/reference/beyond/. Beside them, a
peer: Unsloth, measured in the same run by scripts/gpu/beyond_recipe.py --peers unsloth (scripts/gpu/peer_unsloth.py, in an
environment of its own) on the same model, data, tokens per step and timing rule, shipped apart from ours in
reference/beyond/peers/.

Toward the limit (issue 16): each run's tokens/s against its compute limit (its FLOPs per token at the GPU's
datasheet peak) and its allocated peak against the memory floor of its frozen weights (course_utils.limits;
toward_the_limit, limit_table).
"""

from __future__ import annotations

from course_utils import machine, measure
from course_utils.chapter.shipped_runs import (  # noqa: F401  (notebooks 09 and 10, the scripts: beyond.<name>)
    CHECKS, FAST_MAX_GIB, FAST_MIN_SPEEDUP, LEAN_MAX_GIB, LEAN_MAX_RATIO, LOSSES_APART, Row, batching, by_label,
    format_rows, loss_agreement, loss_table, path_from, peer_reference, reference, rows, rows_table, source,
    target_checks)
from course_utils.chapter.exercises import (BEYOND_KNOBS, CLAIM, Exercise, REFERENCE_MODEL, Verdict, _est, _first,
                                            _gib, _only, _same_steps, claim_bytes)
from course_utils.checks import check_hardware
from course_utils.estimate.shapes import model_shapes
from course_utils.estimate.plan import needed_bytes
from course_utils.machine import HardwareError
from course_utils.recipe import TECHNIQUES, Recipe, source_chapter_recipe

BEYOND = tuple(t for t in TECHNIQUES if t.where == "beyond")  # notebook 09's techniques, from the one table


def changes(model: str = "llama-3.1-8b", steps: int = 5) -> list[Recipe]:
    """The lean path: the source recipe, then one change at a time (each keeps the ones before)."""
    return path_from(source(model, steps))[:4]


def lean(model: str = "llama-3.1-8b", steps: int = 5) -> Recipe:
    """Same effective batch (16), sequence, LoRA and optimizer as the source; fewer bytes, more tokens/s."""
    return path_from(source(model, steps))[4]


def fast(model: str = "llama-3.1-8b", steps: int = 5) -> Recipe:
    """Same tokens per optimizer step (16 x 512) in one micro-batch, within a 16 GiB card."""
    return path_from(source(model, steps))[5]


def fast_low_memory(model: str = "llama-3.1-8b", steps: int = 5) -> Recipe:
    """The fast recipe with the embeddings and, through trl, the saved activations in CPU memory."""
    return path_from(source(model, steps))[6]


# ---------------------------------------------------------------------------------------------
# the same changes on this machine (notebook 09)
# ---------------------------------------------------------------------------------------------
def path_here(model: str) -> list[Recipe]:
    """Notebook 09's recipes on this machine: the source recipe, each change, the lean and the fast recipe,
    and the fast one with activations on CPU too.

    On a GPU without bf16 (a T4, or the T4 profile) every recipe trains in fp16 instead of bf16.
    On a CPU (the embedded tiny model) the source recipe is scaled down: 1 x 8 x 128 tokens, 4 steps (1
    warm-up, 1 tracked, 2 timed), learning rate 1e-3, in bf16 where the CPU has it (else fp32, where there is no upcast to remove).
    Lean is 2 x 4 and fast 8 x 1 there: the same tokens per optimizer step.
    """

    if machine.device_type() == "cpu":
        return path_from(source_chapter_recipe(model).with_(
            grad_accum=8, max_seq_length=128, steps=4, warmup_steps=1, learning_rate=1e-3,
            precision="bf16" if machine.bf16_supported() else "fp32", label="source recipe (1x8)"))
    src = source(model)
    if not machine.bf16_supported():  # a T4: the same changes in fp16, where each of them can run
        src = src.with_(precision="fp16", label=src.label)
    return path_from(src)


def why_not_here(recipe: Recipe) -> str | None:
    """Why this machine cannot run `recipe` (a CUDA-only change, a tied embedding table), or None."""

    try:
        check_hardware(recipe)
    except HardwareError as error:
        return str(error)
    if recipe.offload_embeddings and model_shapes(recipe.model).tied:
        return "this model ties its input and output embeddings, and the output layer needs the table on the GPU"
    return None


def run_path(model: str, *, store=None, progress: bool = True) -> tuple[list, dict[int, str]]:
    """Measure path_here(model): (a measurement per recipe, None where skipped; {position: why skipped}).
    A change this machine cannot make is skipped, and the recipes after it are measured without it."""

    recipes, skip = path_runnable(model)
    results = measure.measure_all(recipes, store=store, progress=progress, isolate=None, skip=skip,
                                  desc="beyond the recipe")
    return [o.measurement for o in results], results.skipped


def path_runnable(model: str) -> tuple[list[Recipe], dict[int, str]]:
    """path_here(model) as it runs here, and {position: why} for the changes this machine cannot make
    (why_not_here); the recipes after such a change have its knob turned off."""
    recipes, skip, dropped = [], {}, {}
    for i, recipe in enumerate(path_here(model)):
        recipe = recipe.with_(**dropped, label=recipe.label)
        why = why_not_here(recipe)
        if why is not None:
            skip[i] = why
            for t in BEYOND:  # notebook 09's techniques (TECHNIQUES' "beyond" rows): the one that cannot run here
                if t.on(recipe) and why_not_here(recipe.with_(**{t.fields[0]: t.default})) != why:
                    dropped[t.fields[0]] = t.default
        recipes.append(recipe)
    return recipes, skip


def _fig_08(start: Recipe, hw: str) -> dict:
    written, budget = claim_bytes()
    return {"claim": CLAIM, "alloc": _gib(_est(start, hw).cuda_allocated_bytes), "gb": written.removesuffix("GB"),
            "budget": _gib(budget), "n": start.effective_batch}


def _check_08(answer: Recipe, start: Recipe, hw: str) -> Verdict:
    refused = _first(_only(answer, start, BEYOND_KNOBS), _same_steps(answer, start))
    if refused is not None:
        return refused
    written, budget = claim_bytes()
    e = _est(answer, hw)
    holds = e.cuda_allocated_bytes <= budget
    return Verdict(holds, f"the estimate allocates {'at most' if holds else 'more than'} the chapter's {written}", (
        f"estimated peak {_gib(e.peak_bytes)} GiB + CUDA libraries' {_gib(e.cuda_extra.nbytes)} GiB = "
        f"{_gib(e.cuda_allocated_bytes)} GiB allocated, against {written} read strictly (a billion bytes a GB) = "
        f"{_gib(budget)} GiB",
        f"a card holds more than the allocated peak (the allocator's reserve, the CUDA context): by the planner's "
        f"rule this recipe needs {_gib(needed_bytes(e))} GiB"))


def _solve_08(start: Recipe, hw: str) -> Recipe:
    r, budget = start, claim_bytes()[1]
    for change in ({"prepare_kbit": False}, {"offload_embeddings": True}, {"offload_activations": True},
                   {"liger_kernels": True}):
        if _est(r, hw).cuda_allocated_bytes <= budget:
            break
        r = r.with_(**change)
    return r
_T08 = ("The chapter says \"{claim}\". Its own recipe on Llama-3.1-8B (`source_chapter_recipe(\"llama-3.1-8b\")`) "
        "is estimated to allocate {alloc} GiB at its peak on a bf16 GPU (what `torch.cuda.max_memory_allocated()` "
        "reads), against {gb} GB read strictly, as {gb} billion bytes = {budget} GiB (a card labelled {gb} GB "
        "offers a little more: GPU memory is labelled in binary units). With this notebook's changes (no "
        "`prepare_model_for_kbit_training` call: `prepare_kbit = False`; `offload_embeddings = True`; "
        "`use_liger_kernel=True`; `activation_offloading=True`; another `per_device_train_batch_size` at the same "
        "{n} sequences per step), make the estimate allocate **at most** that while training the same thing: the "
        "same model, 4-bit weights, LoRA, precision and sequence length.")


# The notebook's exercise (course_utils.chapter.exercises shows and checks it)
EXERCISE = Exercise("09_beyond_the_recipe", "the chapter's claim for a small card", _T08, _fig_08, _check_08, _solve_08,
             "no fp32 upcast, then embeddings on CPU, activations on CPU and Liger kernels, each added only while "
             "the estimate is over", hardware="gpu", start_code='source_chapter_recipe("llama-3.1-8b")',
             start=lambda base: source_chapter_recipe(REFERENCE_MODEL),
             setup="from course_utils.recipe import source_chapter_recipe", base_name="path[0]")

# The "In your own script" cells of the notebook (kind, the rung they write, the rung they are compared with, the cell
# they follow, what the markdown above them says): `scripts/notebooks/write_notebooks.py own-script` writes them.
OWN_SCRIPT = ("beyond", "+ no fp32 upcast", "source recipe (1x16)", "08-08",
              "No fp32 upcast is a line *left out*: do not call `prepare_model_for_kbit_training`. "
              "trl 1.16's `SFTTrainer(peft_config=lora_config)` never calls it either, so the usual "
              "idiom has no upcast. (Embeddings on CPU are the course's own hooks, "
              "`course_utils.build.offload_input_embeddings`; Liger is `SFTConfig(use_liger_kernel=True)`.)")
