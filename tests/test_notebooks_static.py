"""Static gates on the chapter notebooks: they parse, start with the setup cell, carry no widget
state or absolute paths, and their Colab badge points at their own path. The Colab setup cell is one
template (course_utils.chapter.every_notebook.SETUP_CELL) in all of them; it is also run here against a fake pip."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from course_utils.common import __version__
from course_utils.chapter.every_notebook import RELEASE_TAG, colab_url, setup_cell

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPECTED = ["00_where_memory_goes", "01_gradient_checkpointing", "02_gradient_accumulation",
            "03_efficient_optimizers", "04_mixed_precision", "05_qlora_4bit",
            "06_sequence_length_and_batch", "07_complete_recipe", "08_after_training",
            "09_beyond_the_recipe", "10_toward_the_limit", "11_more_than_one_gpu"]
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


# --- the notebook is the lesson: its code in cells of about 25 lines, a def where the notebook teaches it ---------
MAX_CELL_LINES = 25  # lines of code (not blank, not comment)
SCRIPT_CELL = "# The source chapter's complete script"  # notebook 07 shows the chapter's script whole
OWN_SCRIPT_CELL = "# In your own script"  # a rung's library lines, whole (tests/test_own_script.py)


def _code_lines(source: str) -> int:
    return sum(1 for line in source.splitlines() if line.strip() and not line.strip().startswith("#"))


def _package_functions() -> set[str]:
    """Every function and class the package defines at module level."""
    names = set()
    for p in (ROOT / "course_utils").rglob("*.py"):
        names |= {n.name for n in ast.parse(p.read_text()).body
                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    return names


def _cell_problems(nb: dict, package: set[str]) -> list[str]:
    """A cell over MAX_CELL_LINES lines of code (other than the setup cell and the chapter's script), and a function
    a cell defines that the package defines too (the lesson's code lives in one place: the notebook)."""
    problems = []
    for i, source in enumerate(_code_cells(nb)):
        defined = [node.name for node in ast.walk(ast.parse(source))
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        twice = sorted(set(defined) & package)
        if twice:
            problems.append(f"code cell {i} defines {', '.join(twice)}, which course_utils defines too")
        lines = _code_lines(source)
        if i > 0 and not source.startswith((SCRIPT_CELL, OWN_SCRIPT_CELL)) and lines > MAX_CELL_LINES:
            problems.append(f"code cell {i} has {lines} lines of code (at most {MAX_CELL_LINES}): split it")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_cells_hold_the_lesson_in_short_cells(path):
    problems = _cell_problems(_load(path), _package_functions())
    assert not problems, f"{path.name}: " + "; ".join(problems)


def test_cell_rule_catches_a_long_cell_and_a_function_defined_twice():
    cell = lambda source: {"cell_type": "code", "source": source}  # noqa: E731
    long = "\n".join(f"x{i} = {i}" for i in range(MAX_CELL_LINES + 1))
    nb = {"cells": [cell(long), cell("def f():\n    return 1"), cell(long), cell(f"{SCRIPT_CELL}\n{long}"),
                    cell("# a comment\n" * 40 + "x = 1")]}
    assert _cell_problems(nb, {"f"}) == [
        "code cell 1 defines f, which course_utils defines too",
        f"code cell 2 has {MAX_CELL_LINES + 1} lines of code (at most {MAX_CELL_LINES}): split it"]
    assert _cell_problems(nb, set())[0].startswith("code cell 2")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_executed_with_a_checked_cell(path):
    nb = _load(path)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert any("nbval-check-output" in c["metadata"].get("tags", []) for c in code)
    assert any(c.get("outputs") for c in code), f"{path.name} is committed without outputs"
    assert any("image/png" in o.get("data", {}) for c in code for o in c.get("outputs", [])), "no plot"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_nbval_markers_are_cell_tags_not_code_comments(path):
    """What nbval should do with a cell is a tag (nbval-check-output, nbval-ignore-output, nbval-skip,
    raises-exception), which the learner does not read as code; no `# NBVAL_...` comment is left."""
    from nbval.plugin import comment_markers, find_comment_markers, metadata_tags

    for n, cell in enumerate(c for c in _load(path)["cells"] if c["cell_type"] == "code"):
        source = "".join(cell["source"])
        assert not list(find_comment_markers(source)), f"{path.name} code cell {n}: an nbval comment"
        assert not any(marker in source for marker in comment_markers), f"{path.name} code cell {n}"
        unknown = [t for t in cell["metadata"].get("tags", []) if t.startswith("nbval") and t not in metadata_tags]
        assert not unknown, f"{path.name} code cell {n}: tags nbval does not know: {unknown}"


def test_badges_are_up_to_date():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "notebooks" / "write_notebooks.py"), "setup", "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# --- the Colab setup cell ------------------------------------------------------------------------
KEPT = ("torch", "numpy", "ipywidgets")  # Colab's own copies, which pip must not replace


def _setup_cell(path: Path) -> dict:
    return next(c for c in _load(path)["cells"] if c["cell_type"] == "code")


def test_every_setup_cell_is_the_template():
    sources = {p.name: "".join(_setup_cell(p)["source"]) for p in NOTEBOOKS}
    assert len(sources) == len(EXPECTED)
    stale = [name for name, source in sources.items() if source != setup_cell()]
    assert not stale, f"setup cell differs from course_utils.chapter.every_notebook.SETUP_CELL in {stale}: run scripts/notebooks/write_notebooks.py setup"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_setup_cell_has_no_outputs(path):
    assert _setup_cell(path)["outputs"] == []


def test_setup_cell_installs_the_release_tag_not_a_branch():
    source = setup_cell()
    assert RELEASE_TAG == f"v{__version__}"
    installs = re.findall(r"git\+https://github\.com/[\w.-]+/[\w.-]+@([\w.-]+)", source)
    assert installs == [f"v{__version__}"], installs
    assert "@main" not in source
    # the badge opens the same release's notebook, so notebook and package always match
    assert f"/blob/{RELEASE_TAG}/" in colab_url("notebooks/x.ipynb") and "/blob/main/" not in colab_url("x.ipynb")


def test_the_version_is_written_once():
    """pyproject.toml takes the version from course_utils.common.__version__ (re-exported as course_utils.__version__), which the release tag derives from."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "course_utils.common.__version__"}


def test_setup_cell_guards():
    source = setup_cell()
    lines = source.splitlines()
    # one screen: at most 25 lines, none cut off at the right edge (about 118 characters show at 1366 px)
    assert len(lines) <= 25 and max(map(len, lines)) <= 100, "keep the setup cell on one screen"
    assert lines[0].startswith("#@title Setup"), "Colab folds a form cell to its #@title line"
    ast.parse(source)
    # a pip constraints file pins Colab's own torch, numpy and ipywidgets
    assert '("torch", "numpy", "ipywidgets")' in source and '"-c", constraints.name' in source
    # pip's output is shown line by line while it runs; when it fails, pip's own error lines, no guessed cause
    assert "subprocess.Popen(" in source and "stderr=subprocess.STDOUT" in source and "check=True" not in source
    assert "raise RuntimeError" in source and "network" not in source.lower()
    # the learner is told whether to restart
    assert "Restart the runtime (Runtime > Restart session)" in source and "no restart needed" in source


def _run_setup_cell(monkeypatch, fake_popen, colab: bool = True) -> dict:
    """Execute the setup cell's code as a kernel would, with subprocess.Popen replaced by a fake pip."""
    if colab:
        monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-test")
    else:
        monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setattr(subprocess, "Popen", fake_popen)
    namespace = {"__name__": "__main__"}
    exec(compile(setup_cell(), "<setup cell>", "exec"), namespace)
    return namespace


class FakePip:
    """Stands in for subprocess.Popen: records the call and the constraints file it names, then answers
    like pip, its lines one at a time (stderr goes where the caller sent it: into stdout when told
    stderr=STDOUT). `streamed` records what the cell had printed when each line was read: pip's progress
    shows while pip runs, not after."""

    def __init__(self, returncode: int, stdout: str = "", stderr: str = "", on_run=None, capsys=None):
        self.code, self.out, self.err, self.on_run, self.capsys = returncode, stdout, stderr, on_run, capsys
        self.calls, self.streamed = [], []
        self.constraints = None

    def __call__(self, cmd, **kwargs):
        self.calls.append((cmd, kwargs))
        assert cmd[1:4] == ["-m", "pip", "install"] and kwargs.get("text") is True
        self.constraints = Path(cmd[cmd.index("-c") + 1]).read_text().split()
        if self.on_run:
            self.on_run()
        merged = kwargs.get("stderr") == subprocess.STDOUT
        text = self.out + (self.err if merged else "")
        fake = self

        class Process:
            returncode = None

            @property
            def stdout(self):
                for line in text.splitlines(keepends=True):
                    if fake.capsys is not None:
                        fake.streamed.append(fake.capsys.readouterr().out)
                    yield line

            def wait(self):
                self.returncode = fake.code
                return fake.code

        return Process()


CONFLICT = ("ERROR: Cannot install memory-efficient-training because these package versions have conflicting "
            "dependencies.\n\nThe conflict is caused by:\n    memory-efficient-training 0.1.0 depends on torch<3 and >=2.4\n"
            "    The user requested (constraint) torch==2.0.1\n")
# pip 25, asked for a tag the repository does not have (the learner-view review's case)
NO_TAG = ("Collecting memory-efficient-training@ git+https://github.com/llm-course/memory-efficient-training@v0.1.0\n"
          "  Cloning https://github.com/llm-course/memory-efficient-training (to revision v0.1.0) to /tmp/pip-req\n"
          "  WARNING: Did not find branch or tag 'v0.1.0', assuming revision or ref.\n"
          "  Running command git checkout -q v0.1.0\n"
          "  error: pathspec 'v0.1.0' did not match any file(s) known to git\n"
          "  error: subprocess-exited-with-error\n"
          "ERROR: Failed to build installable wheels for some pyproject.toml based projects\n")


def test_setup_cell_shows_pips_output_as_it_runs_and_its_error_lines_when_it_fails(monkeypatch, capsys):
    pip = FakePip(1, stdout="Collecting memory-efficient-training[colab]\n", stderr=CONFLICT, capsys=capsys)
    with pytest.raises(RuntimeError) as err:
        _run_setup_cell(monkeypatch, pip)
    shown = "".join(pip.streamed) + capsys.readouterr().out
    assert "Collecting memory-efficient-training" in pip.streamed[1]  # printed before pip's next line came
    assert "Collecting memory-efficient-training" in shown and CONFLICT.strip() in shown  # pip's stdout and stderr
    errors = shown.split("pip's own error lines:")[1].strip().splitlines()
    assert errors[0].startswith("ERROR: Cannot install memory-efficient-training")  # from pip's first error line
    message = str(err.value)
    assert message.startswith("pip failed (exit 1): ERROR: Cannot install memory-efficient-training because")
    assert "network" not in message.lower() and "conflict with Colab" not in message  # no guessed cause
    assert len(pip.calls) == 1


def test_setup_cell_quotes_pips_lowercase_error_lines(monkeypatch, capsys):
    """git's `error:` lines (a missing tag) are pip's error lines too: the message quotes the first."""
    pip = FakePip(1, stdout=NO_TAG)
    with pytest.raises(RuntimeError) as err:
        _run_setup_cell(monkeypatch, pip)
    assert str(err.value).startswith("pip failed (exit 1): error: pathspec 'v0.1.0' did not match any file(s)")
    errors = capsys.readouterr().out.split("pip's own error lines:")[1].strip().splitlines()
    assert errors == [line.strip() for line in NO_TAG.splitlines()[4:]]


def test_setup_cell_pins_colabs_packages_and_says_no_restart_is_needed(monkeypatch, capsys):
    from importlib import metadata

    pip = FakePip(0, stdout="Successfully installed memory-efficient-training-0.1.0\n")
    _run_setup_cell(monkeypatch, pip)
    (cmd, kwargs), = pip.calls
    assert cmd[0] == sys.executable and cmd[-1].endswith(f"@v{__version__}")
    assert pip.constraints == [f"{name}=={metadata.version(name)}" for name in KEPT]  # all three installed here
    out = capsys.readouterr().out
    assert out.strip().splitlines() == [  # pip's own lines, then the cell's
        "Successfully installed memory-efficient-training-0.1.0",
        f"installed memory-efficient-training v{__version__}, keeping {', '.join(pip.constraints)}; no restart needed."]


def test_setup_cell_asks_for_a_restart_when_pip_changed_an_imported_package(monkeypatch, capsys):
    """pip upgrades PyYAML, whose module yaml this kernel has imported; torch is not installed."""
    from importlib import metadata

    import yaml  # noqa: F401  (imported in this kernel)

    installed = {"PyYAML": "5.4", "numpy": "2.0.2", "ipywidgets": "7.7.1", "memory-efficient-training": None}
    dist = lambda name, version: SimpleNamespace(metadata={"Name": name}, version=version)  # noqa: E731
    monkeypatch.setattr(metadata, "distributions",
                        lambda: [dist(n, v) for n, v in installed.items() if v is not None])
    monkeypatch.setattr(metadata, "packages_distributions",
                        lambda: {"yaml": ["PyYAML"], "numpy": ["numpy"], "not_imported_here": ["memory-efficient-training"]})
    pip = FakePip(0, on_run=lambda: installed.update({"PyYAML": "6.0.2", "memory-efficient-training": "0.1.0"}))
    _run_setup_cell(monkeypatch, pip)
    assert pip.constraints == ["numpy==2.0.2", "ipywidgets==7.7.1"]  # torch is not installed: no pin for it
    out = capsys.readouterr().out
    assert "Restart the runtime (Runtime > Restart session), then run the notebook from the next cell" in out
    assert "(PyYAML changed)" in out  # memory-efficient-training is new too, but its module is not imported
    assert "no restart needed" not in out


def test_setup_cell_does_nothing_outside_colab(monkeypatch, capsys):
    pip = FakePip(0)
    _run_setup_cell(monkeypatch, pip, colab=False)
    assert pip.calls == [] and capsys.readouterr().out == ""


# --- static views of the quizzes and the checklist -----------------------------------------------
# GitHub, nbviewer and a notebook opened without a kernel draw no widgets: the committed quiz and
# checklist cells keep the Markdown and text copy the widgets display beside their view
# (course_utils.static_copy); scripts/notebooks/write_notebooks.py clean removes the view and the widget state only.
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
QUIZ_CALLS = {"show_quiz": "make_quiz", "show_chapter_quiz": "make_chapter_quiz"}


def _joined(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _shown(outputs: list, mime: str) -> list[str]:
    """The `mime` entry of each output that has one."""
    return [_joined(o["data"][mime]) for o in outputs if mime in o.get("data", {})]


def _calls(source: str, names) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id in names]


def _quizzes_shown(nb: dict) -> list[tuple[dict, object]]:
    """(cell, the quiz it shows, rebuilt from the cell's call and the banks) for every quiz cell."""
    from course_utils.chapter.quiz import widget as Q

    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        for call in _calls(_joined(cell["source"]), QUIZ_CALLS):
            args = [ast.literal_eval(a) for a in call.args]
            kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
            found.append((cell, getattr(Q, QUIZ_CALLS[call.func.id])(*args, **kwargs)))
    return found


def _answers() -> list[str]:
    """Every explanation, hint and wrong-answer note of every bank: what only a graded answer shows."""
    from course_utils.chapter.quiz.bank import all_banks

    texts = [t for b in all_banks() for q in b.questions
             for t in [q.explanation, q.hint, *(c.explanation for c in q.choices), *(w.explanation for w in q.wrong_answers)]]
    return sorted({t for t in texts if t})


def _unescaped(markdown: str) -> str:
    return re.sub(r"\\([\\*_~<>\[\]])", r"\1", markdown)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_quiz_cells_show_their_questions_statically(path):
    """Each quiz cell's committed output shows every question and choice as Markdown and text."""
    quizzes = _quizzes_shown(_load(path))
    assert quizzes, f"{path.name} has no quiz cell (show_quiz(...))"
    for cell, quiz in quizzes:
        outputs = cell.get("outputs", [])
        markdown, text = _shown(outputs, "text/markdown"), _shown(outputs, "text/plain")
        assert len(markdown) == 1 and len(text) == 1, (
            f"{path.name}: the quiz cell {quiz.title!r} has {len(markdown)} Markdown and {len(text)} text outputs, "
            "not one of each: re-execute the notebook and run scripts/notebooks/write_notebooks.py clean")
        one_line = lambda text: " ".join(text.split())  # noqa: E731  (the text copy is wrapped at 100 characters)
        for rendering in (one_line(_unescaped(markdown[0])), one_line(text[0])):
            for q in quiz.question_list:
                assert one_line(q.prompt) in rendering, f"{path.name}: question {q.id} is missing or stale in the static copy"
                for c in q.choices:
                    assert one_line(c.text) in rendering, f"{path.name}: question {q.id}: choice {c.text!r} is missing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_static_quiz_copies_give_no_answer_away(path):
    """No committed output holds an explanation (shown only after Check), marks a right choice, or
    fills in a numeric answer."""
    outputs = [o for c in _load(path)["cells"] for o in c.get("outputs", [])]
    shown = "\n".join([_joined(o.get("text", "")) for o in outputs]
                      + [_unescaped(_joined(v)) for o in outputs for k, v in o.get("data", {}).items() if k.startswith("text/")])
    leaked = [t for t in _answers() if t in shown]
    assert not leaked, f"{path.name}: committed outputs hold quiz explanations: {leaked[:3]}"
    for cell, quiz in _quizzes_shown(_load(path)):
        for copy in _shown(cell.get("outputs", []), "text/plain") + _shown(cell.get("outputs", []), "text/markdown"):
            marks = set(re.findall(r"^\s+(?:- )?(\(.\)|\[.\]) [A-Z]\. ", copy, re.M))
            assert marks <= {"( )", "[ ]"}, f"{path.name}: a choice is marked in the static quiz: {marks}"
            assert not re.search(r"Answer: (?!_)", copy), f"{path.name}: a numeric answer is filled in"
            assert not re.search(r"\b(correct|right) answer\s*:", copy, re.I)


def test_checklist_cells_show_their_state_statically():
    """The checklist widget's committed output shows each item, ticked or not, as Markdown and text."""
    from course_utils.chapter.complete_recipe import CHECKLIST
    from course_utils.chapter.quiz.static_copy import md_escape

    cells = [(path, c) for path in NOTEBOOKS for c in _load(path)["cells"]
             if c["cell_type"] == "code" and _calls(_joined(c["source"]), {"checklist_widget"})]
    assert cells, "no notebook shows the checklist widget (checklist_widget(...))"
    for path, cell in cells:
        outputs = cell.get("outputs", [])
        markdown, text = _shown(outputs, "text/markdown"), _shown(outputs, "text/plain")
        assert len(markdown) == 1 and len(text) == 1, (
            f"{path.name}: the checklist cell has {len(markdown)} Markdown and {len(text)} text outputs, not one "
            "of each: re-execute the notebook and run scripts/notebooks/write_notebooks.py clean")
        assert "estimated peak" in markdown[0] and "estimated peak" in text[0]
        for item, _, _ in CHECKLIST:
            assert re.search(rf"^\| [\u2611\u2610] (yes|no) \| {re.escape(md_escape(item))} \|", markdown[0], re.M), (
                f"{path.name}: the checklist's Markdown copy has no row for {item!r}")
            assert re.search(rf"^\[[x ]\] {re.escape(item)}", text[0], re.M), (
                f"{path.name}: the checklist's text copy has no line for {item!r}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_output_carries_a_widget_view(path):
    """A widget view is a model id that means nothing without the kernel: the cleaning script removes it."""
    for i, cell in enumerate(_load(path)["cells"]):
        for out in cell.get("outputs", []):
            assert WIDGET_VIEW not in out.get("data", {}), f"{path.name} cell {i}: run scripts/notebooks/write_notebooks.py clean"


def test_committed_notebooks_are_clean():
    """`scripts/notebooks/write_notebooks.py clean` changes nothing in a committed notebook."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("write_notebooks", ROOT / "scripts" / "notebooks" / "write_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    changed, problems = mod.run("clean", NOTEBOOKS, check=True)
    assert problems == []
    assert changed == [], f"run scripts/notebooks/write_notebooks.py clean on {[p.name for p in changed]}"


def test_committed_notebooks_name_the_kernel_as_ipykernel_does():
    """JupyterLab rewrites the kernelspec's display name to the running kernel's ("Python 3 (ipykernel)") when
    it starts: a committed notebook with another name is marked modified as soon as a learner opens it."""
    from ipykernel.kernelspec import get_kernel_dict

    for path in NOTEBOOKS:
        spec = json.loads(path.read_text())["metadata"]["kernelspec"]
        assert spec["display_name"] == get_kernel_dict()["display_name"], path.name
        assert spec["name"] == "python3", path.name


def _course_names(source: str) -> list[tuple[str, str | None, str]]:
    """(module, name or None, what the cell writes) for every course_utils import in a notebook's code, and
    (module, attribute) for every `alias.attribute` on a course module the notebook imported under an alias."""
    tree = ast.parse(source)
    aliases, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_utils"):
            for a in node.names:
                found.append((node.module, a.name, f"from {node.module} import {a.name}"))
                aliases[a.asname or a.name] = (node.module, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("course_utils") and a.asname:
                    aliases[a.asname] = (a.name, None)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            module, name = aliases[node.value.id]
            found.append((f"{module}.{name}" if name else module, node.attr, f"{node.value.id}.{node.attr}"))
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_course_name_a_notebook_uses_exists(path):
    """A notebook that calls a name its course module no longer has fails here, not after a 10-minute nbval run."""
    import importlib

    source = "\n".join(c for c in _code_cells(_load(path))[1:] if not c.lstrip().startswith(("%", "!")))
    missing = []
    for module, name, written in _course_names(source):
        try:
            owner = importlib.import_module(module)
        except ModuleNotFoundError:
            continue  # `alias.attr` where the alias is a class or function, not a module
        if not hasattr(owner, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(written)
    assert not missing, f"{path.name} uses names its modules do not have: {sorted(set(missing))}"


# JupyterLab 4 at 1366 x 768 with the file browser open shows about 118 characters of a code line (measured on
# scripts/notebooks/screenshot_notebooks.py's screens, 2026-12-03); a longer line is cut at the right edge.
MAX_CODE_LINE = 115


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_code_fits_the_screen_and_starts_at_its_first_line(path):
    problems = []
    for i, cell in enumerate(_load(path)["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        if source.startswith("\n"):
            problems.append(f"cell {i} starts with a blank line")
        problems += [f"cell {i}: {len(line)} characters: {line[:60]}..." for line in source.splitlines()
                     if len(line) > MAX_CODE_LINE]
    assert not problems, problems
