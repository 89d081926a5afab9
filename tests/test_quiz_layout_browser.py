"""The quiz's layout in a real browser (JupyterLab 4, Debian's Chromium, Playwright; tests/jupyterlab_browser.py):

- every bank's longest choice, in one quiz at the learner's 1366-px width: each choice wraps inside its
  own row (no two choice rows overlap; each row's text, and its radio button or checkbox, stays inside it);
- the instruction line, "(choose one)" and the score note read in the light and the dark theme (a
  contrast ratio of at least 4.5:1 against the page behind them, WCAG AA for normal text);
- the kernel runs the lowest ipywidgets the `lab` extra allows (pyproject.toml; installed into the
  git-ignored .ipywidgets8/ from tests/ipywidgets8.txt, as .ipywidgets7/ is for Colab's 7.7), so the quiz
  is shown to render with the oldest widgets a local JupyterLab 4 install can pair with it.

ipywidgets 7.7 cannot be drawn in JupyterLab 4 (its front end registers only the 8.x widget models), and
the pins keep that pair apart (tests/test_colab_pins.py); the wrap style names the class names 7.7's
front end uses too (`.widget-radio-box`, `.widget-checkbox`), and tests/test_quiz_ipywidgets7.py drives the
quiz under 7.7 in Python. Screenshots: test-artifacts/quiz_longest_light.png and quiz_longest_dark.png.
Heavy (a JupyterLab server and Chromium on 2 cores, about a minute): run it when the quiz's layout changes.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from jupyterlab_browser import (  # noqa: F401  (the fixture `browser` is used by name)
    CHROMIUM, ROOT, Lab, assert_no_error_output, browser, notebook_page, run_all, shot)

from course_utils.chapter.quiz.bank import all_banks

IPYWIDGETS8 = ROOT / ".ipywidgets8"
INSTALL = "python -m pip install -q --no-deps --target .ipywidgets8 -r tests/ipywidgets8.txt"
KERNEL = "python3-lowest-ipywidgets"
NOTEBOOK = "longest_choices.ipynb"
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's Chromium at /usr/bin/chromium (apt-get update && apt-get install -y chromium; .ci/run does)",
)


def lowest_lab_ipywidgets() -> str:
    """The version tests/ipywidgets8.txt installs (tests/test_colab_pins.py checks it is the `lab` extra's floor)."""
    lines = [ln.strip() for ln in (ROOT / "tests" / "ipywidgets8.txt").read_text().splitlines()]
    return next(ln.split("==")[1] for ln in lines if ln.startswith("ipywidgets=="))


def longest_questions():
    """(bank name, question id) of every bank's question with its longest choice, plus the longest
    multiple-answer question of all banks (its checkboxes wrap too)."""
    picked = []
    for bank in all_banks():
        q = max((q for q in bank.questions if q.choices), key=lambda q: max(len(c.text) for c in q.choices))
        picked.append((bank.name, q.id))
    multiple = max((q for b in all_banks() for q in b.questions if q.type == "multiple"),
                   key=lambda q: max(len(c.text) for c in q.choices))
    if (multiple.bank, multiple.id) not in picked:
        picked.append((multiple.bank, multiple.id))
    return picked


CELL = """import ipywidgets
from course_utils.chapter.quiz.widget import Quiz
from course_utils.chapter.quiz.bank import load_bank
picked = {picked!r}
questions = [next(q for q in load_bank(bank).questions if q.id == qid) for bank, qid in picked]
print("ipywidgets", ipywidgets.__version__, "from", ipywidgets.__file__)
Quiz("every bank's longest choice", questions)"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab whose notebook runs on a kernel with the lowest ipywidgets the `lab` extra allows."""
    if not (IPYWIDGETS8 / "ipywidgets").is_dir():
        message = f"the lowest ipywidgets 8 is not installed in {IPYWIDGETS8.name}/: run `{INSTALL}`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    base = tmp_path_factory.mktemp("lab")
    tracker = base / "lab-settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    path = os.pathsep.join([str(IPYWIDGETS8), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    spec = base / "jupyter-data" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (lowest ipywidgets)", "language": "python", "env": {"PYTHONPATH": path}}))
    server = Lab(base)
    try:
        server.wait_ready()
        nb = {"nbformat": 4, "nbformat_minor": 5, "cells": [{
            "cell_type": "code", "id": "longest", "metadata": {}, "execution_count": None, "outputs": [],
            "source": CELL.format(picked=longest_questions())}],
            "metadata": {"kernelspec": {"name": KERNEL, "display_name": "Python 3 (lowest ipywidgets)",
                                        "language": "python"}}}
        (server.root / NOTEBOOK).write_text(json.dumps(nb, indent=1))
        server.settings = base / "lab-settings" / "@jupyterlab" / "apputils-extension"
        server.settings.mkdir(parents=True)
        yield server
    finally:
        server.stop()


# Each question's choice rows (a radio button's <label>, or a checkbox's), their boxes and their text's
# boxes (a Range over the row's text), and the colours of the quiz's notes against what is behind them.
LAYOUT_JS = """
(quiz) => {
  const box = r => ({top: r.top, bottom: r.bottom, left: r.left, right: r.right, height: r.height});
  const questions = [...quiz.querySelectorAll('.course-quiz-question')].map(q => {
    const rows = [...q.querySelectorAll('.widget-radio-box label, .widget-checkbox label')]
      .filter(row => row.getClientRects().length > 0);  // not the checkbox's hidden description label
    return rows.map(row => {
      // the text's box: the union of its text nodes' boxes (not the control's)
      const walker = document.createTreeWalker(row, NodeFilter.SHOW_TEXT);
      const rects = [];
      for (let n = walker.nextNode(); n; n = walker.nextNode()) {
        if (!n.textContent.trim()) continue;
        const range = document.createRange();
        range.selectNodeContents(n);
        rects.push(range.getBoundingClientRect());
      }
      const union = {top: Math.min(...rects.map(r => r.top)), bottom: Math.max(...rects.map(r => r.bottom)),
                     left: Math.min(...rects.map(r => r.left)), right: Math.max(...rects.map(r => r.right))};
      union.height = union.bottom - union.top;
      const input = row.querySelector('input');
      return {text: row.textContent.trim(), row: box(row.getBoundingClientRect()), text_box: union,
              input: input ? box(input.getBoundingClientRect()) : null,
              line: parseFloat(getComputedStyle(row).lineHeight) || 20};
    });
  });
  const area = box(quiz.closest('.jp-OutputArea-output').getBoundingClientRect());
  const rgba = c => (c.match(/[\\d.]+/g) || []).map(Number);
  const behind = el => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c.length >= 3 && (c.length < 4 || c[3] > 0.5)) return c;
    }
    return [255, 255, 255];
  };
  const notes = [quiz.querySelector('.course-quiz > .widget-html .widget-html-content > div'),
                 quiz.querySelector('.course-quiz-question i'), quiz.querySelector('.course-quiz-score span')]
    .filter(Boolean).map(e => ({text: e.textContent.trim().slice(0, 40), color: rgba(getComputedStyle(e).color),
                                background: behind(e)}));
  return {questions, area, notes};
}
"""


def _luminance(rgb) -> float:
    def channel(c):
        c = c / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (channel(c) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg, bg) -> float:
    """WCAG contrast ratio of a text colour over a background (an alpha in fg blends it over bg)."""
    if len(fg) == 4:
        fg = [fg[3] * f + (1 - fg[3]) * b for f, b in zip(fg[:3], bg[:3])]
    hi, lo = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def assert_choices_wrap_inside(layout) -> None:
    wrapped = 0
    for n, rows in enumerate(layout["questions"], start=1):
        assert len(rows) >= 2, f"question {n}: {len(rows)} choice rows"
        for row in rows:
            r, t = row["row"], row["text_box"]
            where = f"question {n}, {row['text'][:60]!r}"
            assert r["height"] > 0, where
            # the text, and the control, inside the row; the row inside the output area
            assert t["top"] >= r["top"] - 1 and t["bottom"] <= r["bottom"] + 1, (where, r, t)
            assert t["left"] >= r["left"] - 1 and t["right"] <= r["right"] + 1, (where, r, t)
            i = row["input"]
            assert i, where
            assert i["top"] >= r["top"] - 1 and i["bottom"] <= r["bottom"] + 1, (where, r, i)
            assert i["right"] <= t["left"] + 1, (where, "the radio button or checkbox comes first", i, t)
            assert r["right"] <= layout["area"]["right"] + 1, (where, r, layout["area"])
            wrapped += t["height"] > 1.6 * row["line"]
        for a, b in zip(rows, rows[1:]):  # one below the other, never on top of each other
            assert a["row"]["bottom"] <= b["row"]["top"] + 0.5, (n, a["text"][:60], b["text"][:60])
            assert a["text_box"]["bottom"] <= b["text_box"]["top"] + 0.5, (n, a["text"][:60], b["text"][:60])
    assert wrapped, "no choice wrapped onto a second line: the test did not exercise wrapping"


def assert_notes_legible(layout, theme: str) -> None:
    assert len(layout["notes"]) == 3, layout["notes"]
    for note in layout["notes"]:
        ratio = contrast(note["color"], note["background"])
        assert ratio >= 4.5, f"{theme}: {note['text']!r} at contrast {ratio:.2f} ({note})"


@pytest.mark.parametrize("theme", list(THEMES))
def test_longest_choices_wrap_in_their_rows_and_notes_read(lab, browser, theme):
    from playwright.sync_api import expect

    (lab.settings / "themes.jupyterlab-settings").write_text(json.dumps({"theme": THEMES[theme]}))
    with notebook_page(browser, lab, NOTEBOOK, f"quiz_longest_{theme}") as page:
        run_all(page, timeout_s=180)
        assert_no_error_output(page)
        stdout = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stdout"]')
        expect(stdout).to_contain_text(f"ipywidgets {lowest_lab_ipywidgets()} from {IPYWIDGETS8}")
        quiz = page.locator(".course-quiz")
        expect(quiz).to_have_count(1)
        expect(quiz.locator(".course-quiz-question")).to_have_count(len(longest_questions()))
        layout = quiz.evaluate(LAYOUT_JS)
        quiz.scroll_into_view_if_needed()
        shot(quiz, f"quiz_longest_{theme}.png")
        assert_choices_wrap_inside(layout)
        assert_notes_legible(layout, theme)
