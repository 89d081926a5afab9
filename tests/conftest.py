"""Shared test setup: offline, a private COURSE_HOME per session, and the one shared real measurement.

Cost model (2 CPU cores): importing the training stack takes ~7 s per process, and every
`measure()` starts a fresh process (~10-15 s). So the whole suite runs at most four real
subprocess measurements; the rest use `run_here` (the same code, in this process).
"""

from __future__ import annotations

import os
import tempfile

import pytest

# Set before any test module is collected: huggingface_hub and transformers read these at import.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("MPLBACKEND", "Agg")

# The `course run` arguments the CLI test uses. The session's one real baseline measurement is
# exactly that ladder's first rung, so the CLI finds it in the store instead of measuring it again.
CLI_RUN_ARGS = ("--steps", "4", "--seq", "64", "--micro-batch", "2")


def pytest_collection_finish(session):
    """Freeze what exists once the test modules and the training stack are imported (gc.freeze): every full
    garbage collection (the Trainer starts each train() with one, and the many objects a training run makes
    trigger more) then skips those ~500,000 long-lived objects instead of walking them for ~0.5 s each time.
    Everything a test creates is collected as before. The notebooks run in their own kernels: unaffected."""
    import gc

    import datasets  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401
    from peft import get_peft_model  # noqa: F401  (the lazily imported submodules too)
    from transformers import AutoModelForCausalLM  # noqa: F401
    from trl import SFTTrainer  # noqa: F401

    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def course_home(tmp_path_factory):
    """COURSE_HOME (built models, default results store) lives in a session temp dir.

    Temporary files go there too (here and in measure's children): build() makes a trainer
    output folder with tempfile.mkdtemp for every build and never removes it.
    """
    home = tmp_path_factory.mktemp("course-home")
    scratch = tmp_path_factory.mktemp("tmp")
    mp = pytest.MonkeyPatch()
    mp.setenv("COURSE_HOME", str(home))
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TOKENIZERS_PARALLELISM", "false")
    mp.setenv("TMPDIR", str(scratch))
    mp.setattr(tempfile, "tempdir", str(scratch))
    yield home
    mp.undo()


@pytest.fixture(scope="session")
def tiny_model(course_home):
    """Build the embedded tiny model once per session (in this process, before any child starts)."""
    from course_utils.models import tiny_model_path

    path = tiny_model_path()
    assert path.is_relative_to(course_home)
    return path


@pytest.fixture(scope="session")
def tiny_check_run(tiny_model):
    """run_here of one of estimate.tiny_check_recipes(), by label, each measured once per session (in this
    process, on first use): test_estimate holds the estimator to all of them, and test_measure reads each
    technique's effect off two rungs of its ladder."""
    from course_utils.estimate import tiny_check_recipes
    from course_utils.child import run_here

    recipes = {r.label: r for r in tiny_check_recipes()}
    done = {}

    def get(label: str):
        if label not in done:
            done[label] = run_here(recipes[label])
        return done[label]

    return get


@pytest.fixture(scope="session")
def cli_run_args() -> tuple[str, ...]:
    return CLI_RUN_ARGS


@pytest.fixture(scope="session")
def cli_baseline_recipe():
    """The first rung of `course run CLI_RUN_ARGS`, built by the CLI's own parser and base recipe."""
    from course_utils.cli import build_parser
    from course_utils.cli_recipe import run_recipe
    from course_utils.machine import resolve_precision
    from course_utils.recipe import ladder

    rung = ladder(run_recipe(build_parser().parse_args(["run", *CLI_RUN_ARGS])))[0]
    return rung.with_(precision=resolve_precision(rung.precision), label=rung.label)  # as run_ladder does


@pytest.fixture(scope="session")
def shared_store(course_home):
    """The session's results store, shared by test_measure and test_cli."""
    from course_utils.results import ResultStore

    return ResultStore(course_home / "shared-results.jsonl")


@pytest.fixture(scope="session")
def baseline_measurement(tiny_model, shared_store, cli_baseline_recipe):
    """Real subprocess measurement #1: the CLI ladder's baseline rung, stored in the shared store."""
    from course_utils.measure import measure

    return measure(cli_baseline_recipe, store=shared_store, progress=False)


@pytest.fixture
def ipython_shell(tmp_path, monkeypatch):
    """A real IPython shell (what a notebook kernel runs cells in), history in memory, cleared after."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path))
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=config)
    yield shell
    InteractiveShell.clear_instance()


@pytest.fixture
def no_training(monkeypatch):
    """Fail loudly if anything starts to train: bad values must be refused before."""
    from course_utils import measure as measure_mod

    started = []

    def refuse(*args, **kwargs):
        started.append(args)
        raise AssertionError("a training run started")

    monkeypatch.setattr(measure_mod, "_run_child", refuse)
    monkeypatch.setattr(measure_mod, "run_here", refuse)
    return started


@pytest.fixture
def bf16_anywhere(monkeypatch):
    """The course refuses bf16 on a CPU without AVX512-BF16 (slow there, not wrong): tests of what bf16 keeps or
    computes run on any CPU with the refusal patched away."""
    import course_utils.machine

    monkeypatch.setattr(course_utils.machine, "bf16_supported", lambda: True)
