"""Notebook 11 (notebooks/11_more_than_one_gpu.ipynb, quizzes/11_more_than_one_gpu.yaml): More than one GPU: DDP and FSDP-QLoRA.

The check behind notebook 11_more_than_one_gpu's exercise (course_utils.exercises): the smallest number of
24 GiB GPUs on which FSDP-QLoRA of the Llama-3.1-70B architecture, with the published recipe (peft's FSDP-QLoRA
example, estimate.anchor_recipe), fits per GPU by the planner's rule, without CPU offload. The answer is a GPU
count, decided by estimate_distributed; the exercise's figures come from it and from the budget text.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from course_utils import distributed
from course_utils.chapter.every_notebook import choose_model
from course_utils.chapter.exercises import Exercise, Verdict
from course_utils.common import GiB, MiB
from course_utils.distributed import config_file
from course_utils.estimate.distributed import anchor_lines, anchor_recipe, estimate_distributed
from course_utils.estimate.plan import MARGIN_FACTOR, MARGIN_GIB, needed_bytes
from course_utils.estimate.planner import parse_gpu_budget
from course_utils.measure import measure
from course_utils.recipe import Recipe, gpu_recipe, source_chapter_recipe  # noqa: F401 (gpu_recipe: notebook 11)
from course_utils.show.tables import Column, Table, wrap

MODEL = "llama-3.1-70b"
CARDS = "2 x 24 GiB"  # the learner's pair of cards (RTX 3090/4090); the exercise asks how many such cards
MAX_GPUS = 64


def card_bytes() -> int:
    """One card's memory, read from CARDS as the planner reads a budget."""

    return parse_gpu_budget(CARDS)[1]


def start_recipe(base: Recipe | None = None) -> Recipe:
    """The exercise's recipe: the anchor's settings on the Llama-3.1-70B preset (whatever the notebook's base)."""

    return anchor_recipe(MODEL)


@functools.lru_cache(maxsize=128)
def _est(recipe: Recipe, gpus: int, hw: str):

    return estimate_distributed(recipe, gpus, "fsdp", hardware=hw)


def _need_line(recipe: Recipe, gpus: int, hw: str) -> str:
    e = _est(recipe, gpus, hw)
    need, card = needed_bytes(e), card_bytes()
    return (f"{gpus} GPUs: estimated {e.per_gpu_gib:.2f} GiB per GPU x {MARGIN_FACTOR} + {MARGIN_GIB} = "
            f"{need / GiB:.2f} GiB needed, {'within' if need <= card else 'over'} {card / GiB:g} GiB")


def _fits(recipe: Recipe, gpus: int, hw: str) -> bool:
    return needed_bytes(_est(recipe, gpus, hw)) <= card_bytes()


def figures(start: Recipe, hw: str) -> dict:
    e = _est(start, 2, hw)
    need = float(f"{e.per_gpu_gib:.2f}") * MARGIN_FACTOR + MARGIN_GIB
    return {"recipe": start.describe(), "two": f"{e.per_gpu_gib:.2f}", "factor": MARGIN_FACTOR, "margin": MARGIN_GIB,
            "need": f"{need:.2f}", "card": f"{card_bytes() / GiB:g}"}


def check(answer, start: Recipe, hw: str) -> Verdict:
    if isinstance(answer, bool) or not isinstance(answer, int) or answer < 1:
        return Verdict(False, f"the answer is a number of GPUs, a whole number of 1 or more (yours: {answer!r})")
    if answer > MAX_GPUS:
        return Verdict(False, f"{answer} GPUs is more than this exercise looks at ({MAX_GPUS}): try fewer")
    lines = [_need_line(start, answer, hw)] + ([_need_line(start, answer - 1, hw)] if answer > 1 else [])
    if not _fits(start, answer, hw):
        return Verdict(False, f"on {answer} GPUs it does not fit one card yet", tuple(lines))
    if answer > 1 and _fits(start, answer - 1, hw):
        return Verdict(False, f"it fits on {answer} GPUs, and on {answer - 1} too: find the smallest",
                       tuple(lines))
    return Verdict(True, f"{answer} GPUs is the smallest count on which each card holds its share", tuple(lines))


def solve(start: Recipe, hw: str) -> int:
    for n in range(1, MAX_GPUS + 1):
        if _fits(start, n, hw):
            return n
    raise ValueError(f"{start.describe()} does not fit {CARDS} cards on {MAX_GPUS} GPUs")
_T09 = ("The published FSDP-QLoRA recipe (`anchor_recipe()`, peft's example: {recipe}) on the Llama-3.1-70B "
        "architecture is estimated at {two} GiB per GPU on two bf16 GPUs under FSDP, and needs {two} x {factor} + "
        "{margin} = {need} GiB by the planner's rule: more than a {card} GiB card. FSDP divides the weights, "
        "gradients and optimizer state by the number of GPUs; the gathered units and the activations stay whole. "
        "Find the **smallest number of {card} GiB GPUs** on which it fits, without CPU offload "
        "(`estimate_distributed(anchor_recipe(), gpus, \"fsdp\")` is the estimate). Your answer is the accelerate "
        "config's `num_processes`.")

NOTEBOOK = "11_more_than_one_gpu"
GPUS = 2  # the notebook's runs: two processes (two GPUs, or two gloo CPU processes)
PAIRS = (("2 x 15 GiB", "t4", "Kaggle's free 2 x T4"), ("2 x 24 GiB", "gpu", "two 24 GB cards (RTX 3090/4090)"))
NEEDS_TWO = (f"This machine has one GPU: the runs of this notebook need {GPUS} (Kaggle's free 2 x T4 has them). "
             "The estimates below need none; the runs are skipped.")


@dataclass(frozen=True)
class RunPath:
    """Where notebook 11 runs: the model, the processes that train together, and on what."""

    model: str
    gpus: int  # 0: no run here (one GPU)
    device: str  # "cpu" (gloo processes) or "cuda"
    recipe: Recipe | None

    def __str__(self) -> str:
        if not self.gpus:
            return wrap(NEEDS_TWO)
        where = "GPUs (NCCL)" if self.device == "cuda" else "CPU processes (gloo; no GPU here)"
        return wrap(f"model: {self.model}; {self.gpus} {where}\nper-GPU recipe: {self.recipe.describe()}, "
                    f"{self.recipe.steps} steps ({self.recipe.warmup_steps} warm-up)")


def multi_gpu_path(use_llama_8b: bool = False) -> RunPath:
    """Notebook 11's path: on a CPU the embedded tiny model on two gloo processes, a short run (CI); on a machine
    with two GPUs or more the notebook's model (choose_model) on two of them, QLoRA for Llama-3.1-8B; on one
    GPU no run (the estimates only)."""

    have = distributed.visible_gpus()
    model = choose_model(use_llama_8b)
    if have == 1:
        return RunPath(model, 0, "cuda", None)
    if have == 0:
        recipe = Recipe(model=model, micro_batch=2, max_seq_length=64, steps=3, warmup_steps=1, lora_dropout=0.0,
                        learning_rate=1e-3, label="per-GPU recipe")
        return RunPath(model, GPUS, "cpu", recipe)
    return RunPath(model, GPUS, "cuda", gpu_recipe(model, four_bit=use_llama_8b))


def run_both(path: RunPath, store=None):
    """(one process, `path.gpus` processes under DDP) on the same per-GPU recipe, or (None, None) without a run.
    On a CPU the one-process run trains in this kernel (the same bytes, no process start)."""

    if not path.gpus:
        return None, None
    one = measure(path.recipe.with_(label="1 process"), store=store, isolate=None if path.device == "cpu" else True)
    many = distributed.launch(path.recipe.with_(label=f"{path.gpus} processes, DDP"), gpus=path.gpus, strategy="ddp",
                  store=store, timeout_s=600)
    return one, many


def _mem(n: float | None) -> str:
    """Bytes as MiB under a GiB, else GiB."""
    if n is None:
        return "-"
    return f"{n / MiB:,.1f} MiB" if n < GiB else f"{n / GiB:,.2f} GiB"


def side_by_side(one, many) -> str:
    """The one-process run beside the multi-process one: per-GPU peak, global tokens/s, the scaling, arithmetic
    shown."""
    if many is None:
        return wrap(NEEDS_TWO)
    n = many.gpus
    lines = [f"1 process: peak {_mem(one.peak_bytes)}, {one.tokens_per_s:,.0f} tokens/s "
             f"({one.recipe_obj.tokens_per_step:,} tokens a step)."]
    for r in many.per_rank:
        lines.append(f"{n} processes, rank {r['rank']}: peak {_mem(r['peak_bytes'])}, {r['tokens']:,} tokens, "
                     f"{r['tokens_per_s']:,.0f} tokens/s of its own.")
    lines.append(f"{n} processes together: {n} x {one.recipe_obj.tokens_per_step:,} = "
                 f"{n * one.recipe_obj.tokens_per_step:,} tokens a step, {many.tokens_per_s:,.0f} tokens/s global: "
                 f"{many.tokens_per_s:,.0f} / {one.tokens_per_s:,.0f} = x{many.tokens_per_s / one.tokens_per_s:.2f} "
                 f"of one process (x{n} would be perfect scaling).")
    lines.append(f"Per-GPU peak: {_mem(many.peak_bytes)} (the largest rank) against {_mem(one.peak_bytes)} in one "
                 f"process: {many.peak_bytes / one.peak_bytes:.3f} times; DDP does not divide the model.")
    if many.env.get("device_type") == "cpu":
        lines.append(f"On this CPU ({many.env['device']}) the {n} processes share its cores, so the speed here says "
                     "little about two GPUs; the memory does.")
    return wrap("\n".join(lines))


def different_data(many) -> str:
    """The check that the ranks saw different data: each rank's first batch (a hash of its token ids)."""
    if many is None:
        return wrap(NEEDS_TWO)
    hashes = [r["first_batch"] for r in many.per_rank]
    verdict = "all different" if len(set(hashes)) == len(hashes) else "NOT all different"
    return wrap(f"First batch of each rank (a hash of its token ids): {', '.join(hashes)}: {verdict}. The "
                "distributed sampler gives each rank its own share of the shuffled data; DDP then averages their "
                "gradients, so every copy takes the same step (tests/test_distributed.py checks that the average "
                "is the gradient of the whole batch).")


def per_gpu_estimates(model: str = "llama-3.1-8b") -> Table:
    """The source chapter's QLoRA recipe and a 16-bit LoRA on `model`, on one GPU, on two under DDP and under
    FSDP, per GPU, against learners' pairs of cards with the planner's margin."""

    chapter = source_chapter_recipe(model).with_(precision="auto", label="QLoRA (the chapter's recipe)")
    lora16 = chapter.with_(load_in_4bit=False, label="LoRA on 16-bit weights")
    rows = []
    for budget, hw, name in PAIRS:
        gpus, per_gpu = parse_gpu_budget(budget)
        for recipe in (chapter, lora16):
            for strategy, n in (("one GPU", 1), ("DDP", gpus), ("FSDP", gpus)):
                e = estimate_distributed(recipe, n, "fsdp" if strategy == "FSDP" else "ddp", hardware=hw)
                need = needed_bytes(e)
                rows.append((f"{budget} ({hw})", recipe.label, strategy, e.per_gpu_bytes / GiB, need / GiB,
                             "fits" if need <= per_gpu else "does not fit"))
    columns = [Column("cards"), Column("recipe", wrap=True), Column("on"), Column("est./GPU", "GiB", ".2f"),
               Column("needed", "GiB", ".2f"), Column("verdict")]
    return Table(columns, rows, title=wrap(f"{model}, sequence {chapter.max_seq_length}, {chapter.micro_batch} x "
                                            f"{chapter.grad_accum} per GPU; needed = estimate x margin (the planner's "
                                            "rule, course plan); fits when needed <= one card's memory."))


def fsdp_arithmetic(model: str = "llama-3.1-8b", hardware: str = "gpu") -> str:
    """The FSDP estimate's terms divided among the GPUs, with their division written out, and what is whole on
    every GPU, for 16-bit LoRA on two GPUs."""

    r = source_chapter_recipe(model).with_(precision="auto", load_in_4bit=False)
    e = estimate_distributed(r, GPUS, "fsdp", hardware=hardware)
    one = estimate_distributed(r, 1, "fsdp", hardware=hardware)
    sharded = e.sharded_terms
    lines = [f"LoRA on 16-bit {model} ({hardware}), FSDP on {GPUS} GPUs: the terms divided among them",
             *(f"  {t.name}: {t.arithmetic} = {_mem(t.nbytes)}" for t in sharded if t.nbytes >= MiB),
             "whole on every GPU (the gathered units, activations, temporaries):",
             *(f"  {t.name}: {_mem(t.nbytes)}" for t in e.terms if t not in sharded and t.nbytes >= 64 * MiB),
             f"per GPU {_mem(e.per_gpu_bytes)}, against {_mem(one.per_gpu_bytes)} on one GPU (the peak is "
             f"{e.moment})."]
    return wrap("\n".join(lines))


def anchor_text() -> str:
    """The published 70B FSDP-QLoRA figure beside the estimator's (estimate.anchor_lines)."""

    return wrap("\n".join(anchor_lines()))


def closing_09(one, many, path: RunPath) -> str:
    """What we measured, in this notebook's run (or why there was none), and what the estimates said."""

    r = source_chapter_recipe("llama-3.1-8b").with_(precision="auto", load_in_4bit=False)
    ddp, fsdp = (estimate_distributed(r, GPUS, s, hardware="gpu") for s in ("ddp", "fsdp"))
    lines = []
    if many is not None:
        lines.append(f"On {many.env['device']} ({path.model}): {many.gpus} processes under DDP trained "
                     f"{many.gpus} x the tokens of one process per step at x{many.tokens_per_s / one.tokens_per_s:.2f} "
                     f"its speed, each holding {_mem(many.peak_bytes)} at its peak against {_mem(one.peak_bytes)} "
                     "alone; the ranks' first batches differed.")
    else:
        lines.append(NEEDS_TWO)
    lines.append(f"Estimated, LoRA on 16-bit Llama-3.1-8B on two bf16 GPUs: DDP {_mem(ddp.per_gpu_bytes)} per GPU "
                 f"(the whole model on each), FSDP {_mem(fsdp.per_gpu_bytes)} (weights divided, one unit gathered "
                 "at a time).")
    return wrap("\n".join(lines))


def fsdp_settings() -> str:
    """The FSDP settings of the shipped config (accelerate_configs/fsdp_qlora.yaml), without its comments."""
    import yaml


    settings = yaml.safe_load(config_file("fsdp").read_text())["fsdp_config"]
    return "\n".join(f"{key}: {value}" for key, value in settings.items())


# The notebook's exercise (course_utils.chapter.exercises shows and checks it)
EXERCISE = Exercise("11_more_than_one_gpu", "how many cards a 70B model needs", _T09, figures, check, solve,
             "the FSDP estimate per GPU for one GPU, then one more at a time, the first count that fits kept",
             hardware="gpu",
             start_code="anchor_recipe()", start=start_recipe, answer_kind="gpus",
             setup="from course_utils.estimate import anchor_recipe\n\nanchor = anchor_recipe()", base_name="anchor")

# The "In your own script" cells of the notebook (kind, the rung they write, the rung they are compared with, the cell
# they follow, what the markdown above them says): `scripts/notebooks/write_notebooks.py own-script` writes them.
OWN_SCRIPT = ("multi", "per-GPU recipe", None, "09-18",
              "The per-GPU recipe of the run above, Llama-3.1-8B in 4-bit; every process runs this "
              "script, started by `accelerate launch`.")
