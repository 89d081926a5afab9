"""Issue 32, the cases still open after tests/test_store_safety.py: a learning rate that cannot train is refused
before anything trains (a run of 2-3 steps ends before its loss collapses, and was stored), a speed that cannot be
trusted says why in a learner's words, the measuring registry covers the build too, what is read back from the
store says so (progress line and figure) with its date, and an optimizer step of several processes that needs more
data than there is is refused up front. Nothing here trains: the runs are patched, or fed measured losses.
"""

from __future__ import annotations

import contextlib
import io
import os

import pytest

from course_utils import checks, child, guards
from course_utils import measure as measure_mod
from course_utils.common import MiB
from course_utils.recipe import Recipe, RecipeError
from course_utils.results import Measurement, ResultStore, environment

from test_bad_input import one_line, run_cli


def make(label="baseline", losses=(7.9, 7.7, 7.5), timing=None, date="2026-11-29T10:00:00+00:00", env_key="envA",
         **changes):
    recipe = Recipe(label=label, **changes)
    by_cat = {"parameters": 10 * MiB, "gradients": 0, "optimizer": MiB, "activations": 20 * MiB,
              "temporaries": 8 * MiB, "other": 0}
    return Measurement(recipe=recipe.to_dict(), recipe_key=recipe.key, env={"device": "TestCPU"}, env_key=env_key,
                       status="ok", peak_bytes=39 * MiB, peak_by_category=by_cat, tokens_per_s=1000.0,
                       losses=list(losses), timing=dict(timing or {"timed_steps": 3, "spread": 0.1}), date=date,
                       command="pytest")


# --- 1. a learning rate that cannot train ----------------------------------------------------------------------------
# The final losses of `course run`'s ladder base (tiny model, 6 steps, seed 0) at each learning rate, measured on this
# project's 2-core CPU (2026-12-03, torch 2.13): above 1 the loss collapses to 0.0, in step 4 at the latest; a run of
# 2 or 3 steps (lr 10: 7.896, 7.746, 7.262) ends before it does, and was stored as a result.
MEASURED = {
    10.0: [7.8962, 7.746, 7.2618, 0.0, 0.0, 0.0], 1e6: [7.8962, 7.7966, 0.0, 0.0, 0.0, 0.0],
    1e30: [7.8962, 0.0, 0.0, 0.0, 0.0, 0.0], 3.0: [7.8962, 7.7159, 7.8063, 0.0, 0.0, 0.0],
    1.0: [7.8962, 7.6742, 7.3118, 7.9388, 8.3419, 8.5281], 0.5: [7.8962, 7.5516, 8.3061, 7.7859, 7.6774, 8.0696],
    0.2: [7.8962, 7.3692, 8.3975, 8.0189, 7.848, 7.3589], 1e-3: [7.8962, 7.7470, 7.5723, 7.5720, 7.4191, 7.4276],
}


def test_the_bound_sits_between_the_measured_collapses_and_the_rest():
    for lr, losses in MEASURED.items():
        collapsed = guards.loss_problem(losses) is not None
        assert collapsed == (lr > checks.MAX_LEARNING_RATE), (lr, losses)
        assert guards.loss_problem(losses[:3]) is None or lr > 1e3  # 3 steps: lr 3 and 10 look like training


@pytest.mark.parametrize("lr", [10.0, 1e6, 1e30])
def test_measure_refuses_a_learning_rate_that_cannot_train_before_it_trains(lr, tmp_path, no_training):
    store = ResultStore(tmp_path / "results.jsonl")
    recipe = Recipe(learning_rate=1e-3, steps=3, warmup_steps=1).with_(learning_rate=lr)
    with pytest.raises(RecipeError) as exc:
        measure_mod.measure(recipe, store=store, isolate=False, progress=False)
    message = str(exc.value)
    assert "\n" not in message and f"learning_rate={lr:g}" in message and "collapses to 0.0" in message
    assert "--lr 1e-3" in message and not no_training and not store.path.exists()


def test_course_run_refuses_it_in_one_line(tmp_path, no_training):
    code, _, err = run_cli(["run", "--lr", "10", "--steps", "3", "--warmup-steps", "1", "--no-progress",
                            "--store", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "o")])
    line = one_line(err)
    assert code == 2 and not no_training and not (tmp_path / "r.jsonl").exists()
    assert "learning_rate=10 cannot train" in line and "--lr 1e-3" in line


def test_no_shipped_result_and_no_rung_of_the_default_ladder_is_refused():
    """The rule refuses no legitimate run: every line of every shipped results store (their learning rate and
    their losses) and every rung of `course run`'s ladder."""
    from course_utils.cli import build_parser
    from course_utils.cli_recipe import run_recipe
    from course_utils.measure import ladder_here
    from test_store_safety import ROOT, NOT_RESULTS_STORES, shipped_results

    reference = ROOT / "course_utils" / "reference"
    folders = [""] + sorted(str(p.relative_to(reference)) for p in reference.rglob("*")
                            if p.is_dir() and p.name not in NOT_RESULTS_STORES)
    lines = [m for folder in folders for m in shipped_results(folder)]
    assert len(lines) > 50
    for m in lines:
        checks.check_learning_rate(m.recipe_obj)
        assert not m.fits or guards.loss_problem(m.losses) is None, (m.source, m.label)
    for rung in ladder_here(run_recipe(build_parser().parse_args(["run"])))[0]:
        checks.check_learning_rate(rung)


def test_the_childs_refusal_names_the_learning_rate_and_the_flag():
    class Probe:
        batch_sizes = {4}
        losses = MEASURED[10.0]

    with pytest.raises(child.MeasurementError) as exc:
        child.check_sane(Recipe(learning_rate=0.9), Probe())
    message = str(exc.value)
    assert "with learning_rate=0.9, the loss collapsed to 0" in message and "--lr 1e-3" in message
    assert "nothing was stored" in message and "\n" not in message


# --- 2. a speed that cannot be trusted says why, in words ------------------------------------------------------------
def test_a_noisy_speed_says_why_in_the_table():
    from course_utils.show.report import results_table

    single = make("one step", timing={"timed_steps": 1})
    beside = make("beside", timing={"timed_steps": 3, "spread": 0.1, "others": 1})
    steady = make("steady")
    assert single.noisy_reasons == ["timed on one step only"] and not steady.noisy_reasons
    assert beside.noisy_reasons == ["another measurement ran on this machine at the same time"]
    text = " ".join(str(results_table([steady, single, beside])).split())
    assert "one step (timed on one step only)" in text and "not reused from your results store" in text
    assert "beside (another measurement ran on this machine at the same time)" in text
    assert "steady (" not in text


def figure_texts(fig) -> str:
    return " ".join(" ".join(t.get_text() for t in fig.texts).split())


def test_the_figure_says_why_a_point_is_hollow_and_which_points_came_from_the_store():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_utils.show.plots import ladder_figure

    first = make("baseline (LoRA, fp32)", date="2026-11-29T10:00:00+00:00")
    first.cached = True  # read back from the store
    second = make("+ gradient checkpointing", gradient_checkpointing=True, timing={"timed_steps": 1})
    third = make("+ accumulation (micro-batch 1)", gradient_checkpointing=True, micro_batch=1, grad_accum=4,
                 date="2026-12-03T18:40:00+00:00")
    third.cached = True
    fig = ladder_figure([first, second, third])
    try:
        text = figure_texts(fig)
    finally:
        plt.close(fig)
    assert "hollow: a speed not to be trusted (timed on one step only)" in text
    assert ("read back from your store, not measured now: 1, 3 (measured 2026-11-29 10:00 UTC to 2026-12-03 18:40 "
            "UTC)") in text


def test_a_measuring_process_is_registered_while_it_builds(tmp_path, monkeypatch):
    """Building the model and tokenizing the data load the CPU as much as training: a measurement beside another's
    build is marked too."""
    monkeypatch.setattr(guards, "registry", lambda: tmp_path / "measuring")
    seen = []

    class Built(Exception):
        pass

    def build(*args, **kwargs):
        seen.append((tmp_path / "measuring" / f"{os.getpid()}.json").exists())
        raise Built

    monkeypatch.setattr(child, "build", build)
    with pytest.raises(Built):
        child.run_here(Recipe(steps=3, warmup_steps=1), checked=True)
    assert seen == [True]
    assert not (tmp_path / "measuring" / f"{os.getpid()}.json").exists()  # and unregistered after


# --- 3. what is read back from the store says so, with its date ------------------------------------------------------
def test_measure_says_what_it_read_back_from_the_store_and_when(tmp_path, no_training):
    store = ResultStore(tmp_path / "results.jsonl")
    recipe = Recipe(steps=3, warmup_steps=1, label="asked")
    store.add(make("stored", env_key=environment().key, date="2026-12-03T18:40:00+00:00", steps=3, warmup_steps=1))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        got = measure_mod.measure(recipe, store=store, isolate=False, progress=True)
    assert got.cached and not no_training
    assert out.getvalue().strip() == "asked: read back from your store, measured 2026-12-03 18:40 UTC"
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet):
        measure_mod.measure(recipe, store=store, isolate=False, progress=False)
    assert quiet.getvalue() == ""


# --- 4. an optimizer step of several processes that needs more data than there is --------------------------------------
def test_a_step_of_several_processes_beyond_the_data_is_refused_up_front(tiny_model, monkeypatch):
    from course_utils import distributed
    from course_utils.models import shipped_token_count

    blocks = shipped_token_count() // 256
    recipe = Recipe(max_seq_length=256, micro_batch=4, grad_accum=blocks // 4, learning_rate=1e-3)  # one process: fits
    checks.check_data(recipe)
    monkeypatch.setattr(distributed, "visible_gpus", lambda: 0)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    with pytest.raises(RecipeError) as exc:
        distributed.check_launch(recipe, 2, "ddp")
    message = str(exc.value)
    assert f"2 processes x micro_batch 4 x grad_accum {blocks // 4} = {2 * 4 * (blocks // 4)} sequences" in message
    assert f"at most {blocks}" in message and "\n" not in message


def closings(stored: Measurement, now: Measurement) -> dict[str, str]:
    """Every notebook's closing text over a pair (or the lists) of this run's measurements; stand-ins for the shipped
    reference points (a closing reads only their figures and labels)."""
    from course_utils.chapter.complete_recipe import closing_07
    from course_utils.chapter.efficient_optimizers import closing_03
    from course_utils.chapter.gradient_accumulation import closing_02
    from course_utils.chapter.gradient_checkpointing import closing_01
    from course_utils.chapter.mixed_precision import closing_04
    from course_utils.chapter.qlora_4bit import closing_05
    from course_utils.chapter.sequence_length_and_batch import closing_06
    from course_utils.chapter.where_memory_goes import closing_00

    def ref(label="reference"):
        m = make(label)
        m.cuda_max_reserved = 40 * MiB
        return m

    bf16 = make("bf16", timing=now.timing)
    bf16.precision, stored.precision = "bf16", "fp32"
    bf16.cached = now.cached
    return {
        "00": closing_00(stored, now, (ref(), ref()), "tiny"),
        "01": closing_01(stored, now, (ref(), ref()), "tiny"),
        "02": closing_02(stored, now, (ref(), ref(), ref())),
        "03": closing_03(stored, now, now, (now, now), (ref(), ref(), ref())),
        "04": closing_04(stored, bf16, (ref(), ref())),
        "05": closing_05(stored, now, (ref(), ref())),
        "06": closing_06([stored, now], [now, now]),
        "07": closing_07(stored, now, [ref("source chapter recipe (QLoRA 1x16)"), ref("QLoRA 16x1")], "tiny"),
    }


def test_every_closing_says_which_figures_were_read_back_from_the_store_and_when():
    stored = make("from before", date="2026-12-01T08:30:00+00:00")
    stored.cached = True
    now = make("measured now")
    for notebook, text in closings(stored, now).items():
        flat = " ".join(text.split())
        assert "From the store, not measured in this run: from before (measured 2026-12-01 08:30 UTC)" in flat, (
            notebook, text)
        assert "measured now (measured" not in flat, notebook
    stored.cached = False
    for notebook, text in closings(stored, now).items():
        assert "From the store" not in text, notebook
