"""The course in a real browser: JupyterLab on localhost, driven in headless Chromium by Playwright.

One JupyterLab server and one Chromium serve both tests, which do what a learner does:

- notebook 01 as committed, run with Run > Run All Cells: every cell runs and no error output shows
  anywhere on the page; then its quiz, live: a choice (a wrong answer, then the right one), a number (a
  common wrong one, then the right one) and a multiple-answer question (one right answer short, then all),
  the feedback and the score read off the page, the expected answers and messages from the bank itself,
  and each right answer locked in bold green with a check mark (not a disabled control's pale grey);
- notebook 07 as committed, nothing run: its quiz's questions and choices and its checklist's table show
  as rendered Markdown (the static copies scripts/notebooks/write_notebooks.py clean keeps), and no answer or explanation
  shows; then its two checklist cells are run and an item unticked and ticked again, the report following
  (a table inside the output area, one line a row, no checkbox label clipped).

Why notebook 01: of the notebooks whose quiz has all three question types it is the cheapest to run whole
on a CPU with the embedded tiny model (about 33 s here, as notebook 02; 09 takes 42 s, the others measure
more rungs). Notebook 07, the checklist's, is far too long to run whole here (the full ladder, the chapter's
training script, generation), so only its two checklist cells are run.

Screenshots go to test-artifacts/ (git-ignored): notebook_run_all.png (notebook 01 after Run All, at its
quiz), notebook_quiz_wrong.png (the first question after a wrong answer), notebook_quiz.png (the quiz
answered), notebook_quiz_locked.png (its first question locked after the right answer: that choice in bold
green with a check mark), static_quiz.png and static_checklist.png (notebook 07 as committed),
checklist_unticked.png (its live checklist with QLoRA unticked: the report's table below the checkboxes);
<name>_failure.png, the whole page, when a test fails.

Needs Debian's `chromium` (.ci/run installs it: apt-get install chromium); Playwright drives that
binary and never downloads a browser. Skipped, with the reason, when /usr/bin/chromium is missing.
"""

from __future__ import annotations

import json
import re
import shutil

import nbformat
import pytest
from jupyterlab_browser import (  # noqa: F401  (the fixture `browser` is used by name)
    CHROMIUM, ROOT, Lab, assert_no_error_output, browser, code_cell, notebook_page, run_all, shot)

from course_utils.chapter.quiz.widget import _plain
from course_utils.chapter.quiz.bank import load_bank

RUN_ALL = "01_gradient_checkpointing"  # run whole (see above for why this one)
CHECKLIST_NB = "07_complete_recipe"  # the checklist widget's notebook (too slow to run whole here)
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's Chromium at /usr/bin/chromium (apt-get update && apt-get install -y chromium; .ci/run does)",
)


# --- one server and one browser for the module -----------------------------------------------------
@pytest.fixture(scope="module")
def lab(tmp_path_factory, tiny_model):
    """JupyterLab with notebooks 01 and 07, as committed, in its root. The embedded tiny model is built
    first (in CI, other tests have built it already), so that Run All does not time its build."""
    base = tmp_path_factory.mktemp("lab")
    # every cell in the page from the start (JupyterLab's default windowing attaches them a few at a time),
    # so that what the tests read of the whole notebook is the whole notebook
    tracker = base / "lab-settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    server = Lab(base)
    try:
        server.wait_ready()
        for name in (RUN_ALL, CHECKLIST_NB):
            shutil.copy(ROOT / "notebooks" / f"{name}.ipynb", server.root)
        yield server
    finally:
        server.stop()


# --- the quiz's controls as a learner uses them ------------------------------------------------------
def quiz_box(page, questions, qtype: str):
    """(the question, its box on the page): the quiz's first question of a type."""
    n, q = next((n, q) for n, q in enumerate(questions) if q.type == qtype)
    return q, page.locator(".course-quiz .course-quiz-question").nth(n)


def choice_label(box, question, i: int):
    kind = ".widget-radio-box label" if question.type == "single" else ".widget-checkbox label"
    return box.locator(kind, has_text=_plain(question.choices[i].text))


def press_check(box):
    box.locator("button.course-quiz-check").click()
    return box.locator(".course-quiz-feedback")


def wrong_choice(question) -> int:
    return next(i for i, c in enumerate(question.choices) if not c.correct)


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def explanations(question) -> list[str]:
    """What a quiz shows only after Check: every explanation and hint of a question."""
    texts = [c.explanation for c in question.choices] + [question.explanation, question.hint]
    return [t for t in texts + [w.explanation for w in question.wrong_answers] if t]


GREEN = "rgb(26, 127, 55)"  # course_utils.chapter.quiz.widget._GREEN, #1a7f37, as the browser computes it


def assert_locked_right(box, right: list[str], every: list[str]) -> None:
    """A question locked after a right answer, as the learner sees it: its locked view shows every choice
    (`every`), and exactly the right ones (`right`) in bold green with a check mark; none of it pale."""
    from playwright.sync_api import expect

    view = box.locator(".course-quiz-locked")
    expect(view).to_be_visible()
    for text in every:
        expect(view).to_contain_text(text)
    marked = view.locator(".course-quiz-picked")
    expect(marked).to_have_count(len(right))
    for el in marked.all():
        assert any(text in _normal(el.text_content()) for text in right), el.text_content()
        expect(el).to_contain_text("\u2714")
        expect(el).to_have_css("color", GREEN)
        assert int(el.evaluate("e => getComputedStyle(e).fontWeight")) >= 600
        assert float(el.evaluate("e => getComputedStyle(e).opacity")) == 1.0


# The checklist widget as laid out on the page: the report's table and statements, whether any of it
# overflows the output area, and whether a checkbox's label is clipped.
CHECKLIST_LAYOUT_JS = """
(cell) => {
  const area = cell.querySelector('.jp-OutputArea-output').getBoundingClientRect();
  const report = cell.querySelector('.course-checklist-report');
  const table = report.querySelector('table');
  const lh = parseFloat(getComputedStyle(report.querySelector('td')).lineHeight);
  const style = getComputedStyle(report);
  return {
    area_right: area.right, report_right: report.getBoundingClientRect().right,
    table_right: table.getBoundingClientRect().right,
    scrolls: report.parentElement.scrollWidth > report.parentElement.clientWidth + 1,
    rows_wrapped: [...table.rows].filter(r => r.getBoundingClientRect().height > 1.6 * lh).map(r => r.innerText),
    word_break: style.wordBreak, overflow_wrap: style.overflowWrap, pres: report.querySelectorAll('pre').length,
    clipped_labels: [...cell.querySelectorAll('.widget-checkbox label, .widget-checkbox span')]
      .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent),
  };
}
"""


def assert_checklist_fits(checklist) -> None:
    """The live checklist at the learner's width: the report's table, one line per row, inside the output
    area (nothing scrolls sideways), statements that wrap between words only, no checkbox label clipped."""
    layout = checklist.evaluate(CHECKLIST_LAYOUT_JS)
    assert layout["pres"] == 0 and not layout["scrolls"], layout
    assert max(layout["table_right"], layout["report_right"]) <= layout["area_right"] + 1, layout
    assert layout["rows_wrapped"] == [], layout
    assert layout["word_break"] == "normal" and layout["overflow_wrap"] == "normal", layout
    assert layout["clipped_labels"] == [], layout


def checklist_table(recipe, hardware: str = "t4") -> list[str]:
    """The checklist report's table as the page shows it should be, row by row (header first), from the
    report check_recipe gives (course_utils.chapter.complete_recipe.checklist_rows)."""
    from course_utils.chapter.complete_recipe import _COLUMNS, _check_report, checklist_rows

    _, rows = checklist_rows(_check_report(recipe, hardware))
    return [" ".join(name for name, _ in _COLUMNS)] + [" ".join(row) for row in rows]


# --- the tests ----------------------------------------------------------------------------------------
def test_course_notebook_run_all_then_its_quiz(lab, browser):
    """Notebook 01 as committed: Run > Run All Cells, every cell runs without an error output; then its
    quiz's choice, number and multiple-answer questions, each wrong and then right."""
    from playwright.sync_api import expect

    from course_utils.chapter.quiz.grade import grade

    questions = load_bank(RUN_ALL).questions
    total = len(questions)

    with notebook_page(browser, lab, f"{RUN_ALL}.ipynb", "notebook_run_all") as page:
        run_all(page)
        assert_no_error_output(page)
        # Run All marks every code cell "[*]:", and a fresh kernel counts from 1: each cell ran once, in order
        # (a cell whose source is hidden shows no prompt)
        code_cells = [c for c in nbformat.read(lab.root / f"{RUN_ALL}.ipynb", as_version=4).cells
                      if c.cell_type == "code"]
        expected = [f"[{n}]:" for n, c in enumerate(code_cells, start=1)
                    if not c.metadata.get("jupyter", {}).get("source_hidden")]
        prompts = page.locator(".jp-Notebook .jp-CodeCell .jp-InputArea-prompt").all_text_contents()
        assert [p.strip() for p in prompts] == expected
        # nothing given away: after Run All the worked solution is a button, and shows only when pressed
        from course_utils.chapter.exercises import exercise
        from course_utils.recipe import base_recipe_for

        code = exercise(RUN_ALL).code(base_recipe_for("tiny", "cpu"), "cpu")
        notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
        assert _normal(code) not in _normal(notebook.inner_text())
        page.locator("button.course-solution-button").click()
        expect(page.locator(".course-solution")).to_contain_text(code)
        expect(page.locator("button.course-solution-button")).to_be_hidden()
        quiz = page.locator(".course-quiz")
        expect(quiz).to_have_count(1)  # shown once, live
        score = quiz.locator(".course-quiz-score")
        expect(score).to_contain_text(f"Score: 0/{total}")
        quiz.scroll_into_view_if_needed()
        shot(page, "notebook_run_all.png")

        # a choice: a wrong one (its explanation, not the right one's), then the right one
        q, box = quiz_box(page, questions, "single")
        wrong, right = wrong_choice(q), q.right_choices[0]
        choice_label(box, q, wrong).click()
        feedback = press_check(box)
        expect(feedback).to_contain_text(grade(q, wrong).message)  # "Not quite. ..."
        expect(feedback).to_contain_text(_plain(q.choices[wrong].explanation)[:60])
        expect(feedback).not_to_contain_text(_plain(q.choices[right].explanation)[:60])  # not given away
        expect(score).to_contain_text(f"Score: 0/{total} (1 of {total} checked)")
        shot(box, "notebook_quiz_wrong.png")
        choice_label(box, q, right).click()
        press_check(box)
        expect(feedback).to_contain_text("Correct!")
        expect(feedback).to_contain_text(_plain(q.choices[right].explanation)[:60])
        # a right answer is locked, and reads as right: the radio buttons (disabled, they would be drawn pale
        # grey) and Check are hidden; the locked view shows the right choice in bold green with a check mark
        expect(box.locator("input[type=radio]").first).to_be_disabled()
        expect(box.locator(".widget-radio-box")).to_be_hidden()
        expect(box.locator("button.course-quiz-check")).to_be_hidden()
        assert_locked_right(box, [_plain(q.choices[right].text)], [_plain(c.text) for c in q.choices])
        expect(box.locator("button.course-quiz-again")).to_be_visible()
        shot(box, "notebook_quiz_locked.png")
        expect(score).to_contain_text(f"Score: 1/{total}")

        # a number: a common wrong one (what it explains), then the right one
        q, box = quiz_box(page, questions, "numeric")
        assert q.wrong_answers, q.id
        number = box.locator("input[type=text]")
        number.fill(f"{q.wrong_answers[0].value:g}")
        feedback = press_check(box)
        expect(feedback).to_contain_text(grade(q, q.wrong_answers[0].value).message)
        expect(feedback).to_contain_text(_plain(q.wrong_answers[0].explanation)[:60])
        number.fill(f"{q.answer:g}")
        press_check(box)
        expect(feedback).to_contain_text("Correct!")
        expect(feedback).to_contain_text(_plain(q.explanation)[:60])
        expect(number).to_be_hidden()
        assert_locked_right(box, [f"{q.answer:g} {q.unit}".strip()], [])
        expect(score).to_contain_text(f"Score: 2/{total}")

        # several answers: one right one only, then all of them
        q, box = quiz_box(page, questions, "multiple")
        right = q.right_choices
        assert len(right) >= 2, q.id
        choice_label(box, q, right[0]).click()
        feedback = press_check(box)
        expect(feedback).to_contain_text(grade(q, right[:1]).message)  # "... at least one right answer is missing"
        expect(score).to_contain_text(f"Score: 2/{total}")
        for i in right[1:]:
            choice_label(box, q, i).click()
        press_check(box)
        expect(feedback).to_contain_text(grade(q, list(right)).message)
        for i in range(len(q.choices)):
            expect(choice_label(box, q, i).locator("input[type=checkbox]")).to_be_checked(checked=i in right)
        expect(box.locator(".widget-checkbox").first).to_be_hidden()
        assert_locked_right(box, [_plain(q.choices[i].text) for i in right], [_plain(c.text) for c in q.choices])
        expect(score).to_contain_text(f"Score: 3/{total} (3 of {total} checked)")

        assert_no_error_output(page)
        quiz.scroll_into_view_if_needed()
        shot(quiz, "notebook_quiz.png")


def test_committed_notebook_static_view_then_the_checklist(lab, browser):
    """Notebook 07 as committed, nothing run: its quiz's questions and its checklist show as rendered
    Markdown, and no answer; then its checklist cells run and an item is unticked and ticked again."""
    from playwright.sync_api import expect

    from course_utils.chapter.complete_recipe import CHECKLIST, _check_report, checklist_rows
    from course_utils.recipe import source_chapter_recipe

    bank = load_bank(CHECKLIST_NB)
    chapter = source_chapter_recipe("llama-3.1-8b")  # what the notebook's checklist cell checks
    markdown = '.jp-OutputArea-output[data-mime-type="text/markdown"]'

    with notebook_page(browser, lab, f"{CHECKLIST_NB}.ipynb", "static_view") as page:
        notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
        # the quiz: every question and choice, as Markdown; no live quiz, nothing ticked, no explanation
        static_quiz = code_cell(page, f'show_quiz("{CHECKLIST_NB}")').locator(markdown)
        expect(static_quiz).to_have_count(1)
        expect(static_quiz).to_contain_text(f"Quiz: {bank.title} ({len(bank)} questions)")
        items = static_quiz.locator("ol > li")  # the numbered questions, in the bank's order
        expect(items).to_have_count(len(bank))
        for item, q in zip(items.all(), bank.questions):
            expect(item).to_contain_text(_plain(q.prompt))
            for c in q.choices:
                expect(item).to_contain_text(_plain(c.text))
        numeric = [q for q in bank.questions if q.type == "numeric"]
        expect(static_quiz.get_by_text("Answer: ______")).to_have_count(len(numeric))  # blanks, not the answers
        expect(static_quiz.locator("input:checked")).to_have_count(0)
        expect(page.locator(".course-quiz")).to_have_count(0)
        shown = _normal(notebook.text_content())
        for q in bank.questions:
            for text in explanations(q):
                assert _normal(_plain(text))[:60] not in shown, f"an answer shows: {text[:80]!r}"
        static_quiz.scroll_into_view_if_needed()
        shot(static_quiz, "static_quiz.png")

        # the checklist: its state when the cell ran, one table row per item
        checklist = code_cell(page, 'checklist_widget(chapter, hardware="t4")')
        static_list = checklist.locator(markdown)
        expect(static_list).to_contain_text("Memory checklist as it stood when this cell ran")
        rows = static_list.locator("table tbody tr")
        expect(rows).to_have_count(len(CHECKLIST))
        for row, (item, follows, _) in zip(rows.all(), CHECKLIST):
            expect(row).to_contain_text(f"{'☑ yes' if follows(chapter) else '☐ no'} {item}")
        static_list.scroll_into_view_if_needed()
        shot(static_list, "static_checklist.png")
        assert_no_error_output(page)

        # the live checklist: run the report's cell and the widget's cell after it, as a learner would
        code_cell(page, "print(check_recipe(chapter").locator(".cm-content").click()
        page.keyboard.press("Shift+Enter")
        page.keyboard.press("Shift+Enter")
        report = checklist.locator(".course-checklist-report")
        rows = report.locator("table tr")
        expect(rows).to_have_text(checklist_table(chapter), use_inner_text=True, timeout=60_000)
        qlora_item, _, without_qlora = CHECKLIST[0]
        qlora = checklist.locator(".widget-checkbox", has_text=qlora_item).locator("input[type=checkbox]")
        expect(qlora).to_be_checked()
        assert_checklist_fits(checklist)
        qlora.click()  # untick
        expect(qlora).not_to_be_checked()
        expect(rows).to_have_text(checklist_table(without_qlora(chapter)), use_inner_text=True)
        expect(report).to_contain_text("DOES NOT FIT")
        expect(report.get_by_text("DOES NOT FIT")).to_have_css("color", "rgb(207, 34, 46)")  # the quiz's red
        assert_checklist_fits(checklist)
        checklist.scroll_into_view_if_needed()
        shot(checklist, "checklist_unticked.png")
        qlora.click()  # tick again
        expect(qlora).to_be_checked()
        expect(rows).to_have_text(checklist_table(chapter), use_inner_text=True)
        # the statements above the table are check_recipe's, unwrapped (the page wraps them between words)
        for line in checklist_rows(_check_report(chapter, "t4"))[0]:
            expect(report).to_contain_text(line)
        assert_no_error_output(page)
