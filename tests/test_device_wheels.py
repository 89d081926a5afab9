"""scripts/device_wheels.py: the wheels a lent GPU machine gets, and the T4 check's preflight agree (no network)."""

from __future__ import annotations

import runpy
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str) -> dict:
    return runpy.run_path(str(ROOT / "scripts" / f"{name}.py"), run_name=name)


def test_the_wheels_cover_what_the_t4_checks_preflight_asks_for():
    import ast

    wheels = _script("device_wheels")
    tree = ast.parse((ROOT / "scripts" / "t4_check.py").read_text())  # read, not run: it imports the course
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
