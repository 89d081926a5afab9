"""The route of a recipe from `run_ladder(base)` to `SFTTrainer(...)` (issue 28: <= 14 stops in <= 7 files, no file
entered more than twice), traced on the default CPU path (the tiny model, in this process).

How it is counted, as the architecture review (shared/findings/2026-12-03-architecture.md, 1.3) counted it: a *call*
is a call into course_utils that passes the recipe on (a Recipe, or a list of them, among its arguments; a course
class's constructor counts, a Recipe property or dunder and what runs inside it does not); a *stop* is a visit to a
file, consecutive calls in one file being one stop; a file is *entered* once per stop in it. README's "The route of
a recipe" has the table.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest

import course_utils
from course_utils import measure
from course_utils.recipe import RUNG_NAMES, Recipe, base_recipe_for
from course_utils.results import ResultStore

PKG = Path(course_utils.__file__).parent


class _Reached(Exception):
    """Raised where SFTTrainer(...) would be built: the route ends there."""


class _Trainer:
    def __init__(self, *args, **kwargs):
        raise _Reached


def _carries_recipe(frame) -> bool:
    code = frame.f_code
    for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
        value = frame.f_locals.get(name)
        if isinstance(value, Recipe) or (isinstance(value, (list, tuple)) and any(isinstance(v, Recipe) for v in value)):
            return True
    return False


def trace_route(tmp_path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """([(file, function)] of every call on the route, in order, ending with ("build.py", "SFTTrainer(...)"),
    [(calling file, called file)] of each call on it that goes from one file into another)."""
    calls, stack, crossings = [], [], []

    def profile(frame, event, arg):
        if event == "return":
            if stack:
                stack.pop()
            return
        if event != "call":
            return
        code = frame.f_code
        if stack and stack[-1] == "off":  # inside a call that is not on the route (a library's, a property)
            stack.append("off")
            return
        if not code.co_filename.startswith(str(PKG)):
            stack.append("off")
            return
        if code.co_name.startswith("<"):  # a comprehension: its calls are its function's
            stack.append("through")
            return
        owner = code.co_qualname.split(".")[0]
        dunder = code.co_name.startswith("__") and not (code.co_name == "__init__" and owner != "Recipe")
        prop = owner == "Recipe" and isinstance(getattr(Recipe, code.co_name, None), property)
        if dunder or prop or not _carries_recipe(frame):
            stack.append("off")
            return
        file = Path(code.co_filename).relative_to(PKG).as_posix()
        caller = next((state[1] for state in reversed(stack) if isinstance(state, tuple)), None)
        if caller is not None and caller != file:
            crossings.append((caller, file))
        calls.append((file, code.co_qualname))
        stack.append(("on", file))

    base = base_recipe_for("tiny", "cpu")
    store = ResultStore(tmp_path / "results.jsonl")
    sys.setprofile(profile)
    try:
        measure.run_ladder(base, store=store, through=RUNG_NAMES[0])
    except _Reached:
        pass
    finally:
        sys.setprofile(None)
    return calls + [("build.py", "SFTTrainer(...)")], crossings


def stops(calls: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """The calls grouped into stops: consecutive calls in one file."""
    out: list[tuple[str, list[str]]] = []
    for file, function in calls:
        if out and out[-1][0] == file:
            out[-1][1].append(function)
        else:
            out.append((file, [function]))
    return out


def test_the_route_from_run_ladder_to_the_trainer_is_short(tmp_path, monkeypatch, tiny_model):
    import trl

    monkeypatch.setattr(trl, "SFTTrainer", _Trainer)
    calls, crossings = trace_route(tmp_path)
    route = stops(calls)
    entered = Counter(file for file, _ in route)
    shown = "\n".join(f"{i:2} {file}: {', '.join(fs)}" for i, (file, fs) in enumerate(route, 1))
    assert calls[0] == ("measure.py", "run_ladder") and ("build.py", "build") in calls, shown
    assert len(route) <= 10 and len(entered) <= 7, shown  # 10 stops in 7 files (14 stops before the checks went)
    # a recipe is checked once, where it enters (checks.ladder_here): not again in measure_all, nor in
    # check_runnable (Recipe validates itself when made), nor in build (measure tells it the recipe was checked)
    assert [f for _, f in calls].count("check_runnable") == 1 and [f for _, f in calls].count("check_hardware") == 1, shown
    assert "Recipe.validate" not in [f for _, f in calls], shown
    # no file entered more than twice (the target): measure.py starts the route and takes it back once,
    # after the ladder is built and checked in checks.py; recipe.py builds the rungs and writes the record
    assert max(entered.values()) <= 2, shown
    # counted by calls instead (a file is entered when a call from another file goes into it; coming back from a
    # call is not entering): every file is entered once but recipe.py, the recipe's own methods, three times
    # (ladder, ladder_here's with_ for the precision here, and the child's to_dict for the record)
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    table = re.findall(r"^\| (\d+) \| `([\w/]+\.py)` \|", readme.split("**The route of a recipe**")[1], re.M)
    assert [file for _, file in table] == [file for file, _ in route], ("README's route table is stale", shown)
    called_into = Counter(called for _, called in crossings)
    assert called_into["recipe.py"] <= 3 and all(n == 1 for f, n in called_into.items() if f != "recipe.py"), \
        (called_into, crossings)
    assert "measure.py" not in called_into, crossings  # the route starts there, and nothing calls back into it


def test_build_checks_the_hardware_unless_told_the_recipe_was_checked(monkeypatch, tiny_model):
    from course_utils import build as build_mod
    from course_utils.machine import HardwareError

    asked = []

    def refuse(recipe):
        asked.append(recipe)
        raise HardwareError("not on this machine")

    monkeypatch.setattr(build_mod, "check_hardware", refuse)
    recipe = base_recipe_for("tiny", "cpu")
    with pytest.raises(HardwareError, match="not on this machine"):
        build_mod.build(recipe)
    assert asked == [recipe]
