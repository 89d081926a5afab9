"""scripts/gpu/peak_matmul.py without a GPU: the record's provenance names the command that was run."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_record_names_the_arguments_main_was_given(tmp_path, monkeypatch):
    import torch

    import course_utils.machine

    script = runpy.run_path(str(ROOT / "scripts" / "gpu" / "peak_matmul.py"), run_name="peak_matmul")
    main = script["main"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a stand-in GPU")
    monkeypatch.setattr(course_utils.machine, "driver_version", lambda: "0.0")
    # what course_utils.results.environment() reads of a GPU
    monkeypatch.setattr(course_utils.machine, "device_name", lambda: "a stand-in GPU")
    monkeypatch.setattr(course_utils.machine, "device_type", lambda: "cuda")
    monkeypatch.setattr(course_utils.machine, "total_memory_bytes", lambda: 16 * 2**30)
    monkeypatch.setattr(course_utils.machine, "compute_capability", lambda: (7, 5))
    monkeypatch.setattr(course_utils.machine, "bf16_supported", lambda: False)
    monkeypatch.setitem(main.__globals__, "measure", lambda size, dtype, repeats, warmup: dict(
        size=size, dtype=dtype, median_s=1.0, tflops=1.0))
    monkeypatch.setattr("sys.argv", ["pytest", "-q"])  # what the process was started with: not this record's command
    out = tmp_path / "peak.jsonl"
    assert main(["--out", str(out), "--size", "64", "--dtype", "fp16"]) == 0
    record = json.loads(out.read_text())
    assert record["command"] == f"scripts/gpu/peak_matmul.py --out {out} --size 64 --dtype fp16"
    assert (record["device"], record["size"], record["dtype"]) == ("a stand-in GPU", 64, "fp16")
