"""Issue 16's shipped tries (course_utils/chapter/toward_the_limit.py) and the measured matmul rate (limits.measured_peak)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils.chapter import beyond_the_recipe as beyond
from course_utils.chapter import toward_the_limit
from course_utils.estimate import limits
from course_utils.chapter import toward_the_limit as tries

ROOT = Path(__file__).resolve().parents[1]


def _line(run, variant, tokens, gib, dropout=0.05, status="ok", **extra):
    return dict(run=run, variant=variant, status=status, allocated_gib=gib, tokens_per_s=tokens,
                recipe={"lora_dropout": dropout}, date="2026-12-02T04:34:48+00:00", **extra)


@pytest.fixture
def fake(monkeypatch):
    lines = [_line("a", "1x16 Liger", 800.0, 4.8), _line("a", "1x16 Liger, dropout 0", 1000.0, 4.7, dropout=0.0),
             _line("b", "1x16 Liger", 1000.0, 4.8), _line("b", "1x16 compiled layers, no Liger", 1100.0, 4.9,
                                                        compile=dict(graphs=1, graph_breaks=0, break_reasons=[],
                                                                     recompiles=0)),
             dict(run="b", variant="1x16 compiled layers, CUDA graphs, no Liger", status="failed",
                  error='Traceback...\nRuntimeError: Error: accessing tensor output of CUDAGraphs that has been '
                        'overwritten by a subsequent run. Stack trace: ...')]
    monkeypatch.setattr(tries, "records", lambda model="llama-3.1-8b": tuple(lines))
    return lines


def test_a_try_is_compared_with_its_baseline_of_the_same_lease(fake):
    t = tries.tried("1x16 compiled layers, no Liger")
    assert t.baseline == "1x16 Liger" and t.run == "b"
    assert t.speed_ratio == pytest.approx(1.1) and t.memory_ratio == pytest.approx(4.9 / 4.8)  # lease b's, not a's 800
    assert t.same_training is True and t.what == "1 graph, no graph break, no recompiles, timed eagerly"
    later = {"status": "ok", "date": "2026-12-08T00:00:00+00:00",  # after child.py's eager stance: timed compiled
             "compile": {"graphs": 1, "graph_breaks": 0, "recompiles": 0, "break_reasons": []}}
    assert tries._what(later) == "1 graph, no graph break, no recompiles"
    quiet = tries.tried("1x16 Liger, dropout 0")
    assert quiet.speed_ratio == pytest.approx(1.25) and quiet.same_training is False


def test_a_failed_try_says_why_and_has_no_ratios(fake):
    t = tries.tried("1x16 compiled layers, CUDA graphs, no Liger")
    assert t.what == "failed: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run"
    assert t.speed_ratio is None and t.same_training is None
    html = tries.table()._repr_html_()
    assert "<table" in html and "CUDAGraphs" in html and html.count("<tr") == 1 + len(fake)


def test_unknown_tries_name_what_there_is(fake):
    with pytest.raises(KeyError, match="there are: .*1x16 Liger"):
        tries.tried("1x16 with magic")
    with pytest.raises(KeyError, match="no batching"):
        fake.append(_line("a", "8x2 something", 1.0, 1.0))
        tries.tried("8x2 something")


def test_the_shipped_tries_hold_what_the_readme_says():
    shipped = tries.rows()
    assert {r.baseline for r in shipped} == set(tries.BASELINES.values())
    quiet = tries.tried("16x1 offload, dropout 0")  # the raw lines' own ratio, against its lease's baseline
    assert quiet.speed_ratio == 11278.5 / 10686.8 and quiet.memory_ratio == 5.98 / 6.30 and quiet.same_training is False
    liger_compiled = tries.tried("1x16 Liger, compiled layers")
    assert liger_compiled.what.startswith("no graphs, 1 graph break at dispatch()")  # Liger's compiler.disable'd
    assert tries.lease("tries-20261202-0434") == "04:34" and tries.lease("other") == "other"
    for d in tries.records():
        assert d["run"] and d["variant"] and d["status"] in ("ok", "failed", "timeout")
        if d["status"] == "ok":  # provenance: GPU, versions, date, command; and what ran
            assert d["env"]["device"] and d["env"]["versions"]["torch"] and d["command"] and d["date"]
            assert d["recipe"]["model"] == "llama-3.1-8b" and d["tokens_per_s"] > 0 and d["allocated_gib"] > 0
        else:
            assert d["error"]


def test_the_measured_peak_is_the_fastest_shipped_size_and_moves_the_limit():
    path = ROOT / "course_utils/reference/beyond/tries/peak-matmul.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for d in lines:  # each rate with its GPU, driver, CUDA, versions, date, command and every timed run
        assert d["env"]["driver"] and d["env"]["cuda"] and d["env"]["versions"]["torch"] and d["date"] and d["command"]
        assert d["tflops"] == pytest.approx(d["flops"] / d["median_s"] / 1e12, rel=1e-3)
        assert len(d["seconds"]) == d["repeats"]
    peak = limits.measured_peak()
    assert peak.tflops == max(d["tflops"] for d in lines if d["device"] == "NVIDIA H200")
    assert peak.date and peak.command.startswith(("scripts/peak_matmul.py", "scripts/gpu/peak_matmul.py"))
    at_sheet = toward_the_limit.toward("fast recipe (16x1)")
    at_measured = toward_the_limit.toward("fast recipe (16x1)", peak=peak.flops_per_s)
    assert at_measured.limit_tokens_per_s == pytest.approx(peak.flops_per_s / (at_sheet.gflop_per_token * 1e9))
    assert at_measured.fraction > at_sheet.fraction  # a measured rate under the datasheet's: a larger fraction
    with pytest.raises(KeyError, match="peak_matmul.py measures one"):
        limits.measured_peak("Tesla T4")


def test_the_script_refuses_a_variant_it_does_not_have(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts/gpu/try_step_changes.py"), "--model", "tiny", "--only",
                           "1x16 with magic", "--out", str(tmp_path / "t.jsonl")], capture_output=True, text=True,
                          timeout=300, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                            "COURSE_HOME": str(tmp_path)})
    assert done.returncode == 2 and "no variant ['1x16 with magic']; there are:" in done.stderr
    assert not (tmp_path / "t.jsonl").exists()


def test_rounds_in_one_lease_compare_medians(fake):
    fake += [_line("c", "1x16 Liger", v, 4.8) for v in (900.0, 1000.0, 1300.0)]
    fake += [_line("c", "1x16 Liger, dropout 0", v, 4.7, dropout=0.0) for v in (1100.0, 950.0, 1200.0)]
    t = tries.tried("1x16 Liger, dropout 0")
    assert t.run == "c" and t.count == 3 and t.speed_ratio == pytest.approx(1100 / 1000)
    assert tries.tried("1x16 Liger, dropout 0", "a").speed_ratio == pytest.approx(1000 / 800)
    assert [(r.variant, r.run) for r in tries.rows()].count(("1x16 Liger", "c")) == 1  # a row per lease, not per round


def test_the_shipped_profile_says_where_the_step_time_went():
    for label in ("fast recipe (16x1)", "+ Liger kernels", "fast, embeddings + activations on CPU (16x1)"):
        p = tries.profiled(label)
        assert p["device"] == "NVIDIA H200" and p["date"] and p["command"] and p["versions"]["torch"] == "2.11.0"
        assert p["gpu_busy"] == pytest.approx(p["kernel_s"] / p["step_s"], abs=0.001)
        assert sum(p["by_kind"].values()) == pytest.approx(p["kernel_s"], abs=0.01)
        assert "flops_per_token" not in p  # that day's arithmetic is not shipped: course_utils.limits has it
    assert tries.profiled("+ Liger kernels")["gpu_busy"] < 0.5 < tries.profiled("fast recipe (16x1)")["gpu_busy"]
    with pytest.raises(KeyError, match="there are:"):
        tries.profiled("source recipe (1x16)")  # the call ended before its profile


def test_a_lease_without_a_finished_baseline_still_shows_its_tries(fake):
    fake[:] = [dict(run="d", variant="16x1 offload", status="timeout", error="over 200 s"),
               _line("d", "16x1 offload, dropout 0", 1200.0, 5.9, dropout=0.0),
               _line("d", "1x16 Liger", 0.0, 0.0)]  # a CPU smoke line: no CUDA peak
    t = tries.tried("16x1 offload, dropout 0")
    assert t.baseline is None and t.speed_ratio is None and t.memory_ratio is None and t.same_training is None
    assert "no finished 16x1 offload in this lease" in t.what and t.tokens_per_s == 1200.0
    assert tries.tried("1x16 Liger").memory_ratio is None  # 0 / 0: no ratio, not a ZeroDivisionError
    assert len(tries.rows()) == 3 and "<table" in tries.table()._repr_html_()
