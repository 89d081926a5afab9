"""The quiz's question banks as data: where they are, loading, and validation (every problem of a bank is
reported at once, naming the file and the question), and the chapter quiz's draw from all banks.

The banks are YAML files, one per notebook, in the repository's top-level ``quizzes/`` folder (the
schema is in ``quizzes/README.md``); an installed wheel carries the same files as
``course_utils/quizzes/``. Grading is in ``quiz_grade``, the widget in ``quiz``.
"""

from __future__ import annotations

import copy
import functools
import math
import random
import re
import yaml
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from course_utils.chapter.figures import FactError, render_tree
from course_utils.chapter.quiz.question import Bank, Choice, Question, WrongAnswer, quiz_dir

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


# --- where the banks are -------------------------------------------------------------------------
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
        data = _parsed_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise QuizError([f"{path}: not valid YAML: {e}"]) from None
    except UnicodeDecodeError as e:  # a binary file, or text saved in another encoding
        raise QuizError([f"{path}: not UTF-8 text (byte {e.start} is {e.object[e.start:e.start + 1]!r}); a question "
                         "bank is a YAML text file: save it as UTF-8, or restore it (git checkout -- <file>)."]) from None
    return parse_bank(render_figures(data, str(path)), name=path.stem, source=str(path), path=path)


def _parsed_yaml(text: str) -> Any:
    """yaml.safe_load(text), parsed once per distinct text (the banks are read again and again: the chapter quiz,
    the static copies, the tests); each caller gets its own copy."""
    return copy.deepcopy(_parse_yaml_once(text))


@functools.lru_cache(maxsize=64)
def _parse_yaml_once(text: str) -> Any:
    return yaml.safe_load(text)


def render_figures(data: Any, source: str) -> Any:
    """A bank's `{{ ... }}` placeholders replaced by the named figures' shipped values (course_utils.chapter.figures:
    facts.json, kept current by tests/test_named_figures.py); every placeholder that cannot be rendered is reported
    with its question."""

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


# --- the chapter quiz: questions drawn from every bank of the chapter ----------------------------
CHAPTER_LAST = "10_toward_the_limit"  # notebook 11 (more than one GPU) goes beyond the chapter: its own quiz only


def chapter_banks() -> list[Bank]:
    """The banks of the chapter's notebooks (00 to CHAPTER_LAST), in notebook order."""
    return [b for b in all_banks() if b.name <= CHAPTER_LAST]


def chapter_questions(n: int = 10, seed: int = 0) -> list[Question]:
    """n questions drawn from the chapter's banks, spread over them evenly, in notebook order; same seed, same
    quiz."""
    banks = chapter_banks()
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
