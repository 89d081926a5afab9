"""The quiz's data: a question, its choices and its wrong answers, a bank of them, and where the banks are.

Below the loading and validation (bank.py, which re-exports every name here) and the grading (grade.py), so
that grading a question needs neither the banks nor the facts their figures come from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from course_utils.common import shipped


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


def quiz_dir() -> Path:
    """The folder of question banks: course_utils/quizzes/ in a wheel, else the checkout's quizzes/."""
    wheel, checkout = shipped("quizzes"), shipped().parent / "quizzes"
    for candidate in (wheel, checkout):
        if any(candidate.glob("*.yaml")):
            return candidate
    raise FileNotFoundError(f"no question banks (*.yaml) in {wheel} or {checkout}")
