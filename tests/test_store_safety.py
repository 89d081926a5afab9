"""Issue 32: wrong results are never stored, figures read back from the store say so, and nothing waits silently.

Cases 1 (a loss that collapses, explodes or stops moving), 2 (a speed from one timed step, or measured beside
another measurement), 3 (figures read back from the store carry their date), 9 (a held store lock) and
10 (SIGTERM). Deterministic: the other measuring process and the lock holder are simulated by their files
and a small process, never by two trainings at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from course_utils import measure as measure_mod
from course_utils import child
from course_utils.child import MeasurementError, check_sane
from course_utils.guards import alive
from course_utils.recipe import Recipe
from course_utils.common import MiB
from course_utils.results import NOT_RESULTS_STORES, Measurement, ResultStore, StoreError, shipped_results
from course_utils.show.report import results_table

ROOT = Path(__file__).resolve().parents[1]


def make(label="baseline", losses=(7.9, 7.7, 7.5), timing=None, date="2026-11-29T10:00:00+00:00", **changes):
    recipe = Recipe(label=label, **changes)
    by_cat = {"parameters": 10 * MiB, "gradients": 0, "optimizer": MiB, "activations": 20 * MiB,
              "temporaries": 8 * MiB, "other": 0}
    return Measurement(recipe=recipe.to_dict(), recipe_key=recipe.key, env={"device": "TestCPU"}, env_key="envA",
                       status="ok", peak_bytes=39 * MiB, peak_by_category=by_cat, tokens_per_s=1000.0,
                       losses=list(losses), timing=dict(timing or {"timed_steps": 3, "spread": 0.1}), date=date,
                       command="pytest")


# --- 1. a run that trained nothing is not a result -------------------------------------------------------------
BROKEN = {
    "collapsed to 0.0 (learning rate 10, 1e6, 1e30)": [7.9, 0.0, 0.0, 0.0, 0.0, 0.0],
    "collapsed near 0": [7.9, 3.1, 0.004, 0.0007],
    "exploded": [7.9, 9.2, 31.5, 80.4],
    "stopped moving": [7.9, 6.2, 6.2, 6.2, 6.2],
}


@pytest.mark.parametrize("losses", BROKEN.values(), ids=BROKEN.keys())
def test_a_run_that_trained_nothing_is_refused_by_the_store(tmp_path, losses):
    store = ResultStore(tmp_path / "results.jsonl")
    store.add(make("good"))
    before = store.path.read_bytes()
    from course_utils.results import NotAResult

    with pytest.raises(NotAResult) as exc:
        store.add(make("broken", losses=losses))
    message = str(exc.value)
    assert "\n" not in message and "'broken' was not stored" in message and "learning rate" in message
    assert store.path.read_bytes() == before  # nothing stored, nothing lost


@pytest.mark.parametrize("losses", BROKEN.values(), ids=BROKEN.keys())
def test_the_measuring_child_refuses_it_in_one_line(losses):
    class Probe:
        batch_sizes = {4}

    Probe.losses = losses
    with pytest.raises(MeasurementError) as exc:
        check_sane(Recipe(learning_rate=10.0), Probe())
    assert "did not train" in str(exc.value) and "nothing was stored" in str(exc.value) and "\n" not in str(exc.value)


def test_every_shipped_result_passes_the_loss_check():
    """The rule is loose enough for every real run the course ships: the H200 runs (random weights: 12.58 ->
    19.22 -> 9.60 in one of them) and notebook 09's, the T4 check's and the tf32 ones."""
    folders = [""] + sorted(str(p.relative_to(ROOT / "course_utils" / "reference")) for p in
                            (ROOT / "course_utils" / "reference").rglob("*")
                            if p.is_dir() and p.name not in NOT_RESULTS_STORES)
    from course_utils import guards
    from course_utils.chapter import t4

    checked = 0
    for folder in folders:
        for m in shipped_results(folder):
            if m.fits:
                assert guards.loss_problem(m.losses) is None, (m.source, m.label, m.losses)
                checked += 1
    for rec in t4.records():  # the T4 check's runs, from its records
        for m in t4.runs(rec):
            if m.fits:
                assert guards.loss_problem(m.losses) is None, (rec["notebook"], m.label, m.losses)
                checked += 1
    assert checked > 50


def test_short_healthy_runs_pass():
    from course_utils import guards

    # the tiny model's default ladder on a CPU (6 steps, lr 1e-3), as `course run` measured it on two CPUs
    assert guards.loss_problem([7.8962, 7.7470, 7.5723, 7.5720, 7.4191, 7.4276]) is None
    assert guards.loss_problem([7.8033, 7.7987, 7.6870, 7.5702, 7.5481, 7.4221]) is None
    assert guards.loss_problem([7.9]) is None and guards.loss_problem([]) is None
    assert guards.loss_problem([7.9, 7.9]) is None  # two equal steps can happen; three is a stuck run


# --- 2. a speed that cannot be trusted is marked and measured again ----------------------------------------------
def test_a_speed_from_one_timed_step_is_noisy():
    assert make(timing={"timed_steps": 1}).noisy
    assert not make(timing={"timed_steps": 3, "spread": 0.1}).noisy
    assert not make(timing={}).noisy  # results stored before timing was recorded are not marked


def test_a_speed_measured_beside_another_measurement_is_noisy():
    assert make(timing={"timed_steps": 3, "spread": 0.1, "others": 1}).noisy


def test_a_noisy_stored_speed_is_measured_again_not_reused(tmp_path, monkeypatch):
    store = ResultStore(tmp_path / "results.jsonl")
    from course_utils.results import environment

    recipe = Recipe(label="x")
    stored = make("x", timing={"timed_steps": 1})
    stored.env_key = environment().key
    store.add(stored)
    fresh = make("x", timing={"timed_steps": 3, "spread": 0.05})
    fresh.env_key = stored.env_key
    calls = []
    monkeypatch.setattr("course_utils.checks.check_runnable", lambda r: "fp32")
    monkeypatch.setattr(measure_mod, "run_here", lambda r, b=None, **kw: calls.append(r) or fresh)
    got = measure_mod.measure(recipe, store=store, isolate=False, progress=False)
    assert calls == [recipe] and not got.cached and got.timing["timed_steps"] == 3
    again = measure_mod.measure(recipe, store=store, isolate=False, progress=False)
    assert again.cached and len(calls) == 1  # a steady speed is reused


@pytest.fixture
def another_measurement(tmp_path, monkeypatch):
    """A registry entry of another measuring process on this machine: a live process (our parent), of another
    run (group), as guards.measuring() writes it."""
    from course_utils import guards

    monkeypatch.setattr(guards, "registry", lambda: tmp_path / "measuring")
    (tmp_path / "measuring").mkdir()
    entry = tmp_path / "measuring" / f"{os.getppid()}.json"
    entry.write_text(json.dumps({"pid": os.getppid(), "group": "another run", "command": "course run"}))
    return entry


def test_the_registry_sees_other_measuring_processes_only(another_measurement, tmp_path):
    from course_utils import guards

    assert [o["pid"] for o in guards.others_measuring()] == [os.getppid()]
    with guards.measuring():  # ourselves: registered, and not one of the others
        assert (tmp_path / "measuring" / f"{os.getpid()}.json").exists()
        assert [o["pid"] for o in guards.others_measuring()] == [os.getppid()]
    assert not (tmp_path / "measuring" / f"{os.getpid()}.json").exists()
    dead = tmp_path / "measuring" / "999999999.json"
    dead.write_text(json.dumps({"pid": 999999999, "group": "gone", "command": "x"}))
    assert [o["pid"] for o in guards.others_measuring()] == [os.getppid()] and not dead.exists()


@pytest.mark.slow
def test_a_real_run_beside_another_measurement_is_marked_and_not_reused(tiny_model, another_measurement, tmp_path):
    """One short real run in this process, while the registry says another measurement runs here."""
    from course_utils import guards

    recipe = Recipe(steps=5, warmup_steps=1, max_seq_length=64, micro_batch=2, learning_rate=1e-3, label="beside")
    m = child.run_here(recipe)
    assert m.timing.get("others") == 1 and m.noisy
    assert guards.loss_problem(m.losses) is None  # a healthy short run passes the loss check


# --- 3. figures read back from the store say so, with their date ------------------------------------------------
def test_a_table_of_stored_figures_says_they_came_from_the_store_and_when():
    from course_utils.results import from_store_note

    now, stored = make("measured now"), make("from before", date="2026-11-29T10:00:00+00:00")
    stored.cached = True
    text = str(results_table([now, stored]))
    assert "From the store, not measured in this run: from before (measured 2026-11-29 10:00 UTC)" in text
    assert "measured now (measured" not in text
    assert from_store_note([now]) is None and "From the store" not in str(results_table([now]))


def test_notebook_05s_closing_says_which_figures_are_from_the_store():
    """Notebook 05 prints results_table(mine) and closing_05(mine[-2], mine[-1], reference) from run_ladder, whose
    rungs come from the store when notebooks 01-04 measured them."""
    from course_utils.chapter.qlora_4bit import closing_05
    from course_utils.chapter.every_notebook import reference_points

    before = make("+ paged 8-bit AdamW", date="2026-11-28T08:30:00+00:00")
    after = make("+ 4-bit QLoRA (NF4, double quant)", load_in_4bit=True)
    before.cached = True
    reference = reference_points("LoRA bf16, ckpt, 1x16, paged 8-bit", "source chapter recipe (QLoRA 1x16)")
    text = closing_05(before, after, reference)
    assert "From the store, not measured in this run: + paged 8-bit AdamW (measured 2026-11-28 08:30 UTC)" in " ".join(
        text.split())
    before.cached = False
    assert "From the store" not in closing_05(before, after, reference)


# --- 9. a store lock held by another process -----------------------------------------------------------------------
HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from course_utils.common import file_lock
    with file_lock(Path(sys.argv[1])):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
""")


def test_a_held_store_lock_names_its_holder_and_has_a_deadline(tmp_path, monkeypatch, capsys):
    store = ResultStore(tmp_path / "results.jsonl")
    store.add(make("first"))
    before = store.path.read_bytes()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "results.jsonl.lock"), "8"],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("COURSE_LOCK_TIMEOUT", "0.5")
        started = time.monotonic()
        with pytest.raises(StoreError) as exc:
            store.add(make("second"))
        took = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    message = str(exc.value)
    assert took < 5, "it waited past its deadline"
    assert f"held by pid {holder.pid}" in message and "-c" in message and "after 0.5 s" in message
    assert "\n" not in message and "course-unsaved-" in message  # the measurement is kept in a file it names
    waiting = capsys.readouterr().err.strip().splitlines()
    assert len(waiting) == 1 and f"held by pid {holder.pid}" in waiting[0] and "COURSE_LOCK_TIMEOUT" in waiting[0]
    assert store.path.read_bytes() == before


def test_a_lock_released_within_the_deadline_is_taken(tmp_path, monkeypatch):
    store = ResultStore(tmp_path / "results.jsonl")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "results.jsonl.lock"), "0.5"],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("COURSE_LOCK_TIMEOUT", "30")
        store.add(make("after the wait"))
    finally:
        holder.wait()
    assert [m.label for m in store.load()] == ["after the wait"]


# --- 10. SIGTERM ---------------------------------------------------------------------------------------------------
SIGTERMED = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    import course_utils.measure as mm
    import course_utils.cli as cli
    from course_utils.cli import main

    pidfile, good_line = Path(sys.argv[1]), sys.argv[2]

    def measure_all(rungs, *, store, **kw):  # stores one result, then a measuring child that never ends
        mm.ResultStore(store.path).path.write_text(good_line + "\\n")
        child = ("import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
                 "print('@@course-progress 1 0.1', flush=True); time.sleep(120)")
        mm.relay([sys.executable, "-c", child, str(pidfile)], dict(os.environ), None, None)
        raise AssertionError("the child was not ended")

    mm.measure_all = cli.measure_all = measure_all
    sys.exit(main(sys.argv[3:]))
""")


@pytest.mark.slow
def test_sigterm_ends_the_child_says_one_line_and_leaves_the_store_whole(tmp_path):
    pidfile, store = tmp_path / "child.pid", tmp_path / "results.jsonl"
    good = make("kept").to_json()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    parent = subprocess.Popen([sys.executable, "-c", SIGTERMED, str(pidfile), good, "run", "--no-progress",
                               "--store", str(store), "--out", str(tmp_path / "out")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    child = None
    try:
        deadline = time.monotonic() + 120
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            assert parent.poll() is None, parent.communicate()
            time.sleep(0.1)
        child = int(pidfile.read_text())
        signalled = time.monotonic()
        parent.send_signal(signal.SIGTERM)
        out, err = parent.communicate(timeout=30)
        assert time.monotonic() - signalled < 10, "the command took its time to stop"
        assert not alive(child), "the measuring child outlived its parent"  # ended and reaped before the parent left
    finally:
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
    assert parent.returncode == 143
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "stopped (SIGTERM)" in lines[0] and "Traceback" not in err
    assert [m.label for m in ResultStore(store).load()] == ["kept"]  # whole: every line reads back
