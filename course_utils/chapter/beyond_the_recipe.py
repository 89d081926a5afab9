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

import statistics
from dataclasses import dataclass

from course_utils import machine, measure
from course_utils.chapter.exercises import (BEYOND_KNOBS, CLAIM, Exercise, REFERENCE_MODEL, Verdict, _est, _first,
                                            _gib, _only, _same_steps, claim_bytes)
from course_utils.checks import check_hardware
from course_utils.common import GiB, shipped
from course_utils.estimate import estimate, model_shapes
from course_utils.estimate.plan import needed_bytes
from course_utils.machine import HardwareError
from course_utils.recipe import TECHNIQUES, Recipe, source_chapter_recipe
from course_utils.results import shipped_results
from course_utils.show.tables import Column, Table

# the targets, as ratios against the source recipe measured in the same run
LEAN_MAX_RATIO = 0.70
LEAN_MAX_GIB = 5.7
FAST_MAX_GIB = 16.0
FAST_MIN_SPEEDUP = 8.0
BEYOND = tuple(t for t in TECHNIQUES if t.where == "beyond")  # notebook 09's techniques, from the one table


def source(model: str = "llama-3.1-8b", steps: int = 5) -> Recipe:
    """The source chapter's recipe (QLoRA 1x16, checkpointing, paged 8-bit AdamW, bf16, sequence 512)."""
    return source_chapter_recipe(model).with_(steps=steps, warmup_steps=1, label="source recipe (1x16)")


def path_from(src: Recipe) -> list[Recipe]:
    """From a source recipe: each change added to the one before, then the lean recipe (a quarter of the
    effective batch per micro-batch), the fast recipe (all of it in one micro-batch) and the fast recipe
    with embeddings and activations on CPU. Every recipe keeps the source's tokens per optimizer step."""
    out = [src]
    for label, change in (("+ no fp32 upcast", {"prepare_kbit": False}),
                          ("+ embeddings on CPU", {"offload_embeddings": True}),
                          ("+ Liger kernels", {"liger_kernels": True})):
        out.append(out[-1].with_(**change, label=label))
    effective = src.effective_batch
    mb = max(1, effective // 4)
    out.append(out[-1].with_(micro_batch=mb, grad_accum=effective // mb, label=f"lean recipe ({mb}x{effective // mb})"))
    fast_r = src.with_(prepare_kbit=False, liger_kernels=True, micro_batch=effective, grad_accum=1,
                       label=f"fast recipe ({effective}x1)")
    out.append(fast_r)
    out.append(fast_r.with_(offload_embeddings=True, offload_activations=True,
                            label=f"fast, embeddings + activations on CPU ({effective}x1)"))
    return out


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


# ---------------------------------------------------------------------------------------------
# the side-by-side table
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One recipe beside the source recipe of the same run."""

    label: str
    allocated_gib: float
    reserved_gib: float
    tokens_per_s: float
    memory_ratio: float  # allocated / the source's allocated
    speed_ratio: float  # tokens/s / the source's tokens/s
    peer_memory_ratio: float | None = None  # allocated / the peer's allocated at the same batching
    peer_speed_ratio: float | None = None  # tokens/s / the peer's tokens/s at the same batching


def rows(measurements: list, source_label: str | None = None, peers: list = ()) -> list[Row]:
    """Rows with ratios against the source recipe among `measurements` (the first one by default), then the
    peer's runs; with `peers`, every row also gets ratios against the peer's run at its batching (if any)."""
    ok = [m for m in list(measurements) + list(peers) if m.fits and m.cuda_max_allocated]
    if not ok:
        return []
    base = next((m for m in ok if m.label == source_label), ok[0])
    at = {batching(p): p for p in peers if p.fits and p.cuda_max_allocated and p.tokens_per_s}
    out = []
    for m in ok:
        p = at.get(batching(m))
        out.append(Row(m.label, m.cuda_max_allocated / GiB, (m.cuda_max_reserved or 0) / GiB, m.tokens_per_s or 0.0,
                       m.cuda_max_allocated / base.cuda_max_allocated,
                       (m.tokens_per_s or 0.0) / base.tokens_per_s if base.tokens_per_s else 0.0,
                       m.cuda_max_allocated / p.cuda_max_allocated if p else None,
                       (m.tokens_per_s or 0.0) / p.tokens_per_s if p else None))
    return out


def rows_table(table: list[Row]) -> Table:
    """The side-by-side table as a Table (course_utils.tables), with two columns of ratios to the peer when any
    row has them."""
    peer = any(r.peer_memory_ratio is not None for r in table)
    columns = [Column("recipe", wrap=True), Column("allocated", "GiB", ".2f"), Column("reserved", "GiB", ".2f"),
               Column("tokens/s", fmt=".0f"), Column("memory", "x src", ".2f"), Column("speed", "x src", ".2f")]
    columns += [Column("memory", "x peer", ".2f"), Column("speed", "x peer", ".2f")] if peer else []
    rows = [[r.label, r.allocated_gib, r.reserved_gib, r.tokens_per_s, r.memory_ratio, r.speed_ratio]
            + ([r.peer_memory_ratio, r.peer_speed_ratio] if peer else []) for r in table]
    return Table(columns, rows)


def format_rows(table: list[Row]) -> str:
    """rows_table as text (at most 100 characters a line)."""
    return str(rows_table(table))


def target_checks(src, lean_m, fast_m) -> list[tuple[str, str, bool]]:
    """(target, what was measured, met?) for the issue's lean and fast targets."""
    out = []
    if src is None or not src.fits:
        return out
    s_alloc, s_speed = src.cuda_max_allocated / GiB, src.tokens_per_s
    if lean_m is not None and lean_m.fits:
        a = lean_m.cuda_max_allocated / GiB
        out.append((f"lean: allocated <= {LEAN_MAX_RATIO:.2f} x source", f"{a / s_alloc:.3f} x", a / s_alloc <= LEAN_MAX_RATIO))
        out.append((f"lean: allocated <= {LEAN_MAX_GIB} GiB", f"{a:.2f} GiB", a <= LEAN_MAX_GIB))
        out.append(("lean: tokens/s >= source", f"{lean_m.tokens_per_s:.0f} vs {s_speed:.0f}",
                    lean_m.tokens_per_s >= s_speed))
    if fast_m is not None and fast_m.fits:
        a = fast_m.cuda_max_allocated / GiB
        out.append((f"fast: allocated <= {FAST_MAX_GIB:.0f} GiB", f"{a:.2f} GiB", a <= FAST_MAX_GIB))
        out.append((f"fast: tokens/s >= {FAST_MIN_SPEEDUP:.0f} x source", f"{fast_m.tokens_per_s / s_speed:.2f} x",
                    fast_m.tokens_per_s >= FAST_MIN_SPEEDUP * s_speed))
    return out


LOSSES_APART = 0.01  # a per-step loss gap above this: the two runs no longer train the same (bf16 noise is ~0.005)


def loss_agreement(a, b) -> dict:
    """How closely two runs' per-step losses agree: the largest and the mean gap, how far each fell, and the first
    step (from 1) whose gap exceeds LOSSES_APART (None: none does)."""
    n = min(len(a.losses), len(b.losses))
    gaps = [abs(x - y) for x, y in zip(a.losses[:n], b.losses[:n])]
    apart = next((i + 1 for i, g in enumerate(gaps) if g > LOSSES_APART), None)
    return dict(steps=n, max_gap=max(gaps) if gaps else float("nan"), apart_from=apart,
                mean_gap=statistics.fmean(gaps) if gaps else float("nan"),
                fall_a=a.losses[0] - a.losses[n - 1] if n else float("nan"),
                fall_b=b.losses[0] - b.losses[n - 1] if n else float("nan"))


def loss_table(runs: list) -> Table:
    """Each run's per-step losses against the source recipe's among `runs` (the first labelled "source"): the
    largest and the mean gap, the first step more than LOSSES_APART apart ("-": none), and how far each fell."""
    src = next((m for m in runs if m.label.startswith("source") and len(m.losses) > 2), None)
    table = []
    for m in runs:
        if src is None or m is src or len(m.losses) <= 2:
            continue
        a = loss_agreement(src, m)
        table.append([m.label, a["steps"], a["max_gap"], a["mean_gap"], a["apart_from"] or "-", a["fall_b"]])
    return Table([Column("against the source recipe's losses", short="recipe", wrap=True), Column("steps", fmt="d"),
                  Column("largest gap", short="largest\ngap", fmt=".4f"),
                  Column("mean gap", short="mean\ngap", fmt=".4f"),
                  Column(f"apart (> {LOSSES_APART}) from step", short="apart\nfrom", align="right"),
                  Column("loss fell by", short="fell\nby", fmt=".3f")], table,
                 title=f"the source recipe's loss fell by {src.losses[0] - src.losses[-1]:.3f}" if src else "")


# ---------------------------------------------------------------------------------------------
# shipped data: the GPU runs and the peers' figures
# ---------------------------------------------------------------------------------------------
def reference(model: str = "llama-3.1-8b", run: str = "") -> list:
    """The shipped GPU runs of scripts/gpu/beyond_recipe.py for `model` (empty when none ship): run="" is the
    20-step side-by-side run (source, lean, fast), run="explore" the one-change-at-a-time run, and
    run="plan-check" scripts/gpu/check_plan.py's run of the planner's picks, run="whole-steps" the source and the fast
    recipe again after build() kept to whole optimizer steps (beyond/checks/, 8 steps), run="peer-run" our recipes
    measured beside the peer in one run (they ship with the peer's runs, beyond/peers/ours-<model>.jsonl: apart
    from the runs the estimator and the planner are checked on, which they repeat)."""

    if run == "peer-run":
        return shipped_results("beyond/peers", f"ours-{model}.jsonl")
    if run in CHECKS:
        return shipped_results("beyond/checks", f"{run}-{model}.jsonl")
    return shipped_results("beyond", f"{run}-{model}.jsonl" if run else f"{model}.jsonl")


# runs that check one thing again, kept in beyond/checks/: apart from the runs the estimator's accuracy counts
CHECKS = ("whole-steps",)


def by_label(measurements: list) -> dict:
    """{label: measurement}."""
    return {m.label: m for m in measurements}


def batching(m) -> str:
    """A measurement's (or a recipe's) batching: "micro_batch x grad_accum", e.g. "16x1"."""
    if isinstance(m, Recipe):
        return f"{m.micro_batch}x{m.grad_accum}"
    return f"{m.recipe['micro_batch']}x{m.recipe['grad_accum']}"


def peer_reference(model: str = "llama-3.1-8b") -> list:
    """The shipped runs of the peers for `model` (reference/beyond/peers/<model>.jsonl; empty when none ship).
    A folder of its own: these are not the course's runs, which the estimator and the planner are checked on."""

    return shipped_results("beyond/peers", f"{model}.jsonl")


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
