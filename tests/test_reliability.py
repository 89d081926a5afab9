"""Bad input and faults (issue 14): each gives a clear error naming what was wrong and what to do, or a
correct result; nothing hangs and nothing wrong is stored. Fast: no training, no process start.

The store: a bad line is skipped with a warning naming file, line and field; an unwritable store is
reported before measuring (ResultStore.check_writable). Quiz banks: a binary file names the file.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import warnings
from importlib import resources
from pathlib import Path

import pytest

from course_utils.chapter import t4 as t4check
from course_utils.chapter.quiz.bank import QuizError, load_bank
from course_utils.recipe import Recipe
from course_utils.results import (NOT_RESULTS_STORES, Measurement, ResultLineError, ResultStore, StoreError,
                                  all_reference_results, default_store)

MiB = 1024**2


def good(label: str = "baseline", **recipe_changes) -> Measurement:
    """A valid measurement of Recipe(**recipe_changes), as a run on a CPU would store it."""
    recipe = Recipe(label=label, **recipe_changes)
    return Measurement(recipe=recipe.to_dict(), recipe_key=recipe.key, env={"device": "TestDevice"}, env_key="envA",
                       status="ok", peak_bytes=44 * MiB, peak_by_category={"parameters": 10 * MiB, "other": 0},
                       tokens_per_s=1000.0, losses=[2.5, 2.4], precision="fp32", trainable_params=1000,
                       model_bytes=4 * MiB, duration_s=3.5, startup_s=0.0, build_s=1.0, notes=["a note"],
                       date="2025-01-01T00:00:00+00:00", command="pytest")


def line_with(**changes) -> str:
    """The JSON line of good() with some fields replaced (a hand-edited or damaged line)."""
    return json.dumps(json.loads(good().to_json()) | changes)


def recipe_with(**changes) -> dict:
    """good()'s recipe dict with some knobs replaced, its stored key left as it was."""
    return good().recipe | changes


@pytest.fixture
def store(tmp_path):
    return ResultStore(tmp_path / "results.jsonl")


# --- the store validates each line on read -------------------------------------------------------

BAD_LINES = {  # what a line holds -> the field the warning must name
    "micro_batch 0": (line_with(recipe=recipe_with(micro_batch=0)), "micro_batch"),
    "peak_bytes text": (line_with(peak_bytes="lots"), "peak_bytes"),
    "peak_bytes negative": (line_with(peak_bytes=-1), "peak_bytes"),
    "peak_bytes a bool": (line_with(peak_bytes=True), "peak_bytes"),
    "peak_bytes a float": (line_with(peak_bytes=1.5), "peak_bytes"),
    "model_bytes null": (line_with(model_bytes=None), "model_bytes"),
    "unknown status": (line_with(status="maybe"), "status"),
    "tokens_per_s 0": (line_with(tokens_per_s=0), "tokens_per_s"),
    "tokens_per_s negative": (line_with(tokens_per_s=-5.0), "tokens_per_s"),
    "tokens_per_s text": (line_with(tokens_per_s="fast"), "tokens_per_s"),
    "tokens_per_s NaN": (line_with(tokens_per_s=float("nan")), "tokens_per_s"),
    "a NaN loss": (line_with(losses=[2.5, float("nan")]), "losses"),
    "an infinite loss": (line_with(losses=[float("inf")]), "losses"),
    "losses text": (line_with(losses="2.5"), "losses"),
    "a null loss": (line_with(losses=[2.5, None]), "losses"),
    "cuda peak negative": (line_with(cuda_max_allocated=-1), "cuda_max_allocated"),
    "duration infinite": (line_with(duration_s=float("inf")), "duration_s"),
    "duration negative": (line_with(duration_s=-1.0), "duration_s"),
    "category bytes text": (line_with(peak_by_category={"activations": "x"}), "peak_by_category"),
    "notes text": (line_with(notes="one note"), "notes"),
    "env a list": (line_with(env=["cpu"]), "env"),
    "precision unknown": (line_with(precision="fp8"), "precision"),
    "empty env_key": (line_with(env_key=""), "env_key"),
    "recipe not an object": (line_with(recipe="baseline"), "recipe"),
    "recipe with an unknown knob": (line_with(recipe=recipe_with(flash=True)), "flash"),
    "recipe learning rate text": (line_with(recipe=recipe_with(learning_rate="2e-4")), "learning_rate"),
    "recipe boolean knob as text": (line_with(recipe=recipe_with(gradient_checkpointing="yes")),
                                    "gradient_checkpointing"),
    "recipe lora_alpha text": (line_with(recipe=recipe_with(lora_alpha="32")), "lora_alpha"),
    "recipe lora_targets a number": (line_with(recipe=recipe_with(lora_targets=5)), "recipe"),
    "recipe edited, key kept": (line_with(recipe=recipe_with(micro_batch=2)), "recipe_key"),
    "a JSON list": (json.dumps([1, 2]), "JSON object"),
    "a JSON number": ("42", "JSON object"),
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_a_bad_line_is_skipped_with_a_warning_naming_file_line_and_field(store, case):
    bad, field = BAD_LINES[case]
    first, last = good("first"), good("last", micro_batch=2)
    store.path.write_text("\n".join([first.to_json(), bad, last.to_json()]) + "\n", encoding="utf-8")
    with pytest.warns(UserWarning) as record:
        assert store.load() == [first, last]
    # only the store's warning: a ResourceWarning of a file another test left open may be collected in the block
    [message] = [str(w.message) for w in record if issubclass(w.category, UserWarning)]
    assert message.startswith(f"{store.path}:2: skipped a bad result line"), message
    assert field in message, message
    assert "force=True" in message and "Delete or fix that line" in message  # what to do


def test_a_bad_line_for_the_same_recipe_never_breaks_find(store):
    """The issue's case: `micro_batch: 0` under the recipe's key broke every later run and notebook."""
    kept = good()
    store.add(kept)
    with store.path.open("a", encoding="utf-8") as fh:
        fh.write(line_with(recipe=recipe_with(micro_batch=0)) + "\n")  # newer, so find would pick it
        fh.write(line_with(peak_bytes="lots") + "\n")
    with pytest.warns(UserWarning) as record:
        found = store.find(Recipe(), "envA")
    assert [str(w.message).split(" skipped")[0] for w in record] == [f"{store.path}:2:", f"{store.path}:3:"]
    assert found == kept and found.label == "baseline" and found.recipe_obj == Recipe()


def test_the_warning_points_at_the_caller_of_load(store):
    store.path.write_text("not json\n", encoding="utf-8")
    with pytest.warns(UserWarning) as record:
        store.load()
    assert record[0].filename == __file__


def test_null_losses_read_as_no_losses():
    m = Measurement.from_dict(json.loads(line_with(losses=None)))
    assert m.losses == [] and m.final_loss is None


def test_from_dict_raises_the_store_error_type_naming_the_field():
    with pytest.raises(ResultLineError, match=r"field 'peak_bytes' must be a whole number, 0 or more, got 'lots'"):
        Measurement.from_dict(json.loads(line_with(peak_bytes="lots")))
    assert issubclass(ResultLineError, ValueError)


def test_add_refuses_a_measurement_that_load_would_skip(store):
    store.add(good())
    before = store.path.read_bytes()
    broken = good()
    broken.losses = [2.5, float("nan")]
    with pytest.raises(ResultLineError, match="losses"):
        store.add(broken)
    assert store.path.read_bytes() == before


def test_a_does_not_fit_line_validates():
    recipe = Recipe(micro_batch=64)
    m = Measurement(recipe=recipe.to_dict(), recipe_key=recipe.key, env={}, env_key="e", status="does_not_fit",
                    error="out of memory while loading the model")
    assert Measurement.from_dict(json.loads(m.to_json())) == m


def _shipped_files(pattern: str) -> list[Path]:
    root = Path(str(resources.files("course_utils") / "reference"))
    return sorted(root.glob(pattern))


def test_every_shipped_reference_line_validates():
    # t4/ holds T4-check records and beyond/tries/ issue 16's tries and matmul rates, each with a test of its own
    # (test_every_shipped_t4_check_run_validates, tests/test_tries.py): the rest are results stores
    # checkpointing/ notebook 01's selective-checkpointing run (tests/test_selective_checkpointing.py)
    files = [f for f in _shipped_files("**/*.jsonl") if f.parent.name not in NOT_RESULTS_STORES]
    assert len(files) >= 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a skipped line would be a warning
        for f in files:
            lines = [line for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
            assert len(ResultStore(f).load()) == len(lines), f
        assert len(all_reference_results()) > 30


def test_every_shipped_t4_check_run_validates():
    [f] = _shipped_files("t4/*.jsonl")
    records = [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    count = 0
    for rec in records:
        for m in t4check.runs(rec):  # Measurement.from_dict validates each run
            m.validate()
            count += 1
    assert count > 100


# --- an unwritable store is reported before measuring --------------------------------------------


def test_a_writable_store_passes_and_the_check_leaves_only_its_lock(tmp_path):
    s = ResultStore(tmp_path / "new" / "folder" / "results.jsonl")
    s.check_writable()
    assert sorted(p.name for p in s.path.parent.iterdir()) == ["results.jsonl.lock"]
    s.add(good())  # the lock the check created is the one add takes
    s.check_writable()
    assert s.load() == [good()]


def test_store_pointing_at_a_folder(tmp_path):
    s = ResultStore(tmp_path)
    for call in (s.check_writable, s.load, lambda: s.add(good())):
        with pytest.raises(StoreError, match=re.escape(f"{tmp_path} is a folder")) as err:
            call()
        assert str(tmp_path / "results.jsonl") in str(err.value)  # the fix: a file path


def test_course_home_pointing_at_a_file(tmp_path, monkeypatch):
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    monkeypatch.setenv("COURSE_HOME", str(home))
    s = default_store()
    with pytest.raises(StoreError, match=re.escape(f"{home} is a file, not a folder")) as err:
        s.check_writable()
    assert "COURSE_HOME" in str(err.value)
    with pytest.raises(StoreError, match="is a file, not a folder"):
        s.load()


def test_a_lock_that_cannot_be_created_is_reported_up_front(store):
    lock = store.path.with_name(store.path.name + ".lock")
    lock.mkdir(parents=True)  # open() fails on it, for root too
    with pytest.raises(StoreError) as err:
        store.check_writable()
    message = str(err.value)
    assert str(lock) in message and "COURSE_HOME" in message and "--store" in message


@pytest.mark.parametrize("code", ["EACCES", "EROFS"])
def test_a_folder_that_cannot_be_written_is_reported_up_front(store, monkeypatch, code):
    """A read-only folder (simulated: this test may run as root, which permissions do not stop)."""
    import errno

    def refuse(*args, dir=None, **kwargs):
        number = getattr(errno, code)
        raise OSError(number, os.strerror(number), str(dir))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(StoreError) as err:
        store.check_writable()
    message = str(err.value)
    assert str(store.path) in message and os.strerror(getattr(errno, code)) in message
    assert "COURSE_HOME" in message and "\n" not in message


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes to read-only folders")
def test_a_read_only_folder_is_reported_up_front(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(StoreError, match=re.escape(str(folder))):
            ResultStore(folder / "results.jsonl").check_writable()
    finally:
        folder.chmod(0o755)


def test_a_late_write_failure_keeps_the_measurement_in_a_file_it_names(store, tmp_path, monkeypatch):
    store.check_writable()
    lock = store.path.with_name(store.path.name + ".lock")
    lock.unlink()
    lock.mkdir()  # the store breaks after the check, while measuring
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    m = good()
    with pytest.raises(StoreError) as err:
        store.add(m)
    [rescued] = (tmp_path / "scratch").glob("course-unsaved-*.jsonl")
    assert str(rescued) in str(err.value) and f">> {store.path}" in str(err.value)
    assert ResultStore(rescued).load() == [m]
    assert isinstance(err.value, OSError)  # callers that catch OSError keep working


# --- quiz banks ----------------------------------------------------------------------------------


PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe"


@pytest.mark.parametrize("content", [PNG, "title: caf\xe9\n".encode("latin-1")], ids=["binary", "latin-1"])
def test_a_bank_that_is_not_utf8_names_the_file(tmp_path, content):
    path = tmp_path / "99_broken.yaml"
    path.write_bytes(content)
    with pytest.raises(QuizError) as err:
        load_bank(path)
    message = str(err.value)
    assert message.startswith(f"{path}: not UTF-8 text") and "save it as UTF-8" in message
    assert err.value.__cause__ is None and err.value.__suppress_context__
