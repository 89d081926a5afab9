"""Reports on the estimate: the course's answer to the chapter's memory table, the recipes the estimator is
held to on the tiny model, and estimate against measurement.

Part of `course_utils.estimate` (its docstring says how the bytes are counted).
"""

from __future__ import annotations

from dataclasses import dataclass

from course_utils.common import GiB, MiB
from course_utils.estimate.peak import Estimate, estimate
from course_utils.estimate.shapes import model_shapes
from course_utils.estimate.terms import CATEGORIES
from course_utils.machine import Hardware
from course_utils.recipe import NOT_MEMORY_FIELDS, Recipe, ladder, same_setup, source_chapter_recipe  # noqa: F401
from course_utils.results import reference_results
from course_utils.show.tables import wrap

# ---------------------------------------------------------------------------------------------
# the course's answer to the chapter's "Expected Memory Usage" table
# ---------------------------------------------------------------------------------------------
TABLE_MODELS = (("7B", "llama-2-7b"), ("8B", "llama-3.1-8b"), ("13B", "llama-2-13b"), ("70B", "llama-3.1-70b"))
# The source chapter's "Expected Memory Usage" table, as printed (no 8B row).
CHAPTER_CLAIMS = {"7B": ("~14GB", "~4-6GB"), "13B": ("~26GB", "~8-10GB"), "70B": ("~140GB", "~40-48GB")}


def reference_for(recipe: Recipe, references: list | None = None):
    """The shipped GPU reference Measurement of this exact setup, or None."""

    refs = reference_results() if references is None else references
    return next((m for m in refs if m.fits and same_setup(m.recipe_obj, recipe)), None)


def without_optimization_recipe(model: str) -> Recipe:
    """'Without optimization', read honestly: a full fine-tune in bf16 with AdamW, no checkpointing, 1 x 16, seq 512."""
    return Recipe(model=model, lora_r=None, precision="bf16", gradient_checkpointing=False, micro_batch=1,
                  grad_accum=16, optimizer="adamw_torch", max_seq_length=512, label="full fine-tune, bf16, AdamW")


@dataclass(frozen=True)
class ExpectedCell:
    """One cell of the table: the chapter's claim, our estimate, our measurement if a reference run exists."""

    claim: str  # as the chapter prints it, or "" where it has no row
    estimate: Estimate
    measured: object = None  # a reference Measurement, or None

    @property
    def source(self) -> str:
        """'measured' or 'estimated': where our number comes from."""
        return "measured" if self.measured is not None else "estimated"

    @property
    def peak_bytes(self) -> int:
        """Our number: the measured peak where there is one, else the estimate."""
        return self.measured.peak_bytes if self.measured is not None else self.estimate.peak_bytes


@dataclass(frozen=True)
class ExpectedRow:
    """One model size: 'without optimization' and 'full optimization'."""

    size: str
    model: str
    without: ExpectedCell
    full: ExpectedCell


def expected_memory_table(hardware: str | Hardware = "gpu") -> list[ExpectedRow]:
    """Rows 7B, 8B, 13B, 70B: the chapter's claims beside our estimates and (where they exist) measurements."""

    refs = reference_results()
    rows = []
    for size, model in TABLE_MODELS:
        claims = CHAPTER_CLAIMS.get(size, ("", ""))
        cells = []
        for claim, recipe in zip(claims, (without_optimization_recipe(model), source_chapter_recipe(model))):
            cells.append(ExpectedCell(claim, estimate(recipe, hardware=hardware), reference_for(recipe, refs)))
        rows.append(ExpectedRow(size, model, *cells))
    return rows


def _gib(nbytes: float) -> str:
    """GiB with three significant figures: '8.15', '74.8', '657'."""
    v = nbytes / GiB
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _cell_text(cell: ExpectedCell) -> str:
    """'74.8 GiB measured (est. 74.8)' or '62.8 GiB estimated'."""
    text = f"{_gib(cell.peak_bytes):>5} GiB {cell.source}"
    return text + (f" (est. {_gib(cell.estimate.peak_bytes)})" if cell.measured is not None else "")


def format_expected_table(rows: list[ExpectedRow]) -> str:
    """The table as text, with what each column means and where the measurements come from."""
    lines = ["Peak memory of one training step, sequence 512, effective batch 16 (GiB = 2^30 bytes; the chapter's",
             "figures as it prints them). 'measured' = a shipped GPU reference run; 'estimated' =",
             "course_utils.estimate.",
             "",
             f"{'':<19}{'Without optimization (full FT)':<40}{'Full optimization (chapter recipe)':<40}",
             f"{'size model':<19}{'chapter':<9}{'ours':<31}{'chapter':<9}{'ours':<31}"]
    for r in rows:
        lines.append(f"{r.size:<4} {r.model:<14}{r.without.claim or '-':<9}{_cell_text(r.without):<31}"
                     f"{r.full.claim or '-':<9}{_cell_text(r.full)}")
    first = rows[0]
    shown = next((r for r in rows if r.without.measured is not None), first)  # a measured peak, where one ships
    params, shown_params = model_shapes(first.model).total_params, model_shapes(shown.model).total_params
    lines += ["",
              "Without optimization = without_optimization_recipe(model): a full fine-tune with bf16 weights,",
              "  gradients and AdamW states, no checkpointing, micro-batch 1 x 16. It peaks in the optimizer step",
              f"  at {shown.without.peak_bytes / shown_params:.1f} bytes per parameter ({shown.model}, "
              f"{shown.without.source}): 2 weights + 2 gradient +",
              "  2 x 2 AdamW + 2 for the step's sqrt(exp_avg_sq) = 10. Pure bf16 AdamW is a saving in itself, and",
              "  a lossy one (bf16 weights drop small updates). Standard mixed precision keeps fp32 master",
              "  weights, gradients and AdamW states: 4 + 4 + 2 x 4 = 16 bytes per parameter, "
              f"{16 * shown_params / GiB:.0f} GiB",
              f"  for {shown.model} before any activation.",
              f"The chapter's {first.without.claim} for {first.size} is the bf16 weights alone ({params / 1e9:.2f} "
              f"billion x 2 bytes = {2 * params / 1e9:.1f} GB).",
              "Full optimization = source_chapter_recipe(model): 4-bit NF4 + double quant, LoRA r=16 on q/k/v/o,",
              "  bf16, gradient checkpointing, 1 x 16, paged_adamw_8bit.",
              "Estimates assume a bf16 GPU with FlashAttention-2; they need no weights."]
    for r in rows:
        for name, c in (("without optimization", r.without), ("full optimization", r.full)):
            if c.measured is not None:
                m = c.measured
                lines.append(f"{r.model} {name}, measured on {m.env.get('device')} {m.date[:10]}: tensors "
                             f"{_gib(m.peak_bytes)}, allocated {_gib(m.cuda_max_allocated or 0)}, "
                             f"reserved {_gib(m.cuda_max_reserved or 0)} GiB")
                if name == "without optimization" and m.losses:
                    lines.append(f"  Its loss per step (random weights, learning rate {m.recipe['learning_rate']:g}): "
                                 + ", ".join(f"{x:.2f}" for x in m.losses))
    return wrap("\n".join(line.rstrip() for line in lines))  # at most 100 characters a line


# ---------------------------------------------------------------------------------------------
# the recipes the estimator is held to on the tiny model (tests and scripts/gpu/estimator_accuracy.py)
# ---------------------------------------------------------------------------------------------
def tiny_check_recipes() -> list[Recipe]:
    """The chapter's ladder on the tiny model in fp32, plus full fine-tunes, micro-batch 8, sequence 512 and NF4
    without double quant."""

    base = Recipe(learning_rate=1e-3, steps=3, warmup_steps=1)  # 1 warm-up, 1 tracked, 1 timed: bytes matter
    recipes: dict[str, Recipe] = {}
    for rung in ladder(base):  # on a CPU the mixed-precision rung is fp32: the same recipe as the rung before
        recipes.setdefault(rung.with_(precision="fp32").key, rung.with_(precision="fp32", label=rung.label))
    small = base.with_(micro_batch=2, max_seq_length=128)
    extras = [small.with_(lora_r=None, label="full fine-tune (2x1, seq 128)"),
              small.with_(lora_r=None, gradient_checkpointing=True, optimizer="adamw_8bit",
                          label="full fine-tune, ckpt, 8-bit AdamW"),
              base.with_(micro_batch=8, max_seq_length=128, label="micro-batch 8 (seq 128)"),
              base.with_(micro_batch=1, max_seq_length=512, label="sequence 512 (micro-batch 1)"),
              small.with_(load_in_4bit=True, double_quant=False, label="4-bit NF4 without double quant, no ckpt")]
    return list(recipes.values()) + extras


# ---------------------------------------------------------------------------------------------
# estimate against measurement
# ---------------------------------------------------------------------------------------------
SHORT_NAMES = {"parameters": "params", "gradients": "grads", "optimizer": "optim", "activations": "activ",
               "temporaries": "temps"}


def percent_error(est: float, got: float) -> str:
    """'+1.2%', or the difference in MiB ('+0.0M') when both are under 1 MiB."""
    if max(est, got) < MiB:
        return f"{(est - got) / MiB:+.1f}M"
    return f"{100 * (est - got) / got:+.1f}%" if got else "new"


def comparison_header(width: int = 56) -> str:
    """Column names and units of comparison_lines()."""
    cols = list(CATEGORIES) + ["peak"]
    return (f"{'run':<{width}}     " + "".join(f"{SHORT_NAMES.get(c, c):>10}" for c in cols)
            + f"\n{'':<{width}}     " + "".join(f"{'(MiB)':>10}" for _ in cols))


def comparison_lines(label: str, est: Estimate, m, width: int = 56) -> list[str]:
    """Three lines: estimate, measurement, error, per category and at the peak (MiB)."""
    cols = list(CATEGORIES) + ["peak"]
    want = {**est.by_category, "peak": est.peak_bytes}
    got = {**{c: m.peak_by_category.get(c, 0) for c in CATEGORIES}, "peak": m.peak_bytes}
    return [f"{label[:width]:<{width}} est " + "".join(f"{want[c] / MiB:10.1f}" for c in cols),
            f"{'':<{width}} meas" + "".join(f"{got[c] / MiB:10.1f}" for c in cols),
            f"{'':<{width}} err " + "".join(f"{percent_error(want[c], got[c]):>10}" for c in cols)]
