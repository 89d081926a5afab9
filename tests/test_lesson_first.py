"""The lesson first, predict then measure, closings that ask before they tell (issue 30), for notebooks 00-06:

- the T4 timing, the T4 profile and the reference runs' provenance are one collapsed "About these numbers" cell
  after the learner's own run and before "Try it";
- every measuring cell (a run_ladder, sweep or measure call) has a prediction cell before it (`my_guess_...`,
  every_notebook.predict) and a cell after it that compares (Prediction.against);
- every "What we measured" closing asks a question in Markdown and shows its closing_NN text only when asked
  (solution_reveal.AnswerReveal), so no committed output holds it.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from course_utils.chapter.every_notebook import Prediction, predict
from course_utils.chapter.solution_reveal import AnswerReveal
from course_utils.common import MiB

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = [p for p in sorted((ROOT / "notebooks").glob("0[0-6]_*.ipynb"))]
MEASURING = {"run_ladder", "sweep", "measure"}
T4_AND_PROVENANCE = {"how_long_on_a_t4", "profile_table", "describe_reference"}


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _src(cell: dict) -> str:
    return "".join(cell["source"])


def _top_level_calls(source: str) -> set[str]:
    """Names called by a cell's own statements (not inside a function it defines)."""
    names = set()
    for stmt in ast.parse(source).body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        names |= {n.func.id for n in ast.walk(stmt) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return names


def _code(cells):
    return [(i, c) for i, c in enumerate(cells) if c["cell_type"] == "code"]


def test_the_notebooks_are_there():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["00", "01", "02", "03", "04", "05", "06"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_t4_and_provenance_come_after_the_learners_run_in_one_collapsed_cell(path):
    cells = _cells(path)
    about = [i for i, c in _code(cells) if _top_level_calls(_src(c)) & T4_AND_PROVENANCE]
    assert len(about) == 1, f"{path.name}: T4 timing, T4 profile and provenance in cells {about}, not one"
    i = about[0]
    assert _top_level_calls(_src(cells[i])) >= T4_AND_PROVENANCE
    assert _src(cells[i - 1]).startswith("## About these numbers"), path.name
    hidden = cells[i]["metadata"].get("jupyter", {})
    assert hidden.get("source_hidden") and hidden.get("outputs_hidden"), path.name
    assert "nbval-check-output" in cells[i]["metadata"].get("tags", []), path.name
    first_run = min(j for j, c in _code(cells) if _top_level_calls(_src(c)) & MEASURING)
    try_it = next(j for j, c in enumerate(cells) if _src(c).startswith("## Try it"))
    assert first_run < i < try_it, f"{path.name}: the learner's run (cell {first_run}) must come before cell {i}"
    assert not any("How long this takes" in _src(c) or "same notebook on a T4" in _src(c) for c in cells)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_run_has_a_prediction_before_it_and_a_comparison_after_it(path):
    cells = _cells(path)
    runs = [i for i, c in _code(cells) if _top_level_calls(_src(c)) & MEASURING]
    assert runs, path.name
    for i in runs:
        before, after = _src(cells[i - 1]), _src(cells[i + 1])
        assert "predict" in _top_level_calls(before) and "my_guess_" in before, f"{path.name} cell {i - 1}"
        assert ".against(" in after and len(after.splitlines()) == 1, f"{path.name} cell {i + 1}"
        assert cells[i - 2]["cell_type"] == "markdown" and "**Predict first.**" in _src(cells[i - 2]), path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_closing_asks_first_and_tells_only_when_asked(path):
    cells = _cells(path)
    closing = [i for i, c in _code(cells) if "closing_" in _src(c)]
    assert len(closing) == 1, path.name
    i = closing[0]
    question = _src(cells[i - 1])
    assert question.startswith("## What we measured") and "?" in question, path.name
    tree = ast.parse(_src(cells[i]))
    shown = tree.body[-1]
    assert isinstance(shown, ast.Expr) and shown.value.func.id == "AnswerReveal", path.name
    assert isinstance(shown.value.args[0], ast.Lambda), f"{path.name}: the closing is computed when asked"
    assert not any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "print" for n in ast.walk(tree))
    for out in cells[i]["outputs"]:  # as committed: only the prompt to ask
        text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
        assert text.startswith("Show what we measured: hidden until you ask"), (path.name, text[:80])


def test_the_answer_is_computed_and_shown_only_when_asked():
    asked = []
    reveal = AnswerReveal(lambda: asked.append(1) or "On CPU the peak fell 10%.")
    bundle = reveal._repr_mimebundle_()
    assert not asked and not reveal.revealed
    assert "10%" not in bundle["text/plain"] + bundle["text/markdown"]
    assert "hidden until you ask" in bundle["text/plain"] and "Answer the question above first" in bundle["text/markdown"]
    reveal.button.click()
    assert asked == [1] and reveal.revealed and reveal.button.layout.display == "none"
    assert reveal.output.outputs[0]["text"] == "On CPU the peak fell 10%.\n"


def _m(peak: float, acts: float, key: str = "k", fits: bool = True):
    return SimpleNamespace(peak_bytes=peak * MiB, peak_by_category={"activations": acts * MiB}, fits=fits,
                           recipe_obj=SimpleNamespace(key=key), label=f"run {key}", env={"device": "CPU"},
                           error="out of memory")


def test_a_prediction_compares_the_guess_or_the_estimate_with_the_measurement():
    p = Prediction("Activations saved", "activations", 81.2)
    assert str(p).startswith("Activations saved: no guess yet") and "81.2" not in str(p)  # the answer waits
    assert p.against(_m(300, 87.2), _m(220, 6.1)) == (
        "Activations saved: measured 81.1 MiB; no guess; the estimator 81.2 MiB (+0.1 MiB).")
    guessed = Prediction("Activations saved", "activations", 81.2, guess=50)
    assert str(guessed).startswith("Activations saved: your guess 50.0 MiB;") and "81.2" not in str(guessed)
    assert "your guess 50.0 MiB (-31.1 MiB)" in guessed.against(_m(300, 87.2), _m(220, 6.1))
    x = Prediction("Activations, sequence 128 -> 256", "activations", 2.0, guess=4, unit="x")
    assert " ".join(x.against(_m(100, 10), _m(150, 20)).split()) == (
        "Activations, sequence 128 -> 256: measured x2.00; your guess x4.00 (+2.00); the estimator x2.00 (+0.00).")
    peak = Prediction("Peak saved", "peak", 30.0)
    assert "measured 80.0 MiB" in peak.against(_m(300, 1), _m(220, 1))


def test_a_prediction_compares_nothing_it_cannot():
    p = Prediction("Peak saved", "peak", 30.0, keys=("a", "b"))
    assert "does not fit" in p.against(_m(300, 1, "a"), _m(220, 1, "b", fits=False))
    assert "other recipes than the prediction's" in p.against(_m(300, 1, "a"), _m(220, 1, "c"))
    assert "measured 80.0 MiB" in p.against(_m(300, 1, "a"), _m(220, 1, "b"))


def test_predict_takes_the_estimators_figure_and_refuses_a_guess_that_is_not_a_number():
    from course_utils.chapter.every_notebook import estimate_for
    from course_utils.measure import ladder_here
    from course_utils.recipe import base_recipe_for

    rungs, _ = ladder_here(base_recipe_for("tiny", "cpu"), through="+ gradient checkpointing")
    p = predict(None, rungs[0], rungs[1], "activations", "Activations saved by checkpointing")
    before, after = (estimate_for(r).by_category["activations"] / MiB for r in rungs)
    assert p.estimate == pytest.approx(before - after) and p.estimate > 0 and p.guess is None
    assert p.keys == (rungs[0].key, rungs[1].key)
    assert predict(80, rungs[0], rungs[1], "activations", "x").guess == 80.0
    for bad in ("80 MiB", True):
        with pytest.raises(ValueError, match="your guess should be a number"):
            predict(bad, rungs[0], rungs[1], "activations", "x")


def test_notebook_06s_closing_says_how_the_sweep_grew_or_why_it_cannot():
    from course_utils.chapter.sequence_length_and_batch import closing_06

    def point(seq, peak, acts, fits=True):
        return SimpleNamespace(recipe_obj=SimpleNamespace(max_seq_length=seq, micro_batch=4), env={"device": "CPU"},
                               peak_bytes=peak * MiB, peak_by_category={"activations": acts * MiB}, fits=fits,
                               mib=lambda c, p=peak, a=acts: p if c == "peak" else a, label=f"seq {seq}",
                               error="out of memory")

    no, yes = [point(64, 89.1, 20), point(256, 304.3, 80)], [point(64, 68.9, 1.5), point(256, 223.2, 6)]
    assert " ".join(closing_06(no, yes).split()) == (
        "On CPU, from sequence 64 to 256 at micro-batch 4: peak 89.1 -> 304.3 MiB without checkpointing, "
        "68.9 -> 223.2 MiB with it; activations x4.0 and x4.0 for 4x the tokens.")
    assert "seq 256 does not fit" in closing_06(no, [yes[0], point(256, 0, 0, fits=False)])
