"""measure(): real subprocess runs (three in this file, shared via fixtures), the store cache, and
the techniques' effects measured in-process with run_here (the code the child runs)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from course_utils import measure as measure_mod
from course_utils.results import environment
from course_utils.child import MeasurementError, run_here
from course_utils.measure import measure
from course_utils.common import CATEGORIES
from course_utils.models import ModelUnavailableError
from course_utils.recipe import Recipe
from course_utils.results import Measurement, ResultStore
from course_utils.show.report import results_table

# --- real subprocess measurements ----------------------------------------------------------------


@pytest.mark.slow
def test_measure_returns_a_complete_result(baseline_measurement, cli_baseline_recipe):
    m = baseline_measurement
    r = cli_baseline_recipe
    assert m.status == "ok" and m.fits and m.error == ""
    assert m.cached is False
    assert m.recipe_key == r.key
    assert Recipe.from_dict(m.recipe) == r
    assert set(m.peak_by_category) == set(CATEGORIES)
    assert m.peak_by_category["parameters"] > 0
    assert m.peak_by_category["activations"] > 0
    assert m.peak_bytes >= sum(m.peak_by_category.values()) > 0
    assert m.tokens_per_s is not None and m.tokens_per_s > 0
    assert len(m.losses) == r.steps
    assert all(isinstance(x, float) and x > 0 for x in m.losses)
    assert m.precision == "fp32"
    assert m.trainable_params > 0 and m.model_bytes > 0
    assert m.cuda_max_allocated is None  # CPU
    assert m.env["device"] and m.env["versions"]["torch"] and m.env["versions"]["transformers"]
    assert m.env_key == environment().key
    assert m.date and m.command


@pytest.mark.slow
def test_measure_stores_the_result(baseline_measurement, shared_store, cli_baseline_recipe):
    assert shared_store.find(cli_baseline_recipe, baseline_measurement.env_key) == baseline_measurement


@pytest.mark.slow
def test_measure_again_is_cached_without_a_new_process(baseline_measurement, shared_store, cli_baseline_recipe,
                                                       monkeypatch):
    def no_child(*a, **k):
        raise AssertionError("a stored result must not be measured again")

    monkeypatch.setattr(measure_mod, "_run_child", no_child)
    # a speed from a busy machine would be measured again (tests/test_preflight.py): not what this test is about
    monkeypatch.setattr(Measurement, "noisy", property(lambda self: False))
    again = measure(cli_baseline_recipe.with_(label="another label"), store=shared_store, progress=False)
    assert again.cached is True
    assert again.label == "another label"  # the asked recipe's label, not the one it was stored with
    assert dataclasses.replace(again, recipe=baseline_measurement.recipe) == baseline_measurement
    assert shared_store.find(cli_baseline_recipe, again.env_key).label == baseline_measurement.label


@pytest.mark.slow
def test_force_measures_again_and_stores_the_new_result(baseline_measurement, shared_store, cli_baseline_recipe,
                                                        monkeypatch, tmp_path):
    store = ResultStore(tmp_path / "results.jsonl")
    store.path.write_bytes(shared_store.path.read_bytes())
    n_before = len(store.load())
    fresh = dataclasses.replace(baseline_measurement, peak_bytes=baseline_measurement.peak_bytes + 1,
                                date="2099-01-01T00:00:00+00:00")
    calls = []

    def stub(recipe, budget_gib, progress, timeout_s):
        calls.append((recipe, budget_gib))
        return fresh

    monkeypatch.setattr(measure_mod, "_run_child", stub)
    got = measure(cli_baseline_recipe, store=store, force=True, progress=False)
    assert calls == [(cli_baseline_recipe, None)]
    assert got is fresh and not got.cached
    assert len(store.load()) == n_before + 1
    assert store.find(cli_baseline_recipe, fresh.env_key) == fresh  # the latest wins


@pytest.mark.slow
def test_out_of_memory_is_a_result_not_stored(tiny_model, tmp_path):
    store = ResultStore(tmp_path / "results.jsonl")
    recipe = Recipe(steps=3, warmup_steps=1, micro_batch=2, max_seq_length=64)
    m = measure(recipe, store=store, budget_gib=0.01, progress=False, isolate=False)  # a 10 MiB device
    assert m.status == "does_not_fit"
    assert not m.fits
    assert "budget" in m.error and "0.01" in m.error
    assert m.tokens_per_s is None
    assert m.recipe_key == recipe.key
    assert store.load() == []
    assert not store.path.exists()


@pytest.mark.slow
def test_a_failing_child_raises_with_its_log(monkeypatch):
    real_popen = subprocess.Popen

    def failing_child(cmd, **kwargs):  # stands in for a child that crashes with an unexpected error
        code = "import sys; print('Traceback (most recent call last):'); print('ZeroDivisionError: boom'); sys.exit(1)"
        return real_popen([sys.executable, "-c", code], **kwargs)

    monkeypatch.setattr(measure_mod.subprocess, "Popen", failing_child)
    with pytest.raises(MeasurementError) as exc:
        measure_mod._run_child(Recipe(), None, False, None)
    msg = str(exc.value)
    assert "exit code 1" in msg and "Last lines of its log" in msg and "ZeroDivisionError: boom" in msg


def test_a_missing_model_folder_is_refused_before_a_child_starts(tiny_model, tmp_path, monkeypatch):
    store = ResultStore(tmp_path / "results.jsonl")
    monkeypatch.setattr(measure_mod.subprocess, "Popen", None)  # a child would fail the test
    with pytest.raises(ModelUnavailableError) as exc:
        measure(Recipe(model=str(tmp_path / "nope"), steps=3, warmup_steps=1), store=store, progress=False)
    assert "nope" in str(exc.value) and "tiny" in str(exc.value)
    assert store.load() == []


def test_timeout_stops_a_silent_child(monkeypatch):
    real_popen = subprocess.Popen

    def silent_child(cmd, **kwargs):  # stands in for a child that hangs without printing
        return real_popen([sys.executable, "-c", "import time; time.sleep(2)"], **kwargs)

    monkeypatch.setattr(measure_mod.subprocess, "Popen", silent_child)
    with pytest.raises(MeasurementError, match="took longer"):
        measure_mod._run_child(Recipe(), None, False, 0.2)


# --- in-process effects (run_here) ---------------------------------------------------------------
# Each technique against the rung before it on the estimator's tiny-check ladder (course_utils.estimate.
# tiny_check_recipes(): in-process measurements the session makes once, for test_estimate too). Each pair
# differs in that one technique.

BASE = Recipe(steps=3, warmup_steps=1, micro_batch=4, max_seq_length=64)


def test_checkpointing_lowers_activations_and_the_peak(tiny_check_run):
    base, ckpt = tiny_check_run("baseline (LoRA, fp32)"), tiny_check_run("+ gradient checkpointing")
    assert ckpt.peak_by_category["activations"] < base.peak_by_category["activations"]
    assert ckpt.peak_bytes < base.peak_bytes
    assert ckpt.peak_by_category["parameters"] == base.peak_by_category["parameters"]


def test_4bit_lowers_parameter_bytes(tiny_check_run):
    base, q = tiny_check_run("+ paged 8-bit AdamW"), tiny_check_run("+ 4-bit QLoRA (NF4, double quant)")
    assert not base.recipe_obj.load_in_4bit and base.recipe_obj == q.recipe_obj.with_(load_in_4bit=False)
    assert q.peak_by_category["parameters"] < base.peak_by_category["parameters"]
    assert q.model_bytes < base.model_bytes
    assert q.trainable_params == base.trainable_params  # same LoRA adapters


def test_accumulation_lowers_the_peak_at_the_same_effective_batch(tiny_check_run):
    big, small = tiny_check_run("+ gradient checkpointing"), tiny_check_run("+ accumulation (micro-batch 1)")
    assert (big.recipe_obj.micro_batch, small.recipe_obj.micro_batch) == (4, 1)
    assert big.recipe_obj.effective_batch == small.recipe_obj.effective_batch
    assert small.peak_bytes < big.peak_bytes
    assert small.peak_by_category["activations"] < big.peak_by_category["activations"]
    steps = small.recipe_obj.steps
    assert len(small.losses) == len(big.losses) == steps  # one loss per optimizer step, not per micro-batch


def test_8bit_optimizer_lowers_optimizer_bytes(tiny_check_run):
    base, q = tiny_check_run("+ accumulation (micro-batch 1)"), tiny_check_run("+ 8-bit AdamW")
    assert (base.recipe_obj.optimizer, q.recipe_obj.optimizer) == ("adamw_torch", "adamw_8bit")
    assert 0 < q.peak_by_category["optimizer"] < base.peak_by_category["optimizer"]


@pytest.fixture(scope="module")
def seeded(tiny_model):
    """BASE measured three times in this process: twice after torch.manual_seed(1234), once after seed 2."""
    out = {}
    for name, seed in (("a", 1234), ("b", 1234), ("c", 2)):
        torch.manual_seed(seed)
        out[name] = run_here(BASE)
    return out


def test_training_is_deterministic_on_cpu(seeded):
    """Same recipe, same process RNG state before the run: same losses and same bytes."""
    a, b = seeded["a"], seeded["b"]
    assert a.losses == b.losses and len(a.losses) == BASE.steps
    assert a.peak_bytes == b.peak_bytes
    assert a.peak_by_category == b.peak_by_category


def test_losses_depend_only_on_the_recipe(seeded):
    assert seeded["a"].losses == seeded["c"].losses  # seed 1234, then seed 2


def test_tracked_peak_is_repeatable(seeded):
    first, again = seeded["a"], seeded["c"]
    assert again.peak_bytes == first.peak_bytes > 0
    assert again.peak_by_category == first.peak_by_category


def test_run_here_reports_a_budget_overrun_as_does_not_fit(tiny_model):
    m = run_here(BASE, budget_gib=0.01)
    assert m.status == "does_not_fit"
    assert "BudgetExceeded" in m.error and "simulated budget 0.01 GiB" in m.error


# --- measure_all: the one driver (measure() stubbed: no training) -------------------------------------


def _stub(recipe: Recipe, **how) -> Measurement:
    """What measure() would return for `recipe`: a result whose peak is its sequence length."""
    return Measurement(recipe={**recipe.to_dict(), "label": "stored under another label"}, recipe_key=recipe.key,
                       env={"device": "cpu"}, env_key="e", status="ok", peak_bytes=recipe.max_seq_length * 2**20,
                       peak_by_category={"activations": recipe.max_seq_length * 2**20})


@pytest.fixture
def measured_here(monkeypatch):
    """measure() replaced by _stub with its label applied as measure() applies it; the recipes it was given."""
    seen: list[Recipe] = []

    def stub(recipe, **how):
        seen.append(recipe)
        return measure_mod._as_asked(_stub(recipe), recipe)

    monkeypatch.setattr(measure_mod, "measure", stub)
    return seen


def test_measure_all_gives_one_outcome_per_recipe_in_order(measured_here, tiny_model):
    recipes = [BASE.with_(max_seq_length=n, label=f"seq {n}") for n in (16, 32, 48)]
    results = measure_mod.measure_all(recipes, skip={1: "not today"}, progress=False)
    assert [o.recipe for o in results] == recipes and measured_here == [recipes[0], recipes[2]]
    assert [o.label for o in results] == ["seq 16", "seq 32", "seq 48"]
    assert [m.label for m in results.measured] == ["seq 16", "seq 48"]
    assert results.skipped == {1: "not today"} and results[1].measurement is None
    rows = [line for line in str(results.table()).splitlines() if line.startswith("seq")]
    assert [r.split()[1] for r in rows] == ["16", "32", "48"] and "skipped: not today" in rows[1]


def test_measure_all_checks_every_recipe_before_the_first_run(measured_here, tiny_model):
    from course_utils.recipe import RecipeError

    too_long = BASE.with_(max_seq_length=5000)  # beyond the tiny model's 1,024 positions
    with pytest.raises(RecipeError, match="1,024 positions"):
        measure_mod.measure_all([BASE, too_long], progress=False)
    assert measured_here == []
    assert measure_mod.measure_all([BASE, too_long], skip={1: "too long"}, progress=False).skipped == {1: "too long"}


def test_measure_all_keep_going_skips_a_failed_run(monkeypatch, tiny_model):
    def stub(recipe, **how):
        if recipe.micro_batch == 2:
            raise MeasurementError("the child crashed")
        return _stub(recipe)

    monkeypatch.setattr(measure_mod, "measure", stub)
    recipes = [BASE, BASE.with_(micro_batch=2), BASE.with_(micro_batch=1)]
    with pytest.raises(MeasurementError):
        measure_mod.measure_all(recipes, progress=False)
    seen = []
    results = measure_mod.measure_all(recipes, progress=False, keep_going=True,
                                      after_each=lambda so_far: seen.append(len(so_far)))
    assert results.skipped == {1: "failed: the child crashed"} and len(results.measured) == 2 and seen == [1, 2, 3]


def test_measure_all_refuses_a_skip_outside_the_list(measured_here):
    with pytest.raises(ValueError, match=r"position\(s\) \[3\].*0 to 1"):
        measure_mod.measure_all([BASE, BASE], skip={3: "why"}, progress=False)


def test_run_ladder_and_sweep_sit_on_measure_all(measured_here, tiny_model):
    base = Recipe(steps=3, warmup_steps=1, micro_batch=2, max_seq_length=64, label="baseline")
    rungs, same = measure_mod.ladder_here(base)
    ladder, skipped = measure_mod.run_ladder(base, progress=False)
    assert same and skipped == {rungs[i].name: why for i, why in same.items()}  # on a CPU, mixed precision
    assert [m.label for m in ladder] == [r.name for i, r in enumerate(rungs) if i not in same]  # a skip: no copy
    assert len(measured_here) == len(ladder) == len(rungs) - len(same)
    assert ladder["+ 8-bit AdamW"] is ladder[3] and ladder["+ 8-bit AdamW"].recipe["optimizer"] == "adamw_8bit"
    assert ladder["+ accumulation (micro-batch 1)":"+ paged 8-bit AdamW"] == ladder[2:5]
    assert ladder["+ 8-bit AdamW":] == ladder[3:] and ladder[:"+ 8-bit AdamW"] == ladder[:4]
    with pytest.raises(measure_mod.RungError, match="not measured here: precision=auto is fp32"):
        ladder["+ mixed precision"]
    first, _ = measure_mod.run_ladder(base, progress=False, through="+ gradient checkpointing")
    assert [m.label for m in first] == ["baseline (LoRA, fp32)", "+ gradient checkpointing"]
    with pytest.raises(measure_mod.RungError, match=r"No rung of the ladder is named '\+ ckpt'; the rungs are 'base"):
        measure_mod.run_ladder(base, through="+ ckpt")
    points = measure_mod.sweep(base, "max_seq_length", (16, 32), progress=False)
    assert [m.label for m in points] == ["max_seq_length=16", "max_seq_length=32"]


def test_a_sweep_stops_running_once_a_growing_knob_does_not_fit(monkeypatch, tiny_model):
    seen = []

    def stub(recipe, **how):  # 32 and more do not fit
        seen.append(recipe.max_seq_length)
        m = measure_mod._as_asked(_stub(recipe), recipe)
        return dataclasses.replace(m, status="does_not_fit") if recipe.max_seq_length >= 32 else m

    monkeypatch.setattr(measure_mod, "measure", stub)
    points = measure_mod.sweep(BASE, "max_seq_length", (16, 32, 48, 64), progress=False)
    assert seen == [16, 32] and [m.fits for m in points] == [True, False]  # what ran, measured
    assert [m.label for m in points] == [f"max_seq_length={n}" for n in (16, 32)]
    assert list(points.skipped) == ["max_seq_length=48", "max_seq_length=64"]  # not run: a skip, not a Measurement
    assert all("max_seq_length=32 did not fit" in why for why in points.skipped.values())
    rows = [line for line in str(results_table(points, points.skipped)).splitlines() if line.startswith("max_seq")]
    assert [r.split()[0] for r in rows] == [f"max_seq_length={n}" for n in (16, 32, 48, 64)]
    assert "skipped: not run: max_seq_length=32 did not fit" in rows[3]
    seen.clear()  # falling values, or a knob whose memory need not grow: every value runs
    measure_mod.sweep(BASE, "max_seq_length", (64, 48, 32, 16), progress=False)
    assert seen == [64, 48, 32, 16]


def test_a_stored_result_comes_back_with_the_asked_label(tmp_path):
    store = ResultStore(tmp_path / "results.jsonl")
    recipe = BASE.with_(label="first")
    store.add(dataclasses.replace(_stub(recipe), recipe=recipe.to_dict(), env_key=environment().key))
    again = measure(recipe.with_(label="second"), store=store, progress=False)
    assert again.cached and again.label == "second" and store.find(recipe, environment().key).label == "first"
