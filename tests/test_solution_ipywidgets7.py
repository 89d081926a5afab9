"""The worked solution's button (course_utils.solution_reveal) under ipywidgets 7.7, the version Colab ships: in a
subprocess with .ipywidgets7/ first on PYTHONPATH (tests/test_quiz_ipywidgets7.py says how it is installed),
show_solution shows a button and nothing of the solution; a press shows it."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
from pathlib import Path

from test_quiz_ipywidgets7 import ipywidgets7  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parents[1]
DRIVE = """
import json, ipywidgets
from course_utils.chapter.exercises import exercise, show_solution
from course_utils.recipe import base_recipe_for
base = base_recipe_for("tiny", "cpu")
shown = show_solution("00_where_memory_goes", base, "cpu")
bundle = shown._repr_mimebundle_()
before = {"plain": bundle["text/plain"], "markdown": bundle["text/markdown"], "html": shown.solution.value}
shown.button.click()
print(json.dumps({"ipywidgets": ipywidgets.__version__, "before": before, "after": shown.solution.value,
                  "button": shown.button.layout.display, "code": exercise("00_where_memory_goes").code(base, "cpu")}))
"""


def test_the_solution_button_under_ipywidgets_7(ipywidgets7):  # noqa: F811
    path = os.pathsep.join([str(ipywidgets7), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    run = subprocess.run([sys.executable, "-c", DRIVE], cwd=ROOT, env={**os.environ, "PYTHONPATH": path},
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["ipywidgets"].startswith("7."), seen["ipywidgets"]
    assert seen["code"] not in json.dumps(seen["before"]) and seen["before"]["html"] == ""
    assert "hidden until you ask" in seen["before"]["plain"]
    assert html.escape(seen["code"]) in seen["after"] and seen["button"] == "none"  # the answer cell, in <pre>
