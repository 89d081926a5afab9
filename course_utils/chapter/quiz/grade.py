"""The quiz's marking: `grade(question, answer)`, a pure function (tested without widgets), and what it says."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from course_utils.chapter.quiz.question import Question

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
