"""One table of techniques (recipe.TECHNIQUES): adding a technique is its Recipe field, its FIELD_RULES entry and one
row, and every list of knob names follows: the ladder, describe(), the `course` flags, the path's steps, the planner's
knobs, the rung comparison, notebook 08's exercise knobs and library_map's toggles.

The test adds two techniques to a copy of the package exactly so (a ladder rung, DoRA, and a knob beyond the ladder
that the planner may pick) and reads every derived list in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from course_utils.recipe import LADDER_STEPS, TECHNIQUES, Recipe

ROOT = Path(__file__).resolve().parent.parent

# the three edits of course_utils/recipe.py that add a technique: (anchor, text inserted before it)
EDITS = (
    ("    label: str = field(default=\"\", compare=False)",
     "    use_dora: bool = False  # DoRA: peft's weight-decomposed LoRA\n"
     "    fake_beyond: bool = False  # a knob beyond the ladder\n"),
    ("    \"label\": FieldRule(",
     "    \"use_dora\": _rule_bool(\"peft's DoRA: LoRA on the direction, a magnitude vector apart\", later=True),\n"
     "    \"fake_beyond\": _rule_bool(\"a made-up knob beyond the ladder\", later=True),\n"),
    (")\nBASELINE = ",
     "    Technique((\"use_dora\",), \"DoRA\", rungs=((6.5, \"+ DoRA\", {\"use_dora\": True}),)),\n"
     "    Technique((\"fake_beyond\",), \"fake\", \"beyond\", planner=True, cuda_only=\"pins fake pages\"),\n"),
)

READ = """
import json
from course_utils import checks, cli_recipe, recipe
from course_utils.chapter import exercises, library_map
from course_utils.estimate import plan
from course_utils.show import path

def checks_refusal(r):
    try:
        checks.check_hardware(r)
    except checks.HardwareError as exc:
        return str(exc)
    return ""

r = recipe.Recipe()
rungs = recipe.ladder(r)
dora = rungs[recipe.RUNG_NAMES.index("+ DoRA")]
print(json.dumps({
    "file": recipe.__file__, "key": r.key, "rungs": list(recipe.RUNG_NAMES), "later": sorted(recipe.LATER_FIELDS),
    "describe": r.with_(use_dora=True, fake_beyond=True).describe(),
    "estimate_flags": list(cli_recipe.FLAGS["estimate"]), "run_left_out": cli_recipe.NOT_EXPOSED["run"],
    "steps": [list(s) for s in path.STEPS], "tuning_knobs": list(plan.TUNING_KNOBS),
    "tunings": len(plan.TUNINGS), "tuned": plan.is_tuned(r.with_(fake_beyond=True)),
    "same_as_above": checks._same_as_above(rungs[recipe.RUNG_NAMES.index("+ DoRA") - 1], dora, "cpu"),
    "cuda_only": checks_refusal(r.with_(fake_beyond=True)),
    "beyond_knobs": sorted(exercises.BEYOND_KNOBS), "toggles": [t[0] for t in library_map.TOGGLES],
}))
"""


def test_adding_a_technique_is_one_row_of_the_table(tmp_path):
    shutil.copytree(ROOT / "course_utils", tmp_path / "course_utils",
                    ignore=shutil.ignore_patterns("__pycache__"))
    source = tmp_path / "course_utils" / "recipe.py"
    text = source.read_text()
    for anchor, added in EDITS:
        assert text.count(anchor) == 1, f"recipe.py no longer has {anchor!r} once: update this test's EDITS"
        text = text.replace(anchor, added + anchor)
    source.write_text(text)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-c", READ], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert Path(got["file"]).is_relative_to(tmp_path)  # the copy, not the installed package

    assert got["key"] == Recipe().key  # a later field at its default leaves every older key as it was
    assert {"use_dora", "fake_beyond"} <= set(got["later"])
    names = [label for label, _ in LADDER_STEPS]
    assert got["rungs"] == names[:-1] + ["+ DoRA", names[-1]]  # placed by its rung's place, 6.5
    assert got["describe"].endswith(", DoRA, fake")
    assert {"use_dora", "fake_beyond"} <= set(got["estimate_flags"])  # the estimator reads them: flags
    assert "a rung of the ladder" in got["run_left_out"]["use_dora"]
    assert "beyond the chapter's ladder" in got["run_left_out"]["fake_beyond"]
    assert ["use_dora"] in got["steps"] and ["fake_beyond"] in got["steps"]
    from course_utils.estimate import plan

    # the planner's grid: none, then the first knob (no upcast) with every combination of the others that a Recipe
    # accepts (not Liger with compiled layers): one more knob doubles them
    assert got["tuning_knobs"][-1] == "fake_beyond" and got["tuned"]
    assert got["tunings"] - 1 == 2 * (len(plan.TUNINGS) - 1)
    assert len(plan.TUNINGS) - 1 == 2 ** (len(plan.TUNING_KNOBS) - 1) - 2 ** (len(plan.TUNING_KNOBS) - 3)
    assert not any(t.get("liger_kernels") and t.get("compile_layers") for t in plan.TUNINGS)
    assert "use_dora=True" in got["same_as_above"] and "already in the rung above" in got["same_as_above"]
    assert got["cuda_only"].startswith("fake_beyond=True pins fake pages, which needs a CUDA GPU; this machine trains on")
    assert "fake_beyond" in got["beyond_knobs"] and "use_dora" not in got["beyond_knobs"]
    assert {"use_dora", "fake_beyond"} <= set(got["toggles"])


def test_the_table_names_every_switch_once():
    named = [name for t in TECHNIQUES for name in t.fields]
    assert len(named) == len(set(named))
    assert all(t.where in ("ladder", "beyond", "setup") for t in TECHNIQUES)
    assert all(t.rungs for t in TECHNIQUES if t.where == "ladder")  # a ladder technique has its rung
    assert not any(t.rungs for t in TECHNIQUES if t.where != "ladder")
