"""`course run --gpus N`, `course estimate --gpus N --strategy ...` and `course plan --budget "2 x 15 GiB"`
(course_utils.cli, notebook 11_more_than_one_gpu): argument parsing and the paths the flags choose, in this
process with distributed.launch replaced. No real `course run --gpus 2` runs here: it launches every rung of the
ladder (about 20 s a launch on 2 cores); the real two-process run is tests/test_distributed.py's.
"""

from __future__ import annotations

import json

import pytest

from course_utils import cli
from course_utils import distributed
from course_utils.cli import build_parser, main


def test_run_parses_gpus_and_strategy():
    args = build_parser().parse_args(["run", "--gpus", "2", "--strategy", "ddp"])
    assert args.gpus == 2 and args.strategy == "ddp" and args.func is cli._cmd_run
    args = build_parser().parse_args(["run"])
    assert args.gpus == 1 and args.strategy is None  # the single-process path


@pytest.mark.parametrize("bad", ["0", "-1", "two"])
def test_a_bad_gpu_count_is_an_argument_error(bad, capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "--gpus", bad])
    assert info.value.code == 2 and "--gpus takes a whole number" in capsys.readouterr().err


def test_an_unknown_strategy_is_an_argument_error(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--gpus", "2", "--strategy", "zero3"])
    assert "invalid choice" in capsys.readouterr().err


def test_fsdp_on_a_cpu_is_one_line_and_nothing_starts(monkeypatch, capsys, tmp_path):
    if distributed.visible_gpus():
        pytest.skip("a CPU-only check")
    monkeypatch.setattr(distributed, "launch", lambda *a, **k: pytest.fail("launch must not be called"))
    code = main(["run", "--gpus", "2", "--strategy", "fsdp", "--out", str(tmp_path / "out"),
                 "--store", str(tmp_path / "r.jsonl"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("course: error: strategy='fsdp' needs GPUs") and err.count("\n") == 1


def test_too_many_processes_is_one_line(monkeypatch, capsys, tmp_path):
    if distributed.visible_gpus():
        pytest.skip("a CPU-only check")
    monkeypatch.setattr(distributed, "launch", lambda *a, **k: pytest.fail("launch must not be called"))
    code = main(["run", "--gpus", "64", "--out", str(tmp_path / "out"), "--store", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and "CPU cores" in err and err.count("\n") == 1


def test_run_with_gpus_launches_every_rung(monkeypatch, capsys, tmp_path):
    """Each rung that is not skipped goes to distributed.launch with the GPU count and strategy; the table, the
    rank table and the files follow from what launch returns (a combined two-rank Measurement)."""
    from course_utils.distributed import combine
    from course_utils.child import run_here

    calls = []

    def fake_launch(recipe, gpus, strategy, **how):
        calls.append((recipe.label, gpus, strategy))
        m = run_here(recipe.with_(steps=3, warmup_steps=1, max_seq_length=32, micro_batch=1))
        rank = lambda r: {"rank": r, "measurement": json.loads(m.to_json()), "tokens": 64, "first_batch": f"hash{r}",  # noqa
                          "saved": r == 0, "distributed_type": "MULTI_CPU"}
        out = combine(recipe, strategy, [rank(0), rank(1)], gpus)
        out.recipe = {**out.recipe, "label": recipe.label}
        return out

    monkeypatch.setattr(distributed, "launch", fake_launch)
    monkeypatch.setattr(distributed, "check_launch", lambda recipe, gpus, strategy: "cpu")
    monkeypatch.setattr("course_utils.measure.ladder_here", lambda base: ([base, base.with_(label="+ twice")], {1: "same"}))
    code = main(["run", "--gpus", "2", "--out", str(tmp_path / "out"), "--store", str(tmp_path / "r.jsonl"),
                 "--no-progress", "--steps", "4", "--seq", "32"])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, captured.err
    assert calls == [("baseline (LoRA, fp32)", 2, "ddp")]  # the skipped rung is not launched
    assert "ddp on 2 CPU processes (gloo)" in out and "skipped: same" in out
    assert "hash0" in out and "hash1" in out
    assert (tmp_path / "out" / "ladder-2xddp.jsonl").read_text().count("\n") == 1
    assert (tmp_path / "out" / "ladder-2xddp.png").exists()


def test_estimate_per_gpu(capsys):
    assert main(["estimate", "--model", "llama-3.1-8b", "--source", "--gpus", "2", "--strategy", "fsdp"]) == 0
    out = capsys.readouterr().out
    assert "FSDP full shard on 2 GPUs" in out and "sharded over 2 GPUs" in out
    assert main(["estimate", "--model", "llama-3.1-8b", "--source", "--gpus", "2"]) == 0
    assert "DDP on 2 GPUs" in capsys.readouterr().out  # ddp is the default, as for course run
    assert main(["estimate", "--model", "llama-3.1-8b", "--source"]) == 0
    assert "GPUs" not in capsys.readouterr().out.splitlines()[1]  # one GPU: the single estimate, unchanged


def test_estimate_gpus_without_a_model_is_one_line(capsys):
    assert main(["estimate", "--gpus", "2"]) == 2
    err = capsys.readouterr().err
    assert "give it with --model" in err and err.count("\n") == 1


def test_plan_takes_a_multi_gpu_budget(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--budget", "2 x 15 GiB", "--hardware", "t4"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "on 2 x NVIDIA T4" in out and "Budget 2 x 15.00 GiB" in out and "FSDP" in out
    assert main(["plan", "--model", "llama-3.1-8b", "--budget", "24GiB", "--gpus", "2"]) == 0
    assert "Budget 2 x 24.00 GiB" in " ".join(capsys.readouterr().out.split())


def test_plan_budget_and_gpus_that_disagree(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--budget", "2 x 15 GiB", "--gpus", "4"]) == 2
    assert "for 2 GPUs but --gpus 4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", "--model", "llama-3.1-8b", "--budget", "x 15 GiB"])
    assert "no GPU count" in capsys.readouterr().err
