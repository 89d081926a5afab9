"""Static copies of the widgets (course_utils.static_copy): the checklist's display bundle, the
cleaning script that keeps the copies and drops widget state, and a real kernel's notebook cleaned
and rendered with nbconvert (what nbviewer does). The quiz's copy is tested in test_quiz.py; the
committed notebooks' copies in test_notebooks_static.py."""

from __future__ import annotations

import html
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

from course_utils.chapter.quiz.bank import load_bank
from course_utils.chapter.quiz.static_copy import WIDGET_VIEW, md_escape
from quiz_drive import checklist_parts

ROOT = Path(__file__).resolve().parents[1]
CHECKLIST_CELL = ("from course_utils.chapter.complete_recipe import checklist_widget\n"
                  "from course_utils.recipe import source_chapter_recipe\n"
                  "checklist_widget(source_chapter_recipe('llama-3.1-8b'), hardware='t4')")


# --- the checklist's bundle ----------------------------------------------------------------------
def test_checklist_display_carries_its_state_as_markdown_and_text():
    """The checklist's bundle: the widget view and, for static views, its state when displayed."""
    from course_utils.chapter.complete_recipe import CHECKLIST, check_recipe, checklist_widget
    from course_utils.recipe import source_chapter_recipe

    chapter = source_chapter_recipe("llama-3.1-8b")
    widget = checklist_widget(chapter, hardware="t4")
    bundle = widget._repr_mimebundle_()
    assert bundle[WIDGET_VIEW]["model_id"] == widget.model_id
    assert bundle["text/plain"] == repr(widget) and check_recipe(chapter, "t4") in bundle["text/plain"]
    markdown = bundle["text/markdown"]
    for item, follows, _ in CHECKLIST:
        mark = "\u2611 yes" if follows(chapter) else "\u2610 no"
        assert f"| {mark} | {md_escape(item)} |" in markdown, item
    assert r"max\_seq\_length" in markdown  # escaped: an underscore would start emphasis

    device, boxes, _ = checklist_parts(widget)
    boxes[0].value = False  # untick "Use QLoRA"; a later display shows the state then
    device.value = "cpu"
    assert f"| \u2610 no | {md_escape(CHECKLIST[0][0])} | \u2013 |" in widget.markdown()
    assert "on CPU" in widget.markdown() and "[ ] Use QLoRA" in widget.text()


def test_checklist_live_report_is_a_table_that_fits_and_matches_the_static_copy():
    """The live report (issue 13): below the controls, across the output area, not beside the checkboxes;
    its items a table whose rows are the Markdown copy's, one line each; its statements text that wraps
    between words. A <pre> of 100-character lines beside the checkboxes wrapped mid-word at 1366 px."""
    import ipywidgets as w

    from course_utils.chapter.complete_recipe import _check_report, checklist_html, checklist_rows, checklist_widget
    from course_utils.recipe import source_chapter_recipe
    from quiz_drive import table_rows

    widget = checklist_widget(source_chapter_recipe("llama-3.1-8b"), hardware="t4")
    device, boxes, out = checklist_parts(widget)
    assert isinstance(out, w.HTML) and widget.children[-1] is out  # below the checkboxes, full width
    assert not any(isinstance(c, w.HBox) for c in widget.children)
    for untick, hw in ((None, "t4"), (0, "t4"), (1, "cpu"), (5, "t4")):
        if untick is not None:
            boxes[untick].value = False
        device.value = hw
        html_report = out.value
        assert "<pre" not in html_report and "white-space:nowrap" in html_report
        assert "word-break:normal" in html_report  # statements wrap at spaces
        report = _check_report(_current_recipe(widget), hw)
        assert html_report == checklist_html(report)
        head, rows = checklist_rows(report)
        # the same rows as the static copy's Markdown table
        md_rows = [[html.unescape(c.strip()).replace("\\", "") for c in line.strip("|").split("|")]
                   for line in widget.markdown().splitlines() if line.startswith("| ")]
        assert table_rows(html_report) == md_rows
        assert [list(r) for r in rows] == md_rows[1:]
        for line in head:
            assert html.escape(line) in html_report
        # one row, in monospace with the cells' padding, is far narrower than the ~118 characters that fit
        assert max(sum(len(c) for c in r) + 3 * len(r) for r in md_rows) <= 80


def _current_recipe(widget):
    """The recipe the checklist widget's checkboxes describe now (as its update does)."""
    from course_utils.chapter.complete_recipe import CHECKLIST
    from course_utils.recipe import source_chapter_recipe

    _, boxes, _ = checklist_parts(widget)
    r = source_chapter_recipe("llama-3.1-8b")
    for box, (_, follows, undo) in zip(boxes, CHECKLIST):
        if follows(r) and not box.value:
            r = undo(r)
    return r


def test_checklist_as_a_cells_last_expression_displays_once(ipython_shell):
    from IPython.utils.capture import capture_output

    shell = ipython_shell
    with capture_output() as cap:
        shell.run_cell(CHECKLIST_CELL, store_history=True)
    assert len(cap.outputs) == 1 and "Memory checklist" not in cap.stdout, "displayed once, not again as text"
    assert {"text/plain", "text/markdown", WIDGET_VIEW} <= set(cap.outputs[0].data)
    assert "[x] Use QLoRA" in cap.outputs[0].data["text/plain"]


# --- the cleaning script -------------------------------------------------------------------------
def _cleaner():
    spec = importlib.util.spec_from_file_location("write_notebooks", ROOT / "scripts" / "notebooks" / "write_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.clean_file = lambda path: mod.run("clean", [path])[1]  # the problems left in one notebook, cleaned in place
    return mod


def _display(data: dict) -> dict:
    return {"output_type": "display_data", "metadata": {}, "data": data}


def test_cleaning_removes_widget_state_only_and_is_idempotent(tmp_path):
    mod = _cleaner()
    assert mod.WIDGET_VIEW == WIDGET_VIEW
    view = {"model_id": "x", "version_major": 2, "version_minor": 0}
    quiz = _display({WIDGET_VIEW: view, "text/plain": "Quiz", "text/markdown": "**Quiz**\n1. a question"})
    html_copy = _display({WIDGET_VIEW: view, "text/plain": "Table", "text/html": "<table></table>"})
    bar = _display({WIDGET_VIEW: view, "text/plain": "ladder:   0%|          | 0/8 [00:00<?, ?recipe/s]"})
    text = {"output_type": "stream", "name": "stdout", "text": ["peak 8.20 GiB\n"]}
    plot = _display({"image/png": "iVBOR", "text/plain": "<Figure size 640x480 with 1 Axes>"})
    nb = {"cells": [{"cell_type": "code", "source": "", "metadata": {}, "execution_count": 1, "id": "a",
                     "outputs": [bar, text, quiz, html_copy, plot]},
                    {"cell_type": "markdown", "source": "text", "metadata": {}, "id": "b"}],
          "metadata": {"widgets": {"application/vnd.jupyter.widget-state+json": {"state": {}}}},
          "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(nb))
    assert mod.clean_file(path) == []
    once = path.read_text()
    cleaned = json.loads(once)
    assert "widgets" not in cleaned["metadata"]
    assert cleaned["cells"][0]["outputs"] == [  # the bar, whose only copy is its repr frozen at 0%, is gone
        text, _display({"text/plain": "Quiz", "text/markdown": "**Quiz**\n1. a question"}),
        _display({"text/plain": "Table", "text/html": "<table></table>"}), plot]
    assert cleaned["cells"][1] == nb["cells"][1]
    assert mod.clean_file(path) == [] and path.read_text() == once  # a second run changes nothing


def test_cleaning_reports_an_absolute_path_in_a_static_copy(tmp_path):
    mod = _cleaner()
    out = _display({WIDGET_VIEW: {"model_id": "x"}, "text/plain": "Quiz",
                    "text/markdown": "see /home/learner/course/quiz.yaml"})
    nb = {"cells": [{"cell_type": "code", "source": "", "metadata": {}, "outputs": [out]}], "metadata": {},
          "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(nb))
    (problem,) = mod.clean_file(path)
    assert "n.ipynb cell 0" in problem and "/home/learner/course/quiz.yaml" in problem


# --- end to end: a real kernel, the cleaning script, nbconvert -------------------------------------
def _explanations(q) -> list[str]:
    texts = [c.explanation for c in q.choices] + [q.explanation, q.hint] + [w.explanation for w in q.wrong_answers]
    return [t for t in texts if t]


def test_executed_notebook_renders_the_quiz_and_checklist_statically(tmp_path):
    """Run a quiz cell and a checklist cell in a real kernel, clean the notebook with
    scripts/notebooks/write_notebooks.py clean as the committed ones are, and render it with nbconvert (nbviewer's
    renderer): the questions, without their answers, and the checklist's items show."""
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    from course_utils.chapter.complete_recipe import CHECKLIST

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from course_utils.chapter.quiz.widget import show_quiz\nshow_quiz('05_qlora_4bit')"),
                nbformat.v4.new_code_cell(CHECKLIST_CELL)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    for cell in nb.cells:
        assert [o.output_type for o in cell.outputs] == ["display_data"], cell.outputs  # no execute_result duplicate
        assert {"text/plain", "text/markdown", WIDGET_VIEW} <= set(cell.outputs[0].data)
    path = tmp_path / "executed.ipynb"
    nbformat.write(nb, path)
    clean = subprocess.run([sys.executable, str(ROOT / "scripts" / "notebooks" / "write_notebooks.py"), "clean", str(path)],
                           capture_output=True, text=True)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    cleaned = nbformat.read(path, as_version=4)
    for cell in cleaned.cells:
        assert [sorted(o.data) for o in cell.outputs] == [["text/markdown", "text/plain"]]
    body, _ = HTMLExporter().from_notebook_node(cleaned)
    text = html.unescape(re.sub(r"<[^>]+>", "", body))
    for q in load_bank("05_qlora_4bit").questions:
        assert q.prompt.replace("`", "") in text.replace("`", "")
        for explanation in _explanations(q):
            assert explanation not in text
    for item, _, _ in CHECKLIST:
        assert re.search(rf"\u2611 yes\s*{re.escape(item)}", text), item  # the chapter's recipe follows every item
    assert "estimated peak" in text
