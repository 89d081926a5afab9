"""Notebook 07: the source chapter's memory checklist. check_recipe ticks its items for a recipe and says
what each is worth (the estimated peak with that item undone); checklist_widget lets a learner tick them
and watch the estimate move, and carries its state as Markdown and text for a static copy.
"""

from __future__ import annotations

from .recipe import Recipe

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
    from .tables import wrap

    return wrap(_check_report(recipe, hardware, budget_gib))


def _check_report(recipe: Recipe, hardware: str = "t4", budget_gib: float | None = None) -> str:
    """check_recipe's report, one line per item or statement (not wrapped: checklist_markdown reads it)."""
    from .estimate import estimate
    from .hardware import get_hardware

    hw = get_hardware(hardware)
    budget = budget_gib or hw.memory_gib
    note = []
    if recipe.precision == "bf16" and hw.auto_precision != "bf16":
        recipe = recipe.with_(precision="auto", label=recipe.label)
        note = [f"(bf16 is not native on {hw.name}: checked with precision='auto', i.e. {hw.auto_precision})"]
    peak = estimate(recipe, hardware=hw).peak_gib
    lines = note + [f"{recipe.model}: {recipe.describe()} on {hw.name}",
             f"estimated peak {peak:.2f} GiB" + (f" of {budget:.1f} GiB: {'fits' if peak <= budget else 'DOES NOT FIT'}"
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

    from .hardware import HARDWARE
    from .static_copy import CopiedVBox
    from .tables import wrap

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
    from .static_copy import md_escape

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
    import html

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
