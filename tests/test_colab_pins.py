"""Colab by its conventions, statically (issue 30): every notebook asks Colab for a T4 GPU runtime and folds its
setup cell to a form, as Unsloth's notebooks do (scripts/notebooks/write_notebooks.py setup writes both from
course_utils.notebook); and the pins never pair JupyterLab 4 with ipywidgets 7, which JupyterLab 4 cannot
render, while Colab (its own front end) keeps its ipywidgets 7.7."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from course_utils.chapter.every_notebook import COLAB_METADATA, SETUP_CELL_METADATA

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_asks_colab_for_a_t4_gpu(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert nb["metadata"]["accelerator"] == "GPU"
    assert nb["metadata"]["colab"]["gpuType"] == "T4" and nb["metadata"]["colab"]["provenance"] == []
    assert nb["metadata"]["kernelspec"]["name"] == "python3"  # what Colab and JupyterLab both start
    setup = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert setup["metadata"]["cellView"] == "form" and "".join(setup["source"]).startswith("#@title ")


def test_the_metadata_is_unsloths_convention():
    assert COLAB_METADATA == {"accelerator": "GPU", "colab": {"gpuType": "T4", "provenance": []}}
    assert SETUP_CELL_METADATA == {"cellView": "form"}


def _requirements(extra: str | None = None) -> dict[str, Requirement]:
    listed = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    return {(r := Requirement(line)).name.lower(): r for line in listed}


def _allowed(name: str, *extras: str | None) -> list[Version]:
    """The releases of `name` (0.0 to 9.9, each minor's .0 and .1, plus 7.7.1 and 8.1.9) that every
    requirement of the core list and these extras accepts."""
    candidates = [Version(f"{major}.{minor}.{patch}") for major in range(10) for minor in range(10) for patch in (0, 1)]
    candidates += [Version("7.7.1"), Version("8.1.9")]
    specs = [r.specifier for extra in (None, *extras) for n, r in _requirements(extra).items() if n == name]
    return sorted(v for v in set(candidates) if all(v in s for s in specs))


def test_the_core_keeps_colabs_ipywidgets_7_7():
    assert Version("7.7.1") in _allowed("ipywidgets")
    assert "jupyterlab" not in _requirements() and "jupyterlab" not in _requirements("colab")


def test_jupyterlab_4_never_comes_with_ipywidgets_7():
    lab = _requirements("lab")
    assert Version("4.2.0") in lab["jupyterlab"].specifier and Version("3.6.0") not in lab["jupyterlab"].specifier
    allowed = _allowed("ipywidgets", "lab")
    assert allowed and all(v.major >= 8 for v in allowed), allowed
    assert "memory-efficient-training[lab]" in PROJECT["optional-dependencies"]["dev"]  # the tests' JupyterLab too


def test_the_browser_test_runs_the_lowest_ipywidgets_lab_allows():
    lines = [ln.strip() for ln in (ROOT / "tests" / "ipywidgets8.txt").read_text().splitlines()]
    (pinned,) = [Version(ln.split("==")[1]) for ln in lines if ln.startswith("ipywidgets==")]
    assert pinned == _allowed("ipywidgets", "lab")[0] == Version("8.0.0")
    assert ".ipywidgets8/" in (ROOT / ".gitignore").read_text().split()
