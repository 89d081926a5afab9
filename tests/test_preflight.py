"""Issue 14's CLI and API cases: every check that needs only the recipe and the machine runs before any
process start, download or disk write, and says what to do; the hub has deadlines; Ctrl-C and kill -9
leave no temporary folders; nonsense is an error, not a result. Fast: no training here."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from course_utils import checks
from course_utils import cli
from course_utils import measure
from course_utils import child
from course_utils import models
from course_utils import measure as runs
from course_utils.machine import HardwareError
from course_utils.models import ModelUnavailableError
from course_utils.recipe import Recipe, RecipeError


# --- 1. GPU presets on a CPU; one lock per preset -------------------------------------------------
def test_a_gpu_preset_on_a_cpu_is_refused_before_anything_is_written(course_home):
    before = set((course_home / "models").glob("*")) if (course_home / "models").exists() else set()
    with pytest.raises(HardwareError, match=r"llama-3.1-8b \(8.0 B parameters\) is a GPU preset.*course estimate"):
        checks.check_runnable(Recipe(model="llama-3.1-8b"))
    after = set((course_home / "models").glob("*")) if (course_home / "models").exists() else set()
    assert after == before  # no random shards, no lock file


def test_run_with_a_gpu_preset_on_a_cpu_is_one_line_and_exit_2(capsys, tmp_path):
    code = cli.main(["run", "--model", "llama-3.1-8b", "--out", str(tmp_path / "out"), "--store",
                     str(tmp_path / "r.jsonl"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("course: error: llama-3.1-8b") and "Traceback" not in err
    assert not (tmp_path / "r.jsonl").exists()


def test_preset_parameter_counts_match_their_published_sizes():
    assert 7.9e9 < checks.preset_params("llama-3.1-8b") < 8.1e9
    assert 1.2e9 < checks.preset_params("llama-3.2-1b") < 1.3e9  # tied embeddings counted once
    assert checks.preset_params("smollm2-360m") < checks.CPU_PARAM_LIMIT  # small enough to run on a CPU


def test_every_preset_has_its_own_lock_file(tmp_path):
    names = ["random-llama-3.1-8b", "random-llama-3.1-70b", "random-llama-3.2-1b"]
    locks = {models._lock_path(tmp_path / n) for n in names}
    assert len(locks) == 3 and all(p.name.endswith(".lock") for p in locks)


# --- 2. hub deadlines ---------------------------------------------------------------------------------
@pytest.fixture
def silent_hub():
    """A server that accepts connections and never answers (a hub that hangs)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held = []
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def _course(*args, **env) -> subprocess.CompletedProcess:
    """`course ...` in a fresh process (huggingface_hub reads HF_ENDPOINT at import)."""
    full = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    full.update(env)
    return subprocess.run([sys.executable, "-m", "course_utils.cli", *args], capture_output=True, text=True,
                          env=full, timeout=120)


def test_a_hub_that_never_answers_gives_an_error_within_the_deadline(silent_hub):
    started = time.perf_counter()
    done = _course("estimate", "--model", "someone/nonsense", HF_ENDPOINT=silent_hub, COURSE_HUB_TIMEOUT="2")
    waited = time.perf_counter() - started
    assert done.returncode == 2, done.stderr
    assert "did not answer within 2 s" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1  # no retry noise
    assert waited < 60  # the import of the stack, plus the 2 s deadline (it hung for over 200 s)


def test_a_hub_that_refuses_fails_at_once_without_a_config_read(monkeypatch):
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=2.0: False)
    monkeypatch.setattr(models, "_in_hub_cache", lambda model_id: False)
    with pytest.raises(ModelUnavailableError, match="HF_HUB_OFFLINE is set"):
        models.load_config("someone/nonsense")


def test_a_gated_model_says_how_to_get_access():
    class GatedRepoError(OSError):
        pass

    try:
        try:
            raise GatedRepoError("401 Client Error")
        except GatedRepoError as inner:
            raise OSError("You are trying to access a gated repo.") from inner
    except OSError as exc:
        message = str(models.hub_error("meta-llama/Llama-3.1-8B", exc))
    assert "gated" in message and "hf auth login" in message and "HF_TOKEN" in message


def test_the_offline_default_s_child_opens_no_hub_connection(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert measure.child_env(Recipe())["HF_HUB_OFFLINE"] == "1"
    assert measure.child_env(Recipe(model="llama-3.1-8b"))["HF_DATASETS_OFFLINE"] == "1"
    assert "HF_HUB_OFFLINE" not in measure.child_env(Recipe(model="someone/a-hub-model"))


# --- 5, 6. micro-batch against the data, sequence against the positions -------------------------------
def test_a_micro_batch_bigger_than_the_data_is_refused(tiny_model):
    tokens = models.shipped_token_count()
    blocks = tokens // 256
    with pytest.raises(RecipeError, match=rf"micro_batch=4096 .* at most {blocks} "):
        checks.check_runnable(Recipe(micro_batch=4096))
    checks.check_runnable(Recipe(micro_batch=blocks))  # the largest that the data holds is fine


def test_build_refuses_fewer_packed_sequences_than_one_micro_batch():
    from course_utils.build import check_packed

    with pytest.raises(RecipeError, match="packs into 3 sequences"):
        check_packed(Recipe(micro_batch=4), 3)
    check_packed(Recipe(micro_batch=4), 4)


def test_a_run_that_trained_other_batches_or_diverged_is_an_error():
    class Probe:
        batch_sizes, losses = {4}, [7.0, 6.5]

    child.check_sane(Recipe(micro_batch=4), Probe())
    Probe.batch_sizes = {4, 1}
    with pytest.raises(child.MeasurementError, match=r"trained batches of \[1\]"):
        child.check_sane(Recipe(micro_batch=4), Probe())
    Probe.batch_sizes, Probe.losses = {4}, [7.0, float("nan")]
    with pytest.raises(child.MeasurementError, match=r"not finite at step\(s\) \[2\]"):
        child.check_sane(Recipe(micro_batch=4), Probe())


@pytest.mark.parametrize("args", [["estimate", "--model", "tiny", "--seq", "5000"],
                                  ["plan", "--model", "llama-3.1-8b", "--seq", "10000000", "--budget", "16GiB"],
                                  ["estimate", "--model", "llama-3.1-8b", "--seq", "10000000"]])
def test_a_sequence_beyond_the_model_s_positions_is_an_error(args, capsys):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "position table" in err and "Use max_seq_length <=" in err


def test_run_refuses_a_sequence_beyond_the_positions_before_measuring(tmp_path):
    with pytest.raises(RecipeError, match="1,024 positions"):
        measure.run_ladder(Recipe(max_seq_length=5000), store=measure.ResultStore(tmp_path / "r.jsonl"))
    assert not (tmp_path / "r.jsonl").exists()


# --- 7, 8. the planner on the tiny model; the ladder's skip reason ------------------------------------
def test_the_planner_does_not_scale_h200_speeds_to_a_tiny_model():
    from course_utils.estimate.planner import plan

    result = plan("tiny", "1GiB")
    assert result.pick is None
    assert all(r.speed.tokens_per_s is None and "not modelled" in r.speed.basis for r in result.rows)
    assert "none is picked" in result.format()


def test_the_accumulation_rung_at_micro_batch_1_is_skipped_for_the_right_reason():
    from course_utils.recipe import ladder

    rungs = ladder(Recipe(micro_batch=1))
    accumulation = next(i for i, r in enumerate(rungs) if "accumulation" in r.label)
    reason = runs._same_as_above(rungs[accumulation - 1], rungs[accumulation], "cpu")
    assert "precision" not in reason and "1x1" in reason
    mixed = next(i for i, r in enumerate(rungs) if r.precision == "auto" and rungs[i - 1].precision != "auto")
    assert "precision=auto is fp32 on cpu" in runs._same_as_above(rungs[mixed - 1], rungs[mixed], "cpu")


# --- 9. the measuring child's errors arrive as one line of the same type ------------------------------
@pytest.mark.parametrize("kind", [RecipeError, HardwareError, ModelUnavailableError, child.MeasurementError])
def test_a_child_error_is_raised_again_as_its_own_type(kind):
    with pytest.raises(kind) as info:
        measure._read_child_result(child._child_error(kind("lora target 'x' not found")))
    assert str(info.value) == "lora target 'x' not found"


# --- 10-12. output folders, Ctrl-C, temporary folders, budgets ----------------------------------------
def test_out_pointing_at_a_file_is_refused_before_measuring(capsys, tmp_path):
    (tmp_path / "a-file").write_text("")
    code = cli.main(["run", "--out", str(tmp_path / "a-file"), "--store", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and "is a file, not a folder" in err and not (tmp_path / "r.jsonl").exists()


def test_ctrl_c_says_what_was_saved_and_how_to_resume(capsys, monkeypatch, tmp_path):
    def interrupted(args):
        cli._STATE.update(store=measure.ResultStore(tmp_path / "r.jsonl"), stored_before=0)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_env", interrupted)
    assert cli.main(["env"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "No result of this run was stored yet" in err and "run the same command again" in err
    assert "Traceback" not in err


def test_temporary_folders_of_dead_processes_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"course-run-{dead.pid}-abc"
    mine = tmp_path / f"course-run-{os.getpid()}-def"
    stale.mkdir()
    mine.mkdir()
    with child.temp_folder("course-run-") as folder:
        assert Path(folder).name.startswith(f"course-run-{os.getpid()}-")
    assert not stale.exists() and mine.exists()


def test_an_interrupted_model_build_leaves_no_folder(tmp_path):
    target = tmp_path / "random-x"
    (tmp_path / ".random-x-leftover").mkdir()  # from a build killed with kill -9
    with pytest.raises(KeyboardInterrupt):
        with models._building(target) as tmp:
            (tmp / "half-written").write_text("")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == [] and not target.exists()


@pytest.mark.parametrize("budget, says", [("-1GiB", "not a positive amount"), ("1e9GiB", "more than 1 PiB"),
                                          ("lots", "Cannot read the budget")])
def test_a_bad_budget_says_what_is_wrong(budget, says, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["plan", "--model", "llama-3.1-8b", "--budget", budget])
    assert info.value.code == 2 and says in capsys.readouterr().err


def test_a_budget_in_scientific_notation_is_read():
    from course_utils.estimate.plan import parse_budget

    assert parse_budget("1.6e1GiB") == 16 * 2**30


# --- issue 13: a speed from a busy machine is not trusted silently ------------------------------------
def _measured(**timing):
    from course_utils.results import environment
    from course_utils.results import Measurement

    r, env = Recipe(), environment()
    return Measurement(recipe=r.to_dict(), recipe_key=r.key, env={"device": "cpu"}, env_key=env.key, status="ok",
                       peak_bytes=1, tokens_per_s=76.0, timing=timing)


def test_a_noisy_speed_is_marked():
    assert _measured(spread=0.9).noisy and _measured(cpu_share=0.2).noisy
    assert not _measured(spread=0.05, cpu_share=0.9).noisy and not _measured().noisy  # old results: unmarked


def test_a_noisy_stored_speed_is_measured_again(tmp_path, monkeypatch, tiny_model):
    store = measure.ResultStore(tmp_path / "r.jsonl")
    store.add(_measured(spread=0.9))
    steady = _measured(spread=0.02, cpu_share=0.95)
    monkeypatch.setattr(measure, "run_here", lambda recipe, budget, report_progress=None, **how: steady)
    assert measure.measure(Recipe(), store=store, isolate=False, progress=False) is steady
    assert store.find(Recipe(), steady.env_key).timing["spread"] == 0.02
    assert measure.measure(Recipe(), store=store, isolate=False, progress=False).cached  # steady: reused


def test_the_plot_marks_a_noisy_point():
    from course_utils.show.plots import memory_vs_speed

    ax = memory_vs_speed([_measured(spread=0.02), _measured(spread=0.9)])
    hollow = [c for c in ax.collections if c.get_gid() == "points" and tuple(c.get_facecolor()[0]) == (1, 1, 1, 1)]
    assert len(hollow) == 1 and len(hollow[0].get_offsets()) == 1  # the noisy one is drawn hollow
    assert any(t.get_text().startswith("hollow: a speed not to be trusted (its timed steps differed a lot)")
               for t in ax.figure.texts
               if t.get_gid() == "caption")  # and the key says what hollow means


def test_a_store_that_is_a_folder_is_one_line_before_measuring(capsys, tmp_path):
    (tmp_path / "store-dir").mkdir()
    code = cli.main(["run", "--out", str(tmp_path / "out"), "--store", str(tmp_path / "store-dir"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("course: error:") and "store-dir" in err and "Traceback" not in err


def test_a_lora_target_the_model_lacks_is_refused_before_loading(tiny_model):
    with pytest.raises(RecipeError, match=r"\['qkv'\] not found in 'tiny'.*q_proj"):
        checks.check_runnable(Recipe(lora_targets=("q_proj", "qkv")))


def test_the_known_linear_names_are_the_tiny_model_s(tiny_model):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model))
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert names == set(checks.KNOWN_LINEARS)


def test_the_estimator_refuses_a_sequence_beyond_the_positions_too():
    from course_utils.estimate import estimate

    with pytest.raises(RecipeError, match="1,024 positions"):
        estimate(Recipe(max_seq_length=5000), hardware="cpu")
