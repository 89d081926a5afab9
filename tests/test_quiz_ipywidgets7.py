"""The quiz and the checklist widget under ipywidgets 7.7, the version Colab ships (its front end does
not render ipywidgets-8 widgets, so the Colab setup cell keeps it).

A subprocess with .ipywidgets7/ first on PYTHONPATH runs tests/quiz_drive.py, which answers a choice,
a numeric and a multiple-answer question of a real bank and ticks the checklist exactly as
tests/test_quiz.py does under 8.x; this test checks what it saw with the same `check_session`.
Skipped when .ipywidgets7/ is absent (bash .ci/run creates it; the command is in tests/ipywidgets7.txt),
except in CI, where a missing folder fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quiz_drive import check_session

ROOT = Path(__file__).resolve().parents[1]
IPYWIDGETS7 = ROOT / ".ipywidgets7"
INSTALL = "python -m pip install -q --no-deps --target .ipywidgets7 -r tests/ipywidgets7.txt"


@pytest.fixture
def ipywidgets7() -> Path:
    if not (IPYWIDGETS7 / "ipywidgets").is_dir():
        message = f"ipywidgets 7.7 is not installed in {IPYWIDGETS7.name}/: run `{INSTALL}` (bash .ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return IPYWIDGETS7


def test_quiz_and_checklist_under_ipywidgets_7(ipywidgets7):
    path = os.pathsep.join([str(ipywidgets7), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "quiz_drive.py")], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = json.loads(run.stdout)
    assert seen["ipywidgets"].startswith("7."), seen["ipywidgets"]
    assert Path(seen["ipywidgets_file"]).is_relative_to(ipywidgets7)
    check_session(seen)
