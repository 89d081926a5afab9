"""Nothing given away (issue 30), statically: no committed notebook output holds a worked solution or its
check, each solution cell's output is the "hidden until you ask" copy of course_utils.solution_reveal,
and no quiz question asking for the largest (or most, least, ...) gives its answer away in the figures
printed in its choices. The solution's behaviour (a button; `reveal=True`) is tested in
tests/test_exercises.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course_utils.chapter.exercises import EXERCISES, WITHOUT_EXERCISE, exercise
from course_utils.recipe import base_recipe_for
from course_utils.chapter.quiz.bank import all_banks

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = [p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")) if p.stem not in WITHOUT_EXERCISE]


def _joined(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def outputs_text(cell: dict) -> str:
    """Everything a cell's committed outputs show as text (streams, every text/* entry, tracebacks)."""
    parts = []
    for out in cell.get("outputs", []):
        parts.append(_joined(out.get("text", "")))
        parts += [_joined(v) for k, v in out.get("data", {}).items() if k.startswith("text/")]
        parts += out.get("traceback", [])
    return "\n".join(parts)


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_committed_output_holds_a_worked_solution(path):
    ex = exercise(path.stem)
    cells = _cells(path)
    shown = "\n".join(outputs_text(c) for c in cells)
    assert ex.how not in " ".join(shown.split()), f"{path.name}: the worked solution's 'how it was found' is shown"
    assert "here is the worked solution" not in shown
    assert "<details><summary>Worked solution" not in shown
    assert not re.search(r"(?m)^\s*answer\s*=", shown), f"{path.name}: an output shows an `answer = ...` line"
    if ex.base_name == "base":  # the notebooks' own base recipe, as committed on the CPU
        code = ex.code(base_recipe_for("tiny", "cpu"), "cpu")
        assert code not in shown, f"{path.name}: the worked solution's code is in an output"
    solution = [c for c in cells if "solution" in c.get("metadata", {}).get("tags", [])]
    assert len(solution) == 1, path.name
    assert "".join(solution[0]["source"]).startswith("show_solution(")
    for kind in ("text/plain", "text/markdown"):
        copies = [_joined(o["data"][kind]) for o in solution[0]["outputs"] if kind in o.get("data", {})]
        assert len(copies) == 1 and "Worked solution: hidden until you ask" in copies[0], (path.name, kind)


def test_every_notebook_with_an_exercise_is_checked():
    assert [p.stem for p in NOTEBOOKS] == sorted(EXERCISES)  # the others say why they have none (test_exercises.py)


SUPERLATIVE = re.compile(r"\b(largest|most|biggest|smallest|least|highest|lowest|fewest)\b", re.I)
NUMBER = re.compile(r"\d[\d,.]*\s*(?:[KMGT]i?B\b|%|bytes\b)")  # a measured or estimated figure
KNOWN: set[str] = set()  # questions still giving the answer away (none since bank 07 was rewritten, 2026-12-03)


def _gives_away(question) -> bool:
    """The choices carry figures that differ from one choice to the next: the comparison is printed."""
    figures = {tuple(NUMBER.findall(c.text)) for c in question.choices}
    return len(figures) > 1


def test_no_quiz_choice_prints_the_comparison_it_asks_for():
    giving = {q.id for b in all_banks() for q in b.questions
              if q.type != "numeric" and SUPERLATIVE.search(q.prompt) and _gives_away(q)}
    assert giving - KNOWN == set(), f"choices that give the answer away in their figures: {sorted(giving - KNOWN)}"
    assert KNOWN <= giving, f"no longer giving the answer away, drop from KNOWN: {sorted(KNOWN - giving)}"
    assert {"00-largest-category-tiny", "00-full-ft-optimizer"}.isdisjoint(giving)
