"""scripts/device/device_wheels.py: the wheels a lent GPU machine gets, and the T4 check's preflight agree (no network)."""

from __future__ import annotations

import os
import runpy
import sys
import zipfile
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str) -> dict:
    """The script's namespace, its top level run with this process's environment and sys.path restored after it
    (t4_check sets COURSE_PROFILE=t4, which would put every later test in this session under the T4 profile)."""
    with mock.patch.dict(os.environ), mock.patch.object(sys, "path", list(sys.path)):
        return runpy.run_path(str(next((ROOT / "scripts").rglob(f"{name}.py"))), run_name=name)


def test_loading_a_script_leaves_this_process_as_it_was():
    env, path = dict(os.environ), list(sys.path)
    for name in ("t4_check", "device_wheels"):
        _script(name)
    assert dict(os.environ) == env and sys.path == path


def test_the_wheels_cover_what_the_t4_checks_preflight_asks_for():
    import ast

    wheels = _script("device_wheels")
    tree = ast.parse((ROOT / "scripts" / "gpu" / "t4_check.py").read_text())  # read, not run: it imports the course
    needed = next(ast.literal_eval(n.value) for n in tree.body
                  if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "NEEDED")
    carried = {n.replace("-", "_") for n in list(wheels["VERSIONS"]) + list(wheels["WIDGET_DEPS"])}
    assert "ipywidgets" in needed and set(needed) - {"course_utils"} <= carried  # course_utils: the checkout


def test_bitsandbytes_keeps_only_the_cpu_and_cuda_13_libraries(tmp_path):
    wheels = _script("device_wheels")
    wheel = tmp_path / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
    libs = ["libbitsandbytes_cpu.so", "libbitsandbytes_cuda118.so", "libbitsandbytes_cuda128.so",
            "libbitsandbytes_cuda130.so", "libbitsandbytes_cuda132.so", "libbitsandbytes_rocm72.so"]
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("bitsandbytes/__init__.py", "x = 1\n")
        for lib in libs:
            z.writestr(f"bitsandbytes/{lib}", "0" * 1000)
        z.writestr("bitsandbytes-0.50.2.dist-info/RECORD", "stale\n")
    assert wheels["strip_bitsandbytes"](tmp_path) > 0
    with zipfile.ZipFile(wheel) as z:
        kept = sorted(Path(n).name for n in z.namelist() if n.endswith(".so"))
    assert kept == ["libbitsandbytes_cpu.so", "libbitsandbytes_cuda130.so"]
    assert wheels["strip_bitsandbytes"](tmp_path) == 0  # nothing left to strip


def test_a_notebook_stopped_by_the_limit_is_recorded_with_the_cell_it_was_in(tmp_path):
    """t4_check.check_one on a notebook that outlasts its limit: the record says where it stopped, and a notebook
    the --deadline left no time for gets a record of the same shape (2026-12-02: a call's wait ended before
    the check wrote notebook 07's records, so nothing of its 9 minutes came back)."""
    import json

    check = _script("t4_check")
    nb = tmp_path / "99_slow.ipynb"
    cells = [{"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": [], "execution_count": None},
             {"cell_type": "code", "source": "import time\ntime.sleep(300)", "metadata": {}, "outputs": [],
              "execution_count": None}]
    nb.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    (tmp_path / "home" / "models").mkdir(parents=True)
    logs = tmp_path / "logs"
    logs.mkdir()
    record = check["check_one"](nb, "small", tmp_path / "home", logs, True, 12.0)  # room for a busy start-up
    assert not record["ran_through"] and record["wall_s"] < 120
    assert record["first_failure"].startswith("stopped at the 12 s limit in cell 1 (1 cells done)")
    skipped = check["not_run"](nb, "small", "not started: 12 s of the --deadline left")
    assert set(skipped) == set(record) and not skipped["ran_through"]


def test_preflight_imports_each_package_rather_than_only_finding_it(tmp_path, monkeypatch):
    """A package that is installed but cannot be imported (wheels installed with --no-deps, a dependency left
    out) is reported before the check starts, not at a notebook's cell minutes in."""
    check = _script("t4_check")
    (tmp_path / "broken_pkg").mkdir()
    (tmp_path / "broken_pkg" / "__init__.py").write_text("import no_such_dependency_here\n")
    (tmp_path / "fine_pkg").mkdir()
    (tmp_path / "fine_pkg" / "__init__.py").write_text("print('importing fine_pkg')\n")  # output is not a miss
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setitem(check["preflight"].__globals__, "NEEDED", ("fine_pkg",))
    assert check["preflight"]() == ""
    monkeypatch.setitem(check["preflight"].__globals__, "NEEDED", ("fine_pkg", "broken_pkg"))
    line = check["preflight"]()
    assert "cannot import broken_pkg (ModuleNotFoundError" in line and "fine_pkg" not in line


def test_the_deadline_counts_from_the_start_of_the_check(tmp_path, monkeypatch):
    """--deadline is the whole check's: the time the check spends before its first notebook (the preflight's
    imports, NVML's probe) comes out of the first notebook's limit, so the last record is written by then."""
    import time

    import torch

    import course_utils.machine
    import course_utils.results

    check = _script("t4_check")
    main = check["main"]
    limits = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a stand-in GPU")
    monkeypatch.setattr(course_utils.machine, "active_profile", lambda: type("P", (), {"label": "T4 profile"})())
    monkeypatch.setattr(course_utils.results, "environment_record", lambda: {})
    monkeypatch.setitem(main.__globals__, "preflight", lambda: time.sleep(1.5) or "")
    record = dict(ran_through=True, wall_s=0.0, precisions=[], card_peak_gib=0.0, first_failure="")
    monkeypatch.setitem(main.__globals__, "check_one", lambda nb, variant, *a: limits.append(a[3]) or
                        dict(record, notebook=nb.stem, variant=variant))
    assert main(["--out", str(tmp_path / "out.jsonl"), "--notebooks", "01", "--cores", "0", "--deadline", "100",
                 "--home", str(tmp_path / "home")]) == 0
    assert len(limits) == 1 and limits[0] <= 100 - 1.5


def test_image_bound_packages_take_the_version_the_gpu_image_can_import():
    """transformers 5.25 needs huggingface_hub >= 2.4, which the GPU image lacks: whatever this environment has, the
    wheel is VERSIONS' (a device call of 2026-12-07 stopped at `import transformers`)."""
    import importlib.metadata

    w = _script("device_wheels")
    assert w["pinned"]("transformers") == f"transformers=={w['VERSIONS']['transformers']}"
    assert w["pinned"]("trl") == f"trl=={importlib.metadata.version('trl')}"  # the others follow this environment
