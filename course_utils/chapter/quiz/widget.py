"""End-of-notebook quizzes: an ipywidgets quiz and its text copy, on top of the question banks
(``quiz_bank``: loading and validation) and their marking (``quiz_grade``). Every name of the three is
importable from here.

The banks are YAML files, one per notebook, in the repository's top-level ``quizzes/`` folder (the
schema is in ``quizzes/README.md``); an installed wheel carries the same files as
``course_utils/quizzes/``. In a notebook::

    from course_utils.chapter.quiz.widget import show_quiz
    show_quiz("01_gradient_checkpointing")

``grade(question, answer)`` is the whole of the marking: a pure function, so it is tested without
widgets. The widget is built from core ipywidgets only, and only from what both 7.7 (Colab's) and 8.x
have (Colab renders core widgets without a custom widget manager), and it carries a plain-text and Markdown copy of the questions, without the answers, for
places that cannot run widgets (GitHub, nbviewer, a notebook saved without widget state).
"""

from __future__ import annotations

import html
import ipywidgets as widgets
import random
import re
from collections.abc import Sequence
from typing import Any

from course_utils.chapter.quiz.bank import (Bank, Choice, Question, QuizError, TYPES, WrongAnswer, all_banks,
                                            bank_names, chapter_questions, load_bank, parse_bank, quiz_dir,
                                            render_figures)
from course_utils.chapter.quiz.grade import Feedback, Verdict, grade, parse_number
from course_utils.chapter.quiz.static_copy import StaticCopy, md_escape as _md
from course_utils.show.tables import wrap

# The quiz's whole API, importable from here: the banks (quiz_bank), the marking (quiz_grade), the widget (below).
__all__ = ["TYPES", "Bank", "Choice", "Question", "QuizError", "WrongAnswer", "all_banks", "bank_names",
           "chapter_questions", "load_bank", "parse_bank", "quiz_dir", "render_figures",
           "Feedback", "Verdict", "grade", "parse_number",
           "choice_order", "quiz_text", "quiz_markdown", "QuestionWidget", "Quiz",
           "make_quiz", "show_quiz", "make_chapter_quiz", "show_chapter_quiz"]


# --- the text fallback ---------------------------------------------------------------------------
def choice_order(question: Question) -> list[int]:
    """The order choices are shown in: shuffled, the same every time for a question id.

    Bank authors can list the right answer first; learners do not see it first.
    """
    order = list(range(len(question.choices)))
    random.Random(question.id).shuffle(order)
    return order


def _plain(text: str) -> str:
    """Text for a widget label: the `code` marks dropped."""
    return text.replace("`", "")


def _html(text: str) -> str:
    """Escaped HTML with `code` spans."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _kind(q: Question) -> str:
    if q.type == "multiple":
        return "choose all that apply"
    if q.type == "numeric":
        return f"a number{', in ' + q.unit if q.unit else ''}"
    return "choose one"


def quiz_text(title: str, questions: Sequence[Question]) -> str:
    """The quiz as plain text, without answers or explanations (what a static rendering shows), in lines of at
    most 100 characters (a question's or a choice's continuation hangs under its text)."""
    lines = [f"Quiz: {title} ({len(questions)} questions)",
             "Run this cell in Jupyter or Colab to check your answers; they are not shown here.", ""]
    for n, q in enumerate(questions, start=1):
        lines.append(f"{n}. {q.prompt} ({_kind(q)})")
        box = "[ ]" if q.type == "multiple" else "( )"
        lines += [f"   {box} {chr(65 + k)}. {q.choices[j].text}" for k, j in enumerate(choice_order(q))]
        if q.type == "numeric":
            lines.append(f"   Answer: ______ {q.unit}".rstrip())
        lines.append("")
    return wrap("\n".join(lines).rstrip()) + "\n"


def quiz_markdown(title: str, questions: Sequence[Question]) -> str:
    """The quiz as Markdown, without answers or explanations (GitHub and nbviewer render this)."""
    lines = [f"**Quiz: {_md(title)}** ({len(questions)} questions). Run this cell in Jupyter or Colab to check "
             "your answers; they are not shown here.", ""]
    for n, q in enumerate(questions, start=1):
        lines += [f"{n}. {_md(q.prompt)} *({_md(_kind(q))})*", ""]
        box = "- [ ]" if q.type == "multiple" else "- ( )"
        lines += [f"   {box} {chr(65 + k)}. {_md(q.choices[j].text)}" for k, j in enumerate(choice_order(q))]
        if q.type == "numeric":
            lines.append(f"   Answer: ______ {q.unit}".rstrip())
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# --- the widget ----------------------------------------------------------------------------------
_GREEN, _RED = "#1a7f37", "#cf222e"
# Instructions and notes in the page's own text colour (JupyterLab's theme variable; elsewhere, Colab's
# included, the inherited colour), so that they read in light and dark themes alike: no fixed grey.
_NOTE = "var(--jp-content-font-color1, inherit)"
# Long choices wrap inside their own row. Both ipywidgets 7.7 (Colab's) and 8 draw a radio choice as a
# <label> of one fixed line height in `.widget-radio-box` (8 adds `.jupyter-widget-radio-box`) and a
# checkbox as `.widget-checkbox` of one fixed height with a one-line label: a longer choice wrapped
# onto the next one. This style, scoped to the quiz, lets each row grow with its text, its radio button or
# checkbox first (8 puts the radio after the text in the DOM, and its `float: left` does not act in a flex
# row) (tests/test_quiz_layout_browser.py measures it with the longest choice of every bank).
_WRAP_STYLE = """<style>
.course-quiz .widget-radio-box label, .course-quiz .jupyter-widget-radio-box label {
  height: auto; min-height: var(--jp-widgets-radio-item-height, 24px); line-height: 1.4;
  white-space: normal; overflow: visible; display: flex; align-items: flex-start; padding: 3px 0; }
.course-quiz .widget-radio-box input, .course-quiz .jupyter-widget-radio-box input {
  flex: 0 0 auto; order: -1; height: auto; margin: 0.2em 0.5em 0 1px; }
.course-quiz .widget-checkbox, .course-quiz .jupyter-widget-checkbox { height: auto; line-height: 1.4; }
.course-quiz .widget-checkbox label, .course-quiz .jupyter-widget-checkbox label {
  height: auto; line-height: 1.4; white-space: normal; overflow: visible; text-overflow: clip;
  display: flex; align-items: flex-start; padding: 3px 0; }
.course-quiz .widget-checkbox input, .course-quiz .jupyter-widget-checkbox input {
  flex: 0 0 auto; order: -1; margin: 0.2em 0.5em 0 1px; }
.course-quiz .widget-radio-box, .course-quiz .jupyter-widget-radio-box,
.course-quiz .widget-checkbox, .course-quiz .jupyter-widget-checkbox { width: auto; max-width: 100%; }
</style>"""


def _feedback_html(verdict: Verdict) -> str:
    """The verdict as HTML: the message, then each choice's explanation."""
    color = _GREEN if verdict.correct else (_RED if verdict.answered else _NOTE)
    mark = "&#10004; " if verdict.correct else ("&#10008; " if verdict.answered else "")
    parts = [f'<div style="color:{color};font-weight:bold">{mark}{html.escape(verdict.message)}</div>']
    if verdict.correct and len(verdict.feedback) > 1:
        parts.append('<div style="margin-top:4px">Why each choice is right or wrong:</div>')
    items = []
    for f in verdict.feedback:
        sign, c = ("&#10004;", _GREEN) if f.correct else ("&#10008;", _RED)
        why = f" &mdash; {_html(f.explanation)}" if f.explanation else ""
        items.append(f'<li><span style="color:{c}">{sign}</span> <b>{_html(f.text)}</b>{why}</li>')
    if items:
        parts.append('<ul style="margin:4px 0;padding-left:20px">' + "".join(items) + "</ul>")
    return '<div class="course-quiz-verdict" style="line-height:1.4">' + "".join(parts) + "</div>"


def _locked_html(question: Question, order: Sequence[int], answer: Any) -> str:
    """A right answer, locked, as the learner reads it: every choice in display order, the picked ones in
    bold green with a check mark, the others in the page's own text colour (a disabled ipywidgets control is
    drawn pale grey, which reads as wrong or inactive); a number, in bold green with its unit."""
    picked_style = f"color:{_GREEN};font-weight:bold"
    if question.type == "numeric":
        value = html.escape(f"{str(answer).strip()} {question.unit}".strip())
        lines = [f'<div class="course-quiz-picked" style="{picked_style}">&#10004; {value}</div>']
    else:
        picked = {answer} if question.type == "single" else set(answer)
        on, off = ("&#9673;", "&#9675;") if question.type == "single" else ("&#9745;", "&#9744;")  # (o) ( ) [x] [ ]
        mark = '<span style="display:inline-block;min-width:1em">{}</span>'.format  # the text lines up
        lines = []
        for j in order:
            text = _html(question.choices[j].text)
            if j in picked:
                lines.append(f'<div class="course-quiz-picked" style="{picked_style}">{mark(on)} {text} &#10004;</div>')
            else:
                lines.append(f"<div>{mark(off)} {text}</div>")
    return ('<div class="course-quiz-locked-answer" style="line-height:1.6;margin:2px 0 6px 0" '
            'title="Your answer is right. Press Try again to answer again.">' + "".join(lines) + "</div>")


class QuestionWidget(widgets.VBox):
    """One question: its choices (or a number box), Check, Try again, and the feedback."""

    def __init__(self, question: Question, number: int, on_graded=None, source: str = ""):
        self.question = question
        self.verdict: Verdict | None = None
        self._on_graded = on_graded or (lambda: None)
        where = f' <span style="color:{_NOTE}">({html.escape(source)})</span>' if source else ""
        header = widgets.HTML(
            f'<div style="line-height:1.4"><b>{number}.</b> {_html(question.prompt)} '
            f'<i style="color:{_NOTE}">({_kind(question)})</i>{where}</div>',
            layout=widgets.Layout(width="100%"))
        self.order = choice_order(question)  # display position -> index in question.choices
        if question.type == "single":
            self.controls = widgets.RadioButtons(
                options=[(_plain(question.choices[j].text), j) for j in self.order], value=None,
                layout=widgets.Layout(width="auto", max_width="100%"))
            boxes = [self.controls]
        elif question.type == "multiple":
            self.controls = [widgets.Checkbox(value=False, description=_plain(question.choices[j].text), indent=False,
                                              layout=widgets.Layout(width="auto", max_width="100%"))
                             for j in self.order]
            boxes = list(self.controls)
        else:
            self.controls = widgets.Text(placeholder="a number", layout=widgets.Layout(width="12em"))
            boxes = [widgets.HBox([self.controls, widgets.Label(question.unit)])]
        # the controls, and what replaces them once a right answer is locked (_locked_html)
        self.answer_box = widgets.VBox(boxes)
        self.locked_view = widgets.HTML("", layout=widgets.Layout(display="none"))
        self.check_button = widgets.Button(description="Check", button_style="primary", tooltip="Check my answer")
        self.again_button = widgets.Button(description="Try again", tooltip="Clear my answer and start over")
        self.again_button.layout.display = "none"
        self.feedback = widgets.HTML("")
        for w, cls in ((self.check_button, "course-quiz-check"), (self.again_button, "course-quiz-again"),
                       (self.feedback, "course-quiz-feedback"), (self.locked_view, "course-quiz-locked")):
            w.add_class(cls)
        self.check_button.on_click(lambda _: self.check())
        self.again_button.on_click(lambda _: self.try_again())
        buttons = widgets.HBox([self.check_button, self.again_button])
        super().__init__([header, self.answer_box, self.locked_view, buttons, self.feedback],
                         layout=widgets.Layout(margin="0 0 14px 0", width="100%"))
        self.add_class("course-quiz-question")

    @property
    def answer(self) -> Any:
        """The answer as the controls hold it now, in the form `grade` takes."""
        if self.question.type == "single":
            return self.controls.value
        if self.question.type == "multiple":
            return sorted(j for j, box in zip(self.order, self.controls) if box.value)
        return self.controls.value

    def select(self, answer: Any) -> None:
        """Set the controls as a learner would: a choice index, a list of indexes, or a number."""
        if self.question.type == "single":
            self.controls.value = answer
        elif self.question.type == "multiple":
            picked = set() if answer is None else {answer} if isinstance(answer, int) else set(answer)
            for j, box in zip(self.order, self.controls):
                box.value = j in picked
        else:
            self.controls.value = "" if answer is None else str(answer)

    @property
    def correct(self) -> bool:
        """True when the last check was right."""
        return bool(self.verdict and self.verdict.correct)

    @property
    def feedback_text(self) -> str:
        """The feedback as plain text (what the learner reads)."""
        inline = re.sub(r"</?(code|b|i|span)\b[^>]*>", "", self.feedback.value)
        return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", inline))).strip()

    @property
    def locked(self) -> bool:
        """True while a right answer is locked (until Try again)."""
        return self.check_button.disabled

    def _set_enabled(self, enabled: bool) -> None:
        """Unlock, or lock the answer the controls hold: the controls are disabled and hidden, and
        locked_view shows the answer marked right (and Check is hidden: only Try again changes it)."""
        if not enabled:
            self.locked_view.value = _locked_html(self.question, self.order, self.answer)
        for w in (self.controls if isinstance(self.controls, list) else [self.controls]):
            w.disabled = not enabled
        self.check_button.disabled = not enabled
        shown, hidden = (self.answer_box, self.locked_view) if enabled else (self.locked_view, self.answer_box)
        shown.layout.display, hidden.layout.display = None, "none"
        self.check_button.layout.display = None if enabled else "none"
        if enabled:
            self.locked_view.value = ""

    def check(self) -> Verdict:
        """Grade the current answer and show the feedback (what the Check button does)."""
        verdict = grade(self.question, self.answer)
        self.feedback.value = _feedback_html(verdict)
        if verdict.answered:
            self.verdict = verdict
            self.again_button.layout.display = None
            self._set_enabled(not verdict.correct)  # a right answer is locked until "Try again"
        self._on_graded()
        return verdict

    def try_again(self) -> None:
        """Clear the answer and the feedback (what the Try again button does)."""
        self.select(None)
        self.verdict = None
        self.feedback.value = ""
        self.again_button.layout.display = "none"
        self._set_enabled(True)
        self._on_graded()


class Quiz(StaticCopy, widgets.VBox):
    """A quiz: a title, its questions, a running score, and Start over. Its display carries the questions,
    without the answers, as Markdown and text for where widgets cannot render (course_utils.static_copy)."""

    def __init__(self, title: str, questions: Sequence[Question], sources: Sequence[str] | None = None):
        self.title = title
        self.question_list = tuple(questions)
        self.score_label = widgets.HTML()
        self.score_label.add_class("course-quiz-score")
        self.questions = [QuestionWidget(q, n, self._update_score, source=(sources[n - 1] if sources else ""))
                          for n, q in enumerate(self.question_list, start=1)]
        self.reset_button = widgets.Button(description="Start over", tooltip="Clear every answer")
        self.reset_button.on_click(lambda _: self.reset())
        head = widgets.HTML(f"{_WRAP_STYLE}<h3 style='margin:4px 0'>Quiz: {html.escape(title)}</h3>"
                            f"<div style='color:{_NOTE}'>Pick an answer and press Check. A wrong answer tells you why; "
                            "pick again, or press Try again to clear.</div>")
        super().__init__([head, *self.questions, widgets.HBox([self.score_label, self.reset_button])],
                         layout=widgets.Layout(width="100%", max_width="900px"))
        self.add_class("course-quiz")
        self._shown_in_cell: int | None = None
        self._update_score()

    @property
    def score(self) -> tuple[int, int]:
        """(questions answered right, questions in the quiz)."""
        return sum(q.correct for q in self.questions), len(self.questions)

    def _update_score(self) -> None:
        right, total = self.score
        checked = sum(q.verdict is not None for q in self.questions)
        self.score_label.value = (f"<b>Score: {right}/{total}</b> "
                                  f"<span style='color:{_NOTE}'>({checked} of {total} checked)</span>&nbsp;&nbsp;")

    def reset(self) -> None:
        """Clear every answer (what Start over does)."""
        for q in self.questions:
            q.try_again()

    def text(self) -> str:
        """The questions without their answers, as plain text."""
        return quiz_text(self.title, self.question_list)

    def markdown(self) -> str:
        """The questions without their answers, as Markdown."""
        return quiz_markdown(self.title, self.question_list)

    def _ipython_display_(self) -> None:
        # show_quiz() displays the quiz and returns it; when that call is a cell's last line, IPython
        # would display the returned quiz a second time. It is shown once per cell.
        from IPython import get_ipython

        shell = get_ipython()
        count = getattr(shell, "execution_count", None)
        if count is not None and count == self._shown_in_cell:
            return
        self._shown_in_cell = count
        super()._ipython_display_()


def _show(quiz: Quiz) -> Quiz:
    """Display a quiz in a notebook (or print its text outside one) and return it."""
    from IPython import get_ipython

    if get_ipython() is None:
        print(quiz.text())
    else:
        quiz._ipython_display_()
    return quiz


def make_quiz(name: str) -> Quiz:
    """The quiz widget for one bank, not displayed."""
    bank = load_bank(name)
    return Quiz(bank.title, bank.questions)


def show_quiz(name: str) -> Quiz:
    """Display the quiz of one notebook's bank, e.g. show_quiz("01_gradient_checkpointing"), and return it."""
    return _show(make_quiz(name))


def make_chapter_quiz(n: int = 10, seed: int = 0) -> Quiz:
    """The chapter quiz widget (n questions drawn from every notebook's bank), not displayed."""
    titles = {b.name: b.title for b in all_banks()}
    questions = chapter_questions(n, seed)
    return Quiz(f"Chapter 3, {len(questions)} questions from every notebook", questions,
                sources=[titles[q.bank] for q in questions])


def show_chapter_quiz(n: int = 10, seed: int = 0) -> Quiz:
    """Display a chapter quiz of n questions drawn from every notebook's bank, and return it."""
    return _show(make_chapter_quiz(n, seed))
