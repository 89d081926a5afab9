"""The `course` command: `course env`, `course run` on the ladder, and bad input (exit code 2, fast).

`course run` measures seven recipes. To keep the suite's real subprocess measurements few (CI's time), the
ladder's baseline comes from the session store (measured in a real child by the conftest fixture, the
path `course run` takes on a GPU), and the other rungs go through `run_here`: the same code the child
runs, in this process. Everything else (run_ladder, measure's
store logic, the table, the plot, ladder.jsonl) is the real thing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from importlib import metadata

import pytest

from course_utils import measure as measure_mod
from course_utils import child
from course_utils.cli import main
from course_utils.machine import device_name
from course_utils.recipe import LADDER_STEPS
from course_utils.results import Measurement, ResultStore, environment

LABELS = [label for label, _ in LADDER_STEPS]


def test_console_script_is_installed():
    scripts = {ep.name: ep.value for ep in metadata.entry_points(group="console_scripts")}
    assert scripts.get("course") == "course_utils:cli_main"


def test_env_prints_ok_lines(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "[OK]" in out
    assert device_name() in out


# --- the ladder ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ladder_run(baseline_measurement, shared_store, cli_run_args, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli-run")
    store = ResultStore(tmp / "results.jsonl")
    store.path.write_bytes(shared_store.path.read_bytes())  # the baseline is already measured
    out_dir = tmp / "out"
    how: list[tuple[str, str]] = []
    def in_process(recipe, budget_gib, progress, timeout_s):
        how.append((recipe.label, "in-process"))
        return child.run_here(recipe, budget_gib)

    def timed_again(recipe, isolate, progress):  # --repeats 1: the rung's stored run, 10% faster (no training)
        how.append((recipe.label, "again"))
        first = store.find(recipe, environment().key)
        return dataclasses.replace(first, tokens_per_s=round(first.tokens_per_s * 1.1, 1), speeds=[])

    stdout, stderr = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        mp.setattr(measure_mod, "_run_child", in_process)
        mp.setattr(measure_mod, "_time_once", timed_again)
        mp.setattr(Measurement, "noisy", property(lambda self: False))  # a busy machine: still the stored baseline
        code = main(["run", *cli_run_args, "--store", str(store.path), "--out", str(out_dir), "--no-progress"])
    return dict(code=code, out=stdout.getvalue(), err=stderr.getvalue(), out_dir=out_dir, store=store, how=how,
                baseline=baseline_measurement)


def _jsonl(run) -> dict[str, Measurement]:
    lines = (run["out_dir"] / "ladder.jsonl").read_text().splitlines()
    ms = [Measurement.from_dict(json.loads(line)) for line in lines]
    return {m.label: m for m in ms}


@pytest.mark.slow
def test_run_succeeds_and_measures_each_distinct_rung_once(ladder_run):
    assert ladder_run["code"] == 0, ladder_run["err"][-3000:]
    labels = [label for label, how in ladder_run["how"] if how == "in-process"]
    # the baseline came from the store; mixed precision is the rung above on a CPU, so not measured
    assert labels == [label for label in LABELS if label not in (LABELS[0], "+ mixed precision")]
    assert "(1 of the rungs came from the results store" in ladder_run["out"]
    # --repeats 1 (the default): every rung measured, the stored baseline too, timed once more in reverse order
    again = [label for label, how in ladder_run["how"] if how == "again"]
    assert again == [label for label in reversed(LABELS) if label != "+ mixed precision"]
    assert len(ladder_run["store"].load()) == 7 + len(again)  # each rung stored again with both its speeds


@pytest.mark.slow
def test_run_prints_the_table_with_every_rung(ladder_run):
    out = ladder_run["out"]
    table = out[out.index("Peak memory by category"):out.index("What each technique changed")]
    for label in LABELS:
        assert label in table, label
    assert "(MiB)" in table
    assert "±" in table and "timed once" not in out  # every speed with its spread in this run (--repeats 1)
    skipped = next(line for line in table.splitlines() if line.startswith("+ mixed precision"))
    assert "skipped: precision=auto is fp32 on cpu" in skipped
    assert "does not fit" not in table
    assert f"Device: {device_name()}" in out


@pytest.mark.slow
def test_run_prints_what_each_technique_changed(ladder_run):
    out = ladder_run["out"]
    changes = out[out.index("What each technique changed"):].splitlines()
    at = next(i for i, line in enumerate(changes) if line.strip().startswith("+ gradient checkpointing:"))
    rest = [line for line in changes[at + 1:]]
    ckpt = " ".join([changes[at]] + [line.strip() for line in rest[:next((i for i, line in enumerate(rest)
                                                                          if line.strip().startswith("+ ")
                                                                          or not line.strip()), len(rest))]])
    assert "largest change in activations" in " ".join(ckpt.split())  # its line may wrap at 100 characters
    assert not any(line.strip().startswith("+ mixed precision:") for line in changes)


@pytest.mark.slow
def test_run_writes_the_plot_and_the_results(ladder_run):
    png = ladder_run["out_dir"] / "ladder.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    by_label = _jsonl(ladder_run)
    assert list(by_label) == [label for label in LABELS if label != "+ mixed precision"]
    assert all(m.status == "ok" and m.tokens_per_s > 0 and len(m.speeds) == 2 for m in by_label.values())
    base = by_label[LABELS[0]]
    assert base.peak_by_category == ladder_run["baseline"].peak_by_category  # memory is the stored run's
    assert base.speeds == [ladder_run["baseline"].tokens_per_s, round(ladder_run["baseline"].tokens_per_s * 1.1, 1)]


@pytest.mark.slow
def test_run_shows_what_the_readme_promises(ladder_run):
    m = _jsonl(ladder_run)
    base, ckpt = m["baseline (LoRA, fp32)"], m["+ gradient checkpointing"]
    accum, adam8 = m["+ accumulation (micro-batch 1)"], m["+ 8-bit AdamW"]
    paged, q4, short = m["+ paged 8-bit AdamW"], m["+ 4-bit QLoRA (NF4, double quant)"], m["+ shorter sequences"]
    assert ckpt.peak_by_category["activations"] < base.peak_by_category["activations"]
    assert accum.peak_bytes < ckpt.peak_bytes
    assert adam8.peak_by_category["optimizer"] < accum.peak_by_category["optimizer"]
    assert q4.peak_by_category["parameters"] < paged.peak_by_category["parameters"]
    assert short.peak_bytes < q4.peak_bytes
    assert short.peak_bytes < base.peak_bytes / 2  # the whole ladder at least halves the peak here


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("args, knob", [
    (["--steps", "0"], "steps"),
    (["--steps", "-2"], "steps"),
    (["--steps", "3"], "warmup_steps"),  # the default warm-up is 2 steps, so 4 is the minimum
    (["--seq", "0"], "max_seq_length"),
    (["--micro-batch", "0"], "micro_batch"),
    (["--lr", "0"], "learning_rate"),
])
def test_bad_numbers_exit_2_with_an_error(capsys, tmp_path, args, knob):
    out_dir = tmp_path / "out"
    try:  # its flag's field rule refuses it (argparse exits), or the rules between fields do (main returns 2)
        code = main(["run", *args, "--out", str(out_dir), "--store", str(tmp_path / "r.jsonl")])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert "error" in err and knob in err
    assert not out_dir.exists() and not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("args", [["--steps", "many"], ["--optimizer", "adamw8bit"], ["--bogus"]])
def test_unparseable_arguments_exit_2(capsys, args):
    with pytest.raises(SystemExit) as exc:
        main(["run", *args])
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_unavailable_model_exits_2_with_advice(capsys, tmp_path, monkeypatch):
    # in-process instead of a child, so the ModelUnavailableError reaches main() itself
    monkeypatch.setattr(measure_mod, "_run_child", lambda recipe, budget, progress, timeout: child.run_here(recipe))
    code = main(["run", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "out"),
                 "--store", str(tmp_path / "r.jsonl"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "course: error:" in err and "tiny" in err


@pytest.mark.parametrize("rank", ["0", "-4"])
def test_a_lora_rank_of_zero_or_less_is_an_error_not_a_full_fine_tune(rank, capsys):
    from course_utils.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["estimate", "--model", "tiny", "--lora-r", rank])
    assert exit_.value.code == 2 and "is not a LoRA rank" in capsys.readouterr().err
