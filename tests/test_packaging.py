"""Packaging: the wheel carries the data, the reference runs and the quiz banks, and setuptools builds it
without a warning; the warnings course_utils filters at import stay filtered under pytest.

The wheel is built from a copy of the project (pyproject.toml, README.md, course_utils/, quizzes/) with
the installed setuptools' build backend, as `pip wheel --no-build-isolation` would: offline, a few seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A warning setuptools prints ("SetuptoolsDeprecationWarning: Package 'x' is absent from the `packages`
# configuration ... Package would be ignored", InformationOnly notices); pip relays each as BuildBackendWarning.
SETUPTOOLS_WARNING = re.compile(r"\b\w+Warning\b|InformationOnly|would be ignored")


def _setuptools_new_enough() -> bool:
    """The build needs setuptools 77 (it reads `license = "MIT"`); the dev extra installs it."""
    return int(version("setuptools").split(".")[0]) >= 77


def _build_wheel(tmp_path: Path) -> tuple[Path, str]:
    """Build the project's wheel from a copy, calling setuptools' build backend as pip does (without pip,
    whose versions differ in what they relay): the wheel, and everything the backend printed."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("course_utils", "quizzes"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path / "wheel"
    out.mkdir()
    code = f"import setuptools.build_meta as backend; backend.build_wheel({str(out)!r})"
    proc = subprocess.run([sys.executable, "-W", "always", "-c", code], cwd=src, capture_output=True, text=True,
                          timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    [wheel] = out.glob("*.whl")
    return wheel, log


def _shipped_files() -> set[str]:
    """What the wheel must carry (wheel paths): every file in course_utils/ (code, data, reference runs) and
    the quiz banks from quizzes/, which the wheel carries as course_utils/quizzes/."""
    package = ROOT / "course_utils"
    want = {f"course_utils/{p.relative_to(package).as_posix()}" for p in package.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    want |= {f"course_utils/quizzes/{p.name}" for p in (ROOT / "quizzes").iterdir() if p.suffix in (".yaml", ".md")}
    return want


def test_every_folder_of_course_utils_is_a_listed_package():
    """setuptools ships only the packages pyproject lists: a new subpackage (or data folder) left out of
    the list would be missing from every installed copy."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.relative_to(ROOT).parts) for p in (ROOT / "course_utils").rglob("*")
               if p.is_dir() and "__pycache__" not in p.parts and any(f.is_file() for f in p.iterdir())}
    missing = sorted(folders - listed)
    assert not missing, f"add {missing} to [tool.setuptools] packages in pyproject.toml"


@pytest.mark.skipif(not _setuptools_new_enough(), reason="needs setuptools>=77 (pip install -e '.[dev]')")
def test_wheel_carries_code_data_reference_runs_and_quiz_banks_without_setuptools_warnings(tmp_path):
    wheel, log = _build_wheel(tmp_path)
    assert not SETUPTOOLS_WARNING.search(log), log
    names = set(zipfile.ZipFile(wheel).namelist())
    want = _shipped_files()
    for expected in ("course_utils/data/instructions.jsonl", "course_utils/reference/llama-3.1-8b.jsonl",
                     "course_utils/reference/beyond/peers.json", "course_utils/reference/t4/t4-check.jsonl",
                     "course_utils/quizzes/01_gradient_checkpointing.yaml", "course_utils/quizzes/README.md",
                     "course_utils/results.py"):
        assert expected in want  # the list is not empty by mistake
    assert want <= names, f"missing from the wheel: {sorted(want - names)}"


def _filter_key(action: str, message: str, category: str) -> tuple[str, str, str]:
    return action, message, category or "Warning"


def test_the_filters_course_utils_sets_at_import_are_pytest_filters_too():
    """pytest restores the warning filters after collecting, so those course_utils adds when it is first
    imported (library noise a learner cannot act on) are lost for the tests; pyproject repeats them."""
    code = ("import json, warnings; before = list(warnings.filters); import course_utils; "
            "print(json.dumps([(a, m.pattern if m else '', c.__name__) for a, m, c, mod, ln in warnings.filters "
            "if (a, m, c, mod, ln) not in before]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    package = {_filter_key(*f) for f in json.loads(out)}
    assert package, "course_utils sets no warning filters any more: drop them from pyproject too"
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["filterwarnings"]
    configured = set()
    for line in ini:
        action, message, category = (line.split(":", 4) + ["", ""])[:3]
        configured.add(_filter_key(action, message, category))
    assert package <= configured, sorted(package - configured)


def test_importing_the_stack_after_course_utils_prints_nothing_offline():
    """The notebooks import course_utils, then the libraries: offline (as in CI and the embedded default)
    none of them may print to stderr, which a notebook shows as an error output. Caught here first:
    transformers 5.25 brought `kernels`, and bitsandbytes on a CPU with AVX512-BF16 then logs a hub check."""
    code = "import course_utils, torch, bitsandbytes, transformers, peft, trl, datasets, accelerate"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=300)
    assert run.returncode == 0 and run.stderr == "", run.stderr
