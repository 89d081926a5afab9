"""Static gates on the chapter notebooks: they parse, start with the setup cell, carry no widget
state or absolute paths, and their Colab badge points at their own path."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils.notebook import colab_url

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPECTED = ["00_where_memory_goes", "01_gradient_checkpointing", "02_gradient_accumulation",
            "03_efficient_optimizers", "04_mixed_precision", "05_qlora_4bit",
            "06_sequence_length_and_batch", "07_complete_recipe", "08_beyond_the_recipe"]
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:home|root|work|tmp|usr|opt|Users|content)/[\w.\-/]+")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _code_cells(nb: dict) -> list[str]:
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def test_notebooks_exist():
    assert [p.stem for p in NOTEBOOKS] == [n for n in EXPECTED if (ROOT / "notebooks" / f"{n}.ipynb").exists()]
    assert NOTEBOOKS, "no notebooks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_valid_notebook_json(path):
    nb = _load(path)
    assert nb["nbformat"] == 4
    assert nb["cells"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_badge_points_at_own_path(path):
    first = "".join(_load(path)["cells"][0]["source"])
    own = colab_url(path.relative_to(ROOT).as_posix())
    assert own in first, f"{path.name}: the badge should link to {own}"
    assert first.count("colab.research.google.com/github") == 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_first_code_cell_is_the_setup_cell(path):
    first = _code_cells(_load(path))[0]
    assert "google.colab" in first and "pip" in first and "[colab]" in first
    assert not re.search(r"^\s*(import|from)\s+(torch|transformers|course_utils)", first, re.M), (
        "nothing that imports torch may run before the setup cell has installed the stack")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_code_cell_parses(path):
    for i, source in enumerate(_code_cells(_load(path))):
        try:
            ast.parse(source)
        except SyntaxError as exc:
            pytest.fail(f"{path.name} code cell {i} does not parse: {exc}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_widget_state_and_no_absolute_paths(path):
    text = path.read_text()
    nb = json.loads(text)
    assert "widgets" not in nb.get("metadata", {})
    assert "application/vnd.jupyter.widget-state+json" not in text
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            blob = json.dumps(out.get("text", "")) + json.dumps(out.get("data", {}).get("text/plain", ""))
            match = ABSOLUTE_PATH.search(blob)
            assert not match, f"{path.name}: absolute path in an output: {match.group(0)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_executed_with_a_checked_cell(path):
    nb = _load(path)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert any("".join(c["source"]).startswith("# NBVAL_CHECK_OUTPUT") for c in code)
    assert any(c.get("outputs") for c in code), f"{path.name} is committed without outputs"
    assert any("image/png" in o.get("data", {}) for c in code for o in c.get("outputs", [])), "no plot"


def test_badges_are_up_to_date():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "update_badges.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
