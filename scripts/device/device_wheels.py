"""The wheels a lent GPU machine needs to run the course (scripts/gpu/t4_check.py, reference_runs.py, beyond_recipe.py,
try_step_changes.py, the notebooks as plain Python), for a machine without internet: downloaded from PyPI here.

    python scripts/device/device_wheels.py              # writes .whl/ (git-ignored): the course's stack and the widgets
    python scripts/device/device_wheels.py --check-only # what is there, its size, and the install line

On the GPU machine, with `.whl` in the call's carry:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \\
        && export PYTHONPATH=/tmp/site:$PWD || exit

`$PWD` on PYTHONPATH matters: a notebook's code runs from scripts/notebooks/run_notebook_code.py, whose folder is not the
checkout, so without it every notebook stops at its first `from course_utils ...`; ipywidgets matters too (the
quiz, checklist and exercise cells). Both cost this project a device call on 2026-12-02; scripts/gpu/t4_check.py now
checks them before it starts.

The versions are the ones this checkout is tested with: those installed in the environment that runs this script
where it has them (the README's install), else VERSIONS below. The GPU image already has torch, triton,
accelerate, tokenizers, safetensors, huggingface_hub, pyarrow, pandas and the rest (device KINDS.md); ipywidgets'
own dependencies that it lacks come along. bitsandbytes is stripped to its CPU and CUDA 13.0 libraries (the
machine's CUDA), 43 MB -> 3.6 MB, so the whole folder stays far under a call's 64 MiB.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "device"))
from peer_wheels import CARRY_LIMIT, strip_wheel  # noqa: E402

# name: the version to take when this environment does not have the package (a CPU checkout has no liger-kernel)
VERSIONS = {"transformers": "5.24.0", "trl": "1.16.0", "peft": "0.22.0", "bitsandbytes": "0.50.2",
            "datasets": "5.2.0", "liger-kernel": "0.8.5", "dill": "0.4.1", "multiprocess": "0.70.19",
            "ipywidgets": "8.1.8"}
# ipywidgets and what it needs that the GPU image lacks (the image has pygments, psutil, typing_extensions)
WIDGET_DEPS = ("comm", "traitlets", "ipython", "ipython_pygments_lexers", "jedi", "parso", "matplotlib_inline",
               "pexpect", "ptyprocess", "prompt_toolkit", "wcwidth", "stack_data", "executing", "asttokens",
               "pure_eval", "widgetsnbextension", "jupyterlab_widgets")
BNB_KEEP = ("libbitsandbytes_cpu", "libbitsandbytes_cuda130")  # the GPU machine's CUDA is 13.0
# taken at VERSIONS' version whatever this environment has: transformers >= 5.25 requires huggingface_hub >= 2.4
# (and its httpx2), which the GPU image (huggingface_hub 1.33) lacks; on 2026-12-07 that stopped a device call at import
IMAGE_BOUND = ("transformers",)


def pinned(name: str) -> str:
    """name==version: this environment's version where it has the package, else VERSIONS'; else the newest
    (IMAGE_BOUND: VERSIONS' always)."""
    if name in IMAGE_BOUND:
        return f"{name}=={VERSIONS[name]}"
    try:
        return f"{name}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{name}=={VERSIONS[name]}" if name in VERSIONS else name


def download(dest: Path) -> None:
    """pip download --no-deps of every wheel, for the GPU machine's Python 3.12 on x86-64 Linux."""
    dest.mkdir(exist_ok=True)
    platforms = [arg for p in ("manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                               "manylinux2014_x86_64") for arg in ("--platform", p)]
    wanted = [pinned(n) for n in VERSIONS] + [pinned(n) for n in WIDGET_DEPS]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(dest), *wanted],
                   check=True)


def strip_bitsandbytes(dest: Path) -> int:
    """Drop every native library but BNB_KEEP from the bitsandbytes wheel in `dest`; the bytes saved."""
    saved = 0
    for wheel in dest.glob("bitsandbytes-*.whl"):
        with zipfile.ZipFile(wheel) as z:
            drop = tuple(n for n in z.namelist() if n.endswith(".so") and not Path(n).stem.startswith(BNB_KEEP))
        saved += strip_wheel(wheel, drop) if drop else 0
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", default=str(ROOT / ".whl"))
    parser.add_argument("--check-only", action="store_true", help="only list what --dest holds")
    args = parser.parse_args(argv)
    dest = Path(args.dest)
    if not args.check_only:
        download(dest)
        print(f"bitsandbytes stripped to {', '.join(BNB_KEEP)}: {strip_bitsandbytes(dest) / 2**20:.1f} MiB saved")
    wheels = sorted(dest.glob("*.whl"))
    names = [w.name.split("-")[0].lower().replace("_", "-") for w in wheels]
    twice = sorted({n for n in names if names.count(n) > 1})
    size = sum(w.stat().st_size for w in wheels)
    print(f"{len(wheels)} wheels in {dest}, {size / 2**20:.1f} MiB of the {CARRY_LIMIT / 2**20:.0f} MiB a call carries")
    if twice:
        print(f"two versions of {', '.join(twice)}: keep one of each, or pip --no-deps installs both and stops")
    missing = [n for n in list(VERSIONS) + list(WIDGET_DEPS) if n.lower().replace("_", "-") not in names]
    if missing:
        print("missing: " + ", ".join(missing))
    return 1 if twice or missing or not wheels else 0


if __name__ == "__main__":
    sys.exit(main())
