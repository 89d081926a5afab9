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
    carries the checklist's state as Markdown and text (GitHub, nbviewer, a terminal show that)."""
    import ipywidgets as w

    from .hardware import HARDWARE
    from .static_copy import CopiedVBox
    from .tables import wrap

    boxes = [w.Checkbox(value=bool(follows(recipe)), description=item, indent=False,
                        layout=w.Layout(width="auto", max_width="100%")) for item, follows, _ in CHECKLIST]
    device = w.Dropdown(options=list(HARDWARE), value=hardware, description="hardware")
    out = w.HTML(layout=w.Layout(min_width="0", overflow="auto"))  # the report scrolls; the labels keep their width

    def current() -> Recipe:
        r = recipe
        for box, (_, follows, undo) in zip(boxes, CHECKLIST):
            if follows(r) and not box.value:
                r = undo(r)
        return r

    def update(_=None) -> None:
        out.value = "<pre>" + check_recipe(current(), device.value) + "</pre>"

    for control in boxes + [device]:
        control.observe(update, names="value")
    update()
    report = lambda: _check_report(current(), device.value)  # noqa: E731  (the state when displayed)
    return CopiedVBox([device, w.HBox([w.VBox(boxes, layout=w.Layout(flex="0 0 auto")), out])],
                      text=lambda: wrap(f"{_CHECKLIST_TITLE}:\n{report()}") + "\n",
                      markdown=lambda: checklist_markdown(report()))


_CHECKLIST_TITLE = "Memory checklist as it stood when this cell ran (run the cell in Jupyter or Colab to change it)"


def checklist_markdown(report: str) -> str:
    """check_recipe's report as Markdown: its first lines as text, its items as a table (ticked or not,
    the estimated peak without the item)."""
    import re

    from .static_copy import md_escape

    head, rows = [], []
    for line in report.splitlines():
        item = re.match(r"^\[(?P<mark>[x ])\] (?P<item>.+?)(?:\s+without it:\s+(?P<without>.+))?$", line)
        if item:
            mark, without = ("\u2611 yes" if item["mark"] == "x" else "\u2610 no"), item["without"] or "\u2013"
            rows.append(f"| {mark} | {md_escape(item['item'])} | {without} |")
        else:
            head.append(md_escape(line))
    return "\n".join([f"**{md_escape(_CHECKLIST_TITLE)}**", "", "  \n".join(head), "",
                      "| followed | checklist item | estimated peak without it |", "|:--|:--|--:|", *rows]) + "\n"
