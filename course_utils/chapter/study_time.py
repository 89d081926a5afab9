"""How long a notebook takes a learner, counted from the committed notebook and its shipped T4 record
(issue 30: every notebook under 30 minutes). The count is the teaching review's (findings 2026-12-03,
teaching, 3.1):

- its prose (every Markdown cell's words) read at 200 words a minute;
- its output lines (every printed line, and the text of every table and widget) at 2 seconds each; images
  are not counted;
- its run on a free T4, from the shipped T4 check (course_utils.t4check.time_budget, the default path);
  a notebook without a T4 record (11: a CPU and two-GPU lesson) adds nothing here, nor does one the T4 check
  has not run yet (course_utils.chapter.t4.PENDING_T4: its count says so, until the lead ships its record);
- 1 minute for each quiz question (the notebook's own quiz and a chapter quiz's);
- 3 minutes for each "Try it" exercise.

Colab's install in the setup cell comes on top, as in the review.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path
from course_utils.chapter.quiz.bank import load_bank
from course_utils.chapter.t4 import NO_RECORD, PENDING_T4, time_budget

WORDS_PER_MIN = 200
S_PER_OUTPUT_LINE = 2
MIN_PER_QUESTION = 1
MIN_PER_EXERCISE = 3
LIMIT_MIN = 30


@dataclass(frozen=True)
class StudyTime:
    notebook: str
    words: int
    output_lines: int
    t4_run_s: float
    questions: int
    exercises: int

    @property
    def parts_min(self) -> dict[str, float]:
        return {"prose": self.words / WORDS_PER_MIN, "outputs": self.output_lines * S_PER_OUTPUT_LINE / 60,
                "T4 run": self.t4_run_s / 60, "quiz": self.questions * MIN_PER_QUESTION,
                "exercises": self.exercises * MIN_PER_EXERCISE}

    @property
    def minutes(self) -> float:
        return sum(self.parts_min.values())

    def __str__(self) -> str:
        parts = " + ".join(f"{name} {value:.1f}" for name, value in self.parts_min.items())
        t4 = "T4 run not yet checked" if self.notebook in PENDING_T4 else f"{self.t4_run_s:.0f} s on a T4"
        return (f"{self.notebook}: {self.minutes:.1f} min = {parts} ({self.words:,} words, {self.output_lines} output "
                f"lines, {t4}, {self.questions} questions, {self.exercises} exercise(s))")


def prose_words(source: str) -> int:
    """The words of a Markdown cell as a learner reads them: link addresses, HTML comments (the truth test's
    placeholders) and table rules left out."""
    text = re.sub(r"\]\([^)]*\)|<!--.*?-->|<[^>]+>", " ", source, flags=re.S)
    return sum(1 for token in text.split() if re.search(r"[A-Za-z0-9]", token))


def output_lines(cell: dict) -> int:
    """The text lines a code cell's outputs show: stream text, and each display's plain text (a table's or a
    widget's static copy); an image-only output shows none."""
    lines = 0
    for out in cell.get("outputs", []):
        text = "".join(out.get("text", "")) or "".join(out.get("data", {}).get("text/plain", ""))
        if "image/png" in out.get("data", {}) and not out.get("text"):
            text = "" if text.startswith("<Figure") else text
        lines += len(text.splitlines())
    return lines


def quiz_questions(source: str) -> int:
    """Questions of the quizzes a code cell shows (show_quiz(name): its bank's; show_chapter_quiz(n): n)."""

    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = [ast.literal_eval(a) for a in node.args]
            kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            if node.func.id == "show_quiz":
                count += len(load_bank(*args, **kwargs).questions)
            elif node.func.id == "show_chapter_quiz":
                count += kwargs.get("n", args[0] if args else 10)
    return count


def t4_run_s(notebook: str) -> float:
    """The notebook's default path on a free T4, from its shipped T4 check (0 without a record, or before its
    first check)."""

    if notebook in NO_RECORD or notebook in PENDING_T4:
        return 0.0
    return time_budget(notebook, "small").t4_s


def study_time(path: Path) -> StudyTime:
    """The count for one committed notebook."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    name = Path(path).stem
    words = lines = questions = 0
    exercises = 0
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            words += prose_words(source)
            continue
        lines += output_lines(cell)
        if "show_quiz(" in source or "show_chapter_quiz(" in source:
            questions += quiz_questions(source)
        if "check_exercise(" in source:
            exercises += 1
    return StudyTime(name, words, lines, t4_run_s(name), questions, exercises)
