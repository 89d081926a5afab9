"""Notebook 07 (notebooks/07_complete_recipe.ipynb, quizzes/07_complete_recipe.yaml): The complete recipe, and the chapter's numbers checked.

Notebook 07: the source chapter's memory checklist. check_recipe ticks its items for a recipe and says
what each is worth (the estimated peak with that item undone); checklist_widget lets a learner tick them
and watch the estimate move, and carries its state as Markdown and text for a static copy.
"""

from __future__ import annotations

import html
import re

from course_utils.chapter.shipped_runs import reference
from course_utils.chapter.exercises import (Exercise, REFERENCE_MODEL, Verdict, _at, _est, _first, _gib,
                                            _larger_fits, _largest, _need_line, _only, _same_steps, _t4_bytes,
                                            _t4_fits, _try_est)
from course_utils.common import GiB
from course_utils.estimate.peak import estimate
from course_utils.estimate.plan import MARGIN_FACTOR, MARGIN_GIB, fits_on_card, needed_bytes, short_name
from course_utils.machine import HARDWARE, get_hardware
from course_utils.recipe import Recipe, source_chapter_recipe
from course_utils.results import Measurement
from course_utils.show.report import _joined, dated, not_measured
from course_utils.show.speeds import speed_words
from course_utils.show.tables import Column, Table, common_parts, wrap

# The source chapter's memory checklist: each item, whether a recipe follows it, and how to undo it.
CHECKLIST: tuple[tuple[str, object, object], ...] = (
    ("Use QLoRA (4-bit quantization)", lambda r: r.load_in_4bit, lambda r: r.with_(load_in_4bit=False)),
    ("Enable gradient checkpointing", lambda r: r.gradient_checkpointing,
     lambda r: r.with_(gradient_checkpointing=False)),
    ("Use gradient accumulation", lambda r: r.grad_accum > 1,
     lambda r: r.with_(micro_batch=r.effective_batch, grad_accum=1)),
    ("Use 8-bit or paged optimizer", lambda r: "8bit" in r.optimizer, lambda r: r.with_(optimizer="adamw_torch")),
    ("Use bfloat16 precision", lambda r: r.precision in ("bf16", "fp16", "auto"), lambda r: r.with_(precision="fp32")),
    ("Reduce max_seq_length if possible", lambda r: r.max_seq_length <= 512,
     lambda r: r.with_(max_seq_length=2 * r.max_seq_length)),
    ("Use smaller batch sizes", lambda r: r.micro_batch <= 2, lambda r: r.with_(micro_batch=4 * r.micro_batch)),
)


def check_recipe(recipe: Recipe, hardware: str = "t4", budget_gib: float | None = None) -> str:
    """Notebook 07: the chapter's checklist applied to a recipe: each item ticked or not, and what the estimator
    says it is worth here (the estimated peak with that item undone), against a memory budget. Lines are
    at most 100 characters."""

    return wrap(_check_report(recipe, hardware, budget_gib))


def _check_report(recipe: Recipe, hardware: str = "t4", budget_gib: float | None = None) -> str:
    """check_recipe's report, one line per item or statement (not wrapped: checklist_markdown reads it)."""

    hw = get_hardware(hardware)
    budget = budget_gib or hw.memory_gib
    note = []
    if recipe.precision == "bf16" and hw.auto_precision != "bf16":
        recipe = recipe.with_(precision="auto", label=recipe.label)
        note = [f"(bf16 is not native on {hw.name}: checked with precision='auto', i.e. {hw.auto_precision})"]
    peak = estimate(recipe, hardware=hw).peak_gib
    lines = note + [f"{recipe.model}: {recipe.describe()} on {hw.name}",
             f"estimated peak {peak:.2f} GiB" + (f" of {budget:.2f} GiB: {'fits' if peak <= budget else 'DOES NOT FIT'}"
                                                 if budget else "")]
    for item, follows, undo in CHECKLIST:
        if follows(recipe):
            without = estimate(undo(recipe), hardware=hw).peak_gib
            lines.append(f"[x] {item:36} without it: {without:6.2f} GiB ({without - peak:+.2f})")
        else:
            lines.append(f"[ ] {item}")
    return "\n".join(lines)


def checklist_widget(recipe: Recipe, hardware: str = "t4"):
    """Notebook 07: tick the checklist's items and see the estimated peak change (ipywidgets). Its display also
    carries the checklist's state as Markdown and text (GitHub, nbviewer, a terminal show that).

    The controls (hardware, one checkbox per item) come first and the report below them, across the output
    area's width, as HTML: its statements as text that wraps between words, its items as a table like the
    static copy's (checklist_html). Beside the checkboxes, a <pre> of the report had about 85 characters at
    1366 px with JupyterLab's file browser open, and wrapped its 100-character lines mid-word."""
    import ipywidgets as w

    from course_utils.chapter.quiz.static_copy import CopiedVBox

    boxes = [w.Checkbox(value=bool(follows(recipe)), description=item, indent=False,
                        layout=w.Layout(width="auto", max_width="100%")) for item, follows, _ in CHECKLIST]
    device = w.Dropdown(options=list(HARDWARE), value=hardware, description="hardware")
    out = w.HTML(layout=w.Layout(overflow="auto"))  # as wide as the output area; narrower, the table scrolls
    out.add_class("course-checklist-output")

    def current() -> Recipe:
        r = recipe
        for box, (_, follows, undo) in zip(boxes, CHECKLIST):
            if follows(r) and not box.value:
                r = undo(r)
        return r

    def update(_=None) -> None:
        out.value = checklist_html(_check_report(current(), device.value))

    for control in boxes + [device]:
        control.observe(update, names="value")
    update()
    report = lambda: _check_report(current(), device.value)  # noqa: E731  (the state when displayed)
    widget = CopiedVBox([device, w.VBox(boxes, layout=w.Layout(margin="4px 0")), out],
                        text=lambda: wrap(f"{_CHECKLIST_TITLE}:\n{report()}") + "\n",
                        markdown=lambda: checklist_markdown(report()))
    widget.add_class("course-checklist")
    return widget


_CHECKLIST_TITLE = "Memory checklist as it stood when this cell ran (run the cell in Jupyter or Colab to change it)"


# the table's columns (Markdown and HTML): header, alignment
_COLUMNS = (("followed", "left"), ("checklist item", "left"), ("estimated peak without it", "right"))


def checklist_rows(report: str) -> tuple[list[str], list[tuple[str, str, str]]]:
    """check_recipe's report (unwrapped, as _check_report gives it) split into its statements (the lines
    before the items) and one row per item: (followed, item, estimated peak without it)."""
    import re

    head, rows = [], []
    for line in report.splitlines():
        item = re.match(r"^\[(?P<mark>[x ])\] (?P<item>.+?)(?:\s+without it:\s+(?P<without>.+))?$", line)
        if item:
            mark = "\u2611 yes" if item["mark"] == "x" else "\u2610 no"
            rows.append((mark, item["item"], item["without"] or "\u2013"))
        else:
            head.append(line)
    return head, rows


def checklist_markdown(report: str) -> str:
    """check_recipe's report as Markdown: its first lines as text, its items as a table (ticked or not,
    the estimated peak without the item)."""
    from course_utils.chapter.quiz.static_copy import md_escape

    head, rows = checklist_rows(report)
    align = {"left": ":--", "right": "--:"}
    return "\n".join([f"**{md_escape(_CHECKLIST_TITLE)}**", "", "  \n".join(md_escape(h) for h in head), "",
                      "| " + " | ".join(name for name, _ in _COLUMNS) + " |",
                      "|" + "|".join(align[a] for _, a in _COLUMNS) + "|",
                      *(f"| {mark} | {md_escape(item)} | {without} |" for mark, item, without in rows)]) + "\n"


_FITS_COLOR = {True: "#1a7f37", False: "#cf222e"}  # the quiz's green and red


def checklist_html(report: str) -> str:
    """check_recipe's report as the live widget shows it: its statements as text that wraps between words (the
    verdict in bold, green when the recipe fits, red when not), its items as the table the Markdown copy has,
    one line per row (no cell wraps; the widest, the item, is 33 characters)."""
    head, rows = checklist_rows(report)
    lines = []
    for line in head:
        style = ""
        if line.startswith("estimated peak") and line.endswith(("fits", "DOES NOT FIT")):
            style = f' style="font-weight:bold;color:{_FITS_COLOR[not line.endswith("DOES NOT FIT")]}"'
        lines.append(f"<div{style}>{html.escape(line)}</div>")
    cell = "padding:2px 12px 2px 0;white-space:nowrap;border-bottom:1px solid var(--jp-border-color2, #d0d7de)"
    th = "".join(f'<th style="{cell};text-align:{a}">{html.escape(name)}</th>' for name, a in _COLUMNS)
    body = "".join("<tr>" + "".join(f'<td style="{cell};text-align:{a}">{html.escape(v)}</td>'
                                    for v, (_, a) in zip(row, _COLUMNS)) + "</tr>" for row in rows)
    return ('<div class="course-checklist-report" style="line-height:1.5;white-space:normal;word-break:normal;'
            'overflow-wrap:normal">' + "".join(lines)
            + '<table class="course-checklist-table" style="border-collapse:collapse;margin-top:6px;'
            f'font-variant-numeric:tabular-nums"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>')


# --- 07: the largest micro-batch of the chapter's recipe on a free T4 ------------------------------------
def _fig_07(start: Recipe, hw: str) -> dict:
    e = _est(start.with_(precision="auto"), hw)
    need = float(_gib(e.peak_bytes)) * MARGIN_FACTOR + MARGIN_GIB
    return {"recipe": start.describe(), "n": start.effective_batch, "seq": start.max_seq_length,
            "mb": start.micro_batch, "acc": start.grad_accum, "peak": _gib(e.peak_bytes), "factor": MARGIN_FACTOR,
            "margin": MARGIN_GIB, "need": f"{need:.2f}", "t4": _gib(_t4_bytes())}


def _check_07(answer: Recipe, start: Recipe, hw: str) -> Verdict:
    refused = _first(_only(answer, start, {"micro_batch", "grad_accum", "precision"}), _same_steps(answer, start))
    if refused is not None:
        return refused
    e, why = _try_est(answer, hw)
    if e is None:
        return Verdict(False, "the estimator refuses this recipe on a T4: precision='auto' is fp16 there", (why,))
    line = f"micro-batch {answer.micro_batch} x {answer.grad_accum}: {_need_line(e, _t4_bytes())}"
    if needed_bytes(e) > _t4_bytes():
        return Verdict(False, "it does not fit a T4: a smaller micro-batch", (line,))
    larger = _larger_fits(answer, _t4_fits)
    if larger:
        return Verdict(False, f"it fits, but micro-batch {larger} fits a T4 too",
                       (line, _need_line(_est(_at(answer, larger), hw), _t4_bytes())))
    return Verdict(True, "the largest micro-batch that fits a free T4 at the same sequences per step", (line,))


def _solve_07(start: Recipe, hw: str) -> Recipe:
    return _largest(start.with_(precision="auto"), _t4_fits)
_T07 = ("The chapter's recipe (`chapter`: {recipe}) trains {n} sequences of {seq} tokens per optimizer step as "
        "{mb} x {acc}. On a free T4, where `precision=\"auto\"` is fp16, it is estimated at {peak} GiB and needs "
        "{peak} x {factor} + {margin} = {need} GiB by the planner's rule, of the card's {t4} GiB. A bigger "
        "micro-batch with less accumulation trains the same thing faster: find the **largest micro-batch** that "
        "still fits a T4 at the same {n} sequences per step. Change only `per_device_train_batch_size`, "
        "`gradient_accumulation_steps` and the precision flags (`bf16`, `fp16`).")


def closing_07(first: Measurement, last: Measurement, reference, model: str) -> str:
    """Notebook 07: the plain LoRA baseline against the chapter's full recipe here, and the chapter's
    recipe at micro-batch 1 and 16 on the reference GPU (`reference`: every shipped 8B point)."""
    skip = not_measured(first, last)  # on a T4, an 8B model's fp32 rungs do not fit
    here = skip or (
        f"On {first.env['device']} ({model}): from the plain LoRA baseline to the chapter's full recipe the peak "
        f"went {first.mib('peak'):.1f} -> {last.mib('peak'):.1f} MiB ({last.peak_bytes / first.peak_bytes - 1:+.0%}) "
        f"and the {speed_words(first, last)}.")
    here = here if skip else dated(here, first, last)  # figures read back from the store say so, with their date
    ref = {m.label: m for m in reference}
    src, fast = ref["source chapter recipe (QLoRA 1x16)"], ref["QLoRA 16x1"]
    return _joined(here, f"Reference, Llama-3.1-8B on an H200: the chapter's recipe peaks at {src.peak_gib:.2f} "
                   f"GiB ({src.cuda_max_reserved / GiB:.2f} GiB reserved) at {src.tokens_per_s:,.0f} tokens/s; "
                   f"the same recipe at micro-batch 16 uses {fast.peak_gib:.1f} GiB "
                   f"({fast.cuda_max_reserved / GiB:.2f} GiB reserved) at {fast.tokens_per_s:,.0f} tokens/s, "
                   f"{fast.tokens_per_s / src.tokens_per_s:.1f}x faster.")


def checks_table(model: str = "llama-3.1-8b", run: str = "plan-check-fused") -> Table:
    """scripts/gpu/check_plan.py's GPU run, as shipped, as a Table: each budget's pick measured beside the source
    recipe of the same run (fits = reserved + the CUDA context share of the margin within the budget). run: the
    newest check, of the planner's picks since fused LoRA's factor was measured ("plan-check": the first, on the H200)."""

    columns = [Column("budget", "GiB", ".1f"), Column("recipe", wrap=True), Column("estimate", "GiB", ".2f", short="est."),
               Column("allocated", "GiB", ".2f", short="alloc"), Column("reserved", "GiB", ".2f", short="rsrvd"),
               Column("tokens/s", fmt=",.0f"), Column("verdict")]
    runs = reference(model, run=run)
    if not runs:
        return Table(columns, [], title=f"no planner check ships for {model}")
    source = next(m for m in runs if m.label.startswith("source"))
    pairs = []
    by_budget: dict[float, list] = {}
    for m in runs:
        if m is not source:
            by_budget.setdefault(float(re.search(r"([\d.]+) GiB", m.label).group(1)), []).append(m)
    for budget, picks in by_budget.items():  # each budget's pick (and the pick without a change), then the source
        for r in (*picks, source):
            verdict = ("fits" if fits_on_card(r.cuda_max_reserved, budget * GiB) else "does not fit") + (
                f", {r.tokens_per_s / source.tokens_per_s:.1f}x the source recipe" if r is not source else ", source recipe")
            pairs.append((budget, r, verdict))
    shared, names = common_parts([short_name(r.recipe_obj) for _, r, _ in pairs])
    rows = [(budget, name, estimate(r.recipe_obj).peak_gib, r.cuda_max_allocated / GiB, r.cuda_max_reserved / GiB,
             r.tokens_per_s, verdict) for (budget, r, verdict), name in zip(pairs, names)]
    env = source.env
    note = (f"Measured on {env['device']} ({source.date[:10]}, torch {env['versions']['torch']}), in one run: "
            f"`{source.command}`.")
    title = f"Every recipe below: {', '.join(shared)}; the recipe column lists the rest." if shared else ""
    return Table(columns, rows, title=title, notes=[note])


def shipped_checks(model: str = "llama-3.1-8b") -> str:
    """checks_table as text (at most 100 characters a line)."""
    return str(checks_table(model))


# The notebook's exercise (course_utils.chapter.exercises shows and checks it)
EXERCISE = Exercise("07_complete_recipe", "use the room the chapter leaves on a T4", _T07, _fig_07, _check_07,
             _solve_07, "precision='auto', then every micro-batch that divides the effective batch estimated, "
                          "the largest that fits kept", hardware="t4", start_code="chapter",
             start=lambda base: source_chapter_recipe(REFERENCE_MODEL))
