"""End-of-notebook quizzes: question banks as data, validation, grading, and an ipywidgets quiz.

The banks are YAML files, one per notebook, in the repository's top-level ``quizzes/`` folder (the
schema is in ``quizzes/README.md``); an installed wheel carries the same files as
``course_utils/quizzes/``. In a notebook::

    from course_utils.quiz import show_quiz
    show_quiz("01_gradient_checkpointing")

``grade(question, answer)`` is the whole of the marking: a pure function, so it is tested without
widgets. The widget is built from core ipywidgets only, and only from what both 7.7 (Colab's) and 8.x
have (Colab renders core widgets without a custom widget manager), and it carries a plain-text and Markdown copy of the questions, without the answers, for
places that cannot run widgets (GitHub, nbviewer, a notebook saved without widget state).
"""

from __future__ import annotations

import html
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import yaml

from .static_copy import StaticCopy
from .static_copy import md_escape as _md
from .tables import wrap

TYPES = ("single", "multiple", "numeric")
_ID = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_BANK_KEYS = {"title", "questions"}
_QUESTION_KEYS = {
    "single": {"id", "type", "prompt", "choices"},
    "multiple": {"id", "type", "prompt", "choices"},
    "numeric": {"id", "type", "prompt", "answer", "tolerance", "unit", "explanation", "hint", "wrong_answers"},
}
_CHOICE_KEYS = {"text", "correct", "explanation"}
_WRONG_KEYS = {"answer", "explanation"}


class QuizError(ValueError):
    """A question bank is malformed. Each line names the file, the question id and the problem."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


# --- the data ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Choice:
    """One answer choice of a single- or multiple-choice question."""

    text: str
    correct: bool
    explanation: str  # shown when the learner picks it: a wrong choice teaches something too


@dataclass(frozen=True)
class WrongAnswer:
    """A common wrong answer to a numeric question, and what it teaches."""

    value: float
    explanation: str


@dataclass(frozen=True)
class Question:
    """One question. Choice questions use `choices`; numeric ones use `answer` and `tolerance`."""

    id: str
    type: str  # "single", "multiple" or "numeric"
    prompt: str
    choices: tuple[Choice, ...] = ()
    answer: float | None = None
    tolerance: float = 0.0  # absolute: a right answer is within answer +- tolerance
    unit: str = ""
    explanation: str = ""  # numeric: shown with a right answer
    hint: str = ""  # numeric: shown with a wrong answer that no `wrong_answers` entry explains
    wrong_answers: tuple[WrongAnswer, ...] = ()
    bank: str = ""  # the bank (file stem) it came from

    @property
    def right_choices(self) -> tuple[int, ...]:
        """Indexes of the right choices (empty for a numeric question)."""
        return tuple(i for i, c in enumerate(self.choices) if c.correct)


@dataclass(frozen=True)
class Bank:
    """A question bank: one YAML file, one notebook."""

    name: str  # file stem, e.g. "01_gradient_checkpointing"
    title: str
    questions: tuple[Question, ...]
    path: Path | None = None

    def __len__(self) -> int:
        return len(self.questions)


# --- where the banks are -------------------------------------------------------------------------
def quiz_dir() -> Path:
    """The folder of question banks: course_utils/quizzes/ in a wheel, else the checkout's quizzes/."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "quizzes", here.parent / "quizzes"):
        if any(candidate.glob("*.yaml")):
            return candidate
    raise FileNotFoundError(f"no question banks (*.yaml) in {here / 'quizzes'} or {here.parent / 'quizzes'}")


def bank_names() -> list[str]:
    """Names of every bank, in notebook order."""
    return sorted(p.stem for p in quiz_dir().glob("*.yaml"))


def _resolve(name: str) -> Path:
    """A bank's file from its name, a unique prefix ("01") or a notebook file name."""
    stem = Path(name).stem
    names = bank_names()
    if stem in names:
        return quiz_dir() / f"{stem}.yaml"
    matches = [n for n in names if n.startswith(stem)]
    if len(matches) == 1:
        return quiz_dir() / f"{matches[0]}.yaml"
    raise KeyError(f"no single question bank called {name!r}; the banks are: {', '.join(names)}")


# --- loading and validation ----------------------------------------------------------------------
def load_bank(name: str | Path) -> Bank:
    """Load and validate one bank, by name ("01_gradient_checkpointing", or "01") or by path."""
    path = Path(name) if str(name).endswith((".yaml", ".yml")) else _resolve(str(name))
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise QuizError([f"{path}: not valid YAML: {e}"]) from None
    except UnicodeDecodeError as e:  # a binary file, or text saved in another encoding
        raise QuizError([f"{path}: not UTF-8 text (byte {e.start} is {e.object[e.start:e.start + 1]!r}); a question "
                         "bank is a YAML text file: save it as UTF-8, or restore it (git checkout -- <file>)."]) from None
    return parse_bank(render_figures(data, str(path)), name=path.stem, source=str(path), path=path)


def render_figures(data: Any, source: str) -> Any:
    """A bank's `{{ ... }}` placeholders replaced by the figures they name (course_utils.facts); every
    placeholder that cannot be rendered is reported with its question."""
    from .facts import FactError, render_tree

    if not isinstance(data, dict) or not isinstance(data.get("questions"), list):
        return data
    problems, questions = [], []
    for i, item in enumerate(data["questions"]):
        try:
            questions.append(render_tree(item))
        except FactError as e:
            qid = item.get("id") if isinstance(item, dict) else None
            problems.append(f"{source}: question {qid or '#' + str(i + 1)!r}: {e}")
    if problems:
        raise QuizError(problems)
    return {**data, "title": render_tree(data.get("title")), "questions": questions}


def all_banks() -> list[Bank]:
    """Every bank, validated, with ids checked for uniqueness across banks (the chapter quiz mixes them)."""
    banks = [load_bank(quiz_dir() / f"{n}.yaml") for n in bank_names()]
    seen: dict[str, str] = {}
    problems = []
    for bank in banks:
        for q in bank.questions:
            if q.id in seen:
                problems.append(f"{bank.path}: question {q.id!r}: id already used in {seen[q.id]}")
            seen.setdefault(q.id, str(bank.path))
    if problems:
        raise QuizError(problems)
    return banks


def parse_bank(data: Any, name: str, source: str = "<bank>", path: Path | None = None) -> Bank:
    """Validate a bank's parsed YAML and build it; every problem found is reported at once."""
    problems: list[str] = []
    if not isinstance(data, dict):
        raise QuizError([f"{source}: the file must be a mapping with 'title' and 'questions'"])
    for key in sorted(set(data) - _BANK_KEYS):
        problems.append(f"{source}: unknown top-level key {key!r} (allowed: title, questions)")
    title = data.get("title")
    if not isinstance(title, str) or not title.strip():
        problems.append(f"{source}: 'title' must be a non-empty string")
    raw = data.get("questions")
    if not isinstance(raw, list) or not raw:
        problems.append(f"{source}: 'questions' must be a non-empty list")
        raw = []
    questions, ids = [], set()
    for i, item in enumerate(raw):
        qid = item.get("id") if isinstance(item, dict) else None
        named = isinstance(qid, str) and qid
        where = f"{source}: question {qid!r}" if named else f"{source}: question #{i + 1} (no id)"
        found: list[str] = []
        if named:
            if qid in ids:
                found.append("duplicate id: another question in this file has it")
            ids.add(qid)
        question = _parse_question(item, name, found)
        problems += [f"{where}: {p}" for p in found]
        if question is not None and not found:
            questions.append(question)
    if problems:
        raise QuizError(problems)
    return Bank(name=name, title=title.strip(), questions=tuple(questions), path=path)


def _text(value: Any, what: str, problems: list[str], required: bool = True) -> str:
    """A non-empty string, or a problem saying what is wrong with it."""
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        hint = " (quote it in the YAML)" if isinstance(value, (int, float, bool)) else ""
        problems.append(f"{what} must be a non-empty string{hint}")
        return ""
    return value.strip()


def _number(value: Any) -> float | None:
    """A finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _parse_question(item: Any, bank: str, problems: list[str]) -> Question | None:
    """Build one question, appending what is wrong with it to `problems`."""
    if not isinstance(item, dict):
        problems.append("must be a mapping")
        return None
    qid = item.get("id")
    if not isinstance(qid, str) or not qid:
        problems.append("'id' is missing")
    elif not _ID.match(qid):
        problems.append(f"id {qid!r} must be lowercase letters, digits, '-', '_' or '.'")
    qtype = item.get("type")
    if qtype not in TYPES:
        problems.append(f"'type' must be one of {', '.join(TYPES)}, not {qtype!r}")
        return None
    for key in sorted(set(item) - _QUESTION_KEYS[qtype]):
        problems.append(f"unknown key {key!r} for a {qtype} question")
    prompt = _text(item.get("prompt"), "'prompt'", problems)
    if qtype == "numeric":
        return _parse_numeric(item, qid, prompt, bank, problems)
    choices = _parse_choices(item.get("choices"), problems)
    right = sum(c.correct for c in choices)
    if choices and qtype == "single" and right != 1:
        problems.append(f"a single-choice question needs exactly one right answer, it has {right}")
    if choices and qtype == "multiple" and right == 0:
        problems.append("a multiple-choice question needs at least one right answer, it has none")
    return Question(id=qid or "", type=qtype, prompt=prompt, choices=tuple(choices), bank=bank)


def _parse_choices(raw: Any, problems: list[str]) -> list[Choice]:
    """The choices of a single- or multiple-choice question."""
    if not isinstance(raw, list) or len(raw) < 2:
        problems.append("'choices' must be a list of at least two choices")
        return []
    choices = []
    for j, c in enumerate(raw, start=1):
        if not isinstance(c, dict):
            problems.append(f"choice {j} must be a mapping with text, correct, explanation")
            continue
        for key in sorted(set(c) - _CHOICE_KEYS):
            problems.append(f"choice {j}: unknown key {key!r} (allowed: text, correct, explanation)")
        text = _text(c.get("text"), f"choice {j}: 'text'", problems)
        explanation = _text(c.get("explanation"), f"choice {j}: 'explanation'", problems)
        if not isinstance(c.get("correct"), bool):
            problems.append(f"choice {j}: 'correct' must be true or false")
        choices.append(Choice(text=text, correct=c.get("correct") is True, explanation=explanation))
    texts = [c.text for c in choices]
    for t in sorted({t for t in texts if t and texts.count(t) > 1}):
        problems.append(f"two choices have the same text {t!r}")
    return choices


def _parse_numeric(item: dict, qid: Any, prompt: str, bank: str, problems: list[str]) -> Question:
    """A numeric question: answer, tolerance (absolute, or "5%" of the answer), explanation."""
    answer = _number(item.get("answer"))
    if answer is None:
        problems.append("'answer' must be a number")
    tolerance = _tolerance(item.get("tolerance"), answer, problems)
    explanation = _text(item.get("explanation"), "'explanation'", problems)
    unit = _text(item.get("unit"), "'unit'", problems, required=False)
    hint = _text(item.get("hint"), "'hint'", problems, required=False)
    wrong = []
    raw = item.get("wrong_answers") or []
    if not isinstance(raw, list):
        problems.append("'wrong_answers' must be a list of {answer, explanation}")
        raw = []
    for j, w in enumerate(raw, start=1):
        if not isinstance(w, dict) or set(w) != _WRONG_KEYS:
            problems.append(f"wrong answer {j} must have exactly 'answer' and 'explanation'")
            continue
        value = _number(w["answer"])
        if value is None:
            problems.append(f"wrong answer {j}: 'answer' must be a number")
            continue
        if answer is not None and abs(value - answer) <= tolerance:
            problems.append(f"wrong answer {j} ({w['answer']}) is within the tolerance of the right answer")
        wrong.append(WrongAnswer(value, _text(w["explanation"], f"wrong answer {j}: 'explanation'", problems)))
    return Question(id=qid or "", type="numeric", prompt=prompt, answer=answer, tolerance=tolerance, unit=unit,
                    explanation=explanation, hint=hint, wrong_answers=tuple(wrong), bank=bank)


def _tolerance(raw: Any, answer: float | None, problems: list[str]) -> float:
    """Absolute tolerance from a number or from a percentage string such as "5%"."""
    if raw is None:
        problems.append("a numeric question needs a 'tolerance' (0 for an exact answer)")
        return 0.0
    if isinstance(raw, str) and raw.strip().endswith("%"):
        try:
            pct = float(raw.strip()[:-1])
        except ValueError:
            pct = -1.0
        if pct < 0 or not math.isfinite(pct):
            problems.append(f"'tolerance' {raw!r} is not a valid percentage")
            return 0.0
        return abs(answer or 0.0) * pct / 100
    value = _number(raw)
    if value is None or value < 0:
        problems.append(f"'tolerance' must be a number >= 0 or a percentage like '5%', not {raw!r}")
        return 0.0
    return value


# --- grading -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Feedback:
    """Feedback on one choice (or one typed number): is it right, and why."""

    text: str
    correct: bool
    explanation: str


@dataclass(frozen=True)
class Verdict:
    """What `grade` says. `answered` is False when there was nothing to grade (no pick, not a number)."""

    answered: bool
    correct: bool
    message: str
    feedback: tuple[Feedback, ...] = ()


def grade(question: Question, answer: Any) -> Verdict:
    """Grade an answer: a choice index (single), a collection of indexes (multiple), a number or text (numeric)."""
    if question.type == "single":
        return _grade_single(question, answer)
    if question.type == "multiple":
        return _grade_multiple(question, answer)
    return _grade_numeric(question, answer)


def _index(question: Question, i: Any) -> int:
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(question.choices):
        raise ValueError(f"question {question.id!r}: {i!r} is not a choice index (0..{len(question.choices) - 1})")
    return i


def _grade_single(q: Question, answer: Any) -> Verdict:
    if answer is None:
        return Verdict(False, False, "Pick an answer first.")
    i = _index(q, answer)
    chosen = q.choices[i]
    mine = Feedback(chosen.text, chosen.correct, chosen.explanation)
    if not chosen.correct:
        return Verdict(True, False, "Not quite. Read why, then pick another answer.", (mine,))
    others = tuple(Feedback(c.text, False, c.explanation) for j, c in enumerate(q.choices) if j != i)
    return Verdict(True, True, "Correct!", (mine, *others))


def _grade_multiple(q: Question, answer: Any) -> Verdict:
    if isinstance(answer, str):
        raise ValueError(f"question {q.id!r}: give a collection of choice indexes, not a string")
    if answer is None:
        picked: set[int] = set()
    elif isinstance(answer, int):
        picked = {_index(q, answer)}
    else:
        picked = {_index(q, i) for i in answer}
    if not picked:
        return Verdict(False, False, "Pick at least one answer first.")
    right = set(q.right_choices)
    if picked == right:
        fb = tuple(Feedback(c.text, c.correct, c.explanation) for c in q.choices)
        return Verdict(True, True, "Correct! All the right answers and none of the wrong ones.", fb)
    fb = tuple(Feedback(q.choices[i].text, q.choices[i].correct, q.choices[i].explanation) for i in sorted(picked))
    wrong_picks, missed = len(picked - right), len(right - picked)
    parts = []
    if wrong_picks:
        parts.append(f"{wrong_picks} of your picks {'is' if wrong_picks == 1 else 'are'} wrong")
    if missed:
        parts.append("at least one right answer is missing")
    return Verdict(True, False, f"Not quite: {' and '.join(parts)}.", fb)


def parse_number(answer: Any) -> float | None:
    """A number from what a learner typed ("1,050", " 8 ", "4.1e3"), or None."""
    if isinstance(answer, bool) or answer is None:
        return None
    if isinstance(answer, (int, float)):
        value = float(answer)
    else:
        try:
            value = float(str(answer).strip().replace(",", "").replace("_", ""))
        except ValueError:
            return None
    return value if math.isfinite(value) else None


def _fmt(x: float) -> str:
    return f"{x:g}" if abs(x) < 1e6 else f"{x:,.0f}"


def _grade_numeric(q: Question, answer: Any) -> Verdict:
    value = parse_number(answer)
    if value is None:
        return Verdict(False, False, "Type a number first (for example 8 or 0.5).")
    shown = f"{_fmt(value)} {q.unit}".strip()
    slack = 1e-9 * max(1.0, abs(q.answer))  # float noise: 0.1 + 0.2 is within a tolerance of 0.3
    if abs(value - q.answer) <= q.tolerance + slack:
        return Verdict(True, True, "Correct!", (Feedback(shown, True, q.explanation),))
    for w in q.wrong_answers:
        if abs(value - w.value) <= q.tolerance + slack:
            return Verdict(True, False, "Not quite. Read why, then try another number.",
                           (Feedback(shown, False, w.explanation),))
    return Verdict(True, False, "Not quite. Try another number.", (Feedback(shown, False, q.hint),) if q.hint else ())


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
_GREEN, _RED, _GREY = "#1a7f37", "#cf222e", "#57606a"


def _feedback_html(verdict: Verdict) -> str:
    """The verdict as HTML: the message, then each choice's explanation."""
    color = _GREEN if verdict.correct else (_RED if verdict.answered else _GREY)
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


class QuestionWidget(widgets.VBox):
    """One question: its choices (or a number box), Check, Try again, and the feedback."""

    def __init__(self, question: Question, number: int, on_graded=None, source: str = ""):
        self.question = question
        self.verdict: Verdict | None = None
        self._on_graded = on_graded or (lambda: None)
        where = f' <span style="color:{_GREY}">({html.escape(source)})</span>' if source else ""
        header = widgets.HTML(
            f'<div style="line-height:1.4"><b>{number}.</b> {_html(question.prompt)} '
            f'<i style="color:{_GREY}">({_kind(question)})</i>{where}</div>',
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
        self.check_button = widgets.Button(description="Check", button_style="primary", tooltip="Check my answer")
        self.again_button = widgets.Button(description="Try again", tooltip="Clear my answer and start over")
        self.again_button.layout.display = "none"
        self.feedback = widgets.HTML("")
        for w, cls in ((self.check_button, "course-quiz-check"), (self.again_button, "course-quiz-again"),
                       (self.feedback, "course-quiz-feedback")):
            w.add_class(cls)
        self.check_button.on_click(lambda _: self.check())
        self.again_button.on_click(lambda _: self.try_again())
        super().__init__([header, *boxes, widgets.HBox([self.check_button, self.again_button]), self.feedback],
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

    def _set_enabled(self, enabled: bool) -> None:
        for w in (self.controls if isinstance(self.controls, list) else [self.controls]):
            w.disabled = not enabled
        self.check_button.disabled = not enabled

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
        head = widgets.HTML(f"<h3 style='margin:4px 0'>Quiz: {html.escape(title)}</h3>"
                            f"<div style='color:{_GREY}'>Pick an answer and press Check. A wrong answer tells you why; "
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
                                  f"<span style='color:{_GREY}'>({checked} of {total} checked)</span>&nbsp;&nbsp;")

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


def chapter_questions(n: int = 10, seed: int = 0) -> list[Question]:
    """n questions drawn from all banks, spread over them evenly, in notebook order; same seed, same quiz."""
    banks = all_banks()
    total = sum(len(b) for b in banks)
    if not 1 <= n <= total:
        raise ValueError(f"n must be between 1 and {total} (the questions in all banks), not {n}")
    rng = random.Random(seed)
    pools = [rng.sample(b.questions, len(b.questions)) for b in banks]
    order = rng.sample(range(len(banks)), len(banks))  # which banks give an extra question when n is uneven
    taken: list[list[Question]] = [[] for _ in banks]
    while sum(map(len, taken)) < n:
        for k in order:
            if pools[k] and sum(map(len, taken)) < n:
                taken[k].append(pools[k].pop())
    return [q for group in taken for q in group]


def make_chapter_quiz(n: int = 10, seed: int = 0) -> Quiz:
    """The chapter quiz widget (n questions drawn from every notebook's bank), not displayed."""
    titles = {b.name: b.title for b in all_banks()}
    questions = chapter_questions(n, seed)
    return Quiz(f"Chapter 3, {len(questions)} questions from every notebook", questions,
                sources=[titles[q.bank] for q in questions])


def show_chapter_quiz(n: int = 10, seed: int = 0) -> Quiz:
    """Display a chapter quiz of n questions drawn from every notebook's bank, and return it."""
    return _show(make_chapter_quiz(n, seed))
