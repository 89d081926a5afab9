"""The low-level facts every layer shares, in one place: the byte units, the memory categories, where the
course keeps what it builds, where its shipped files lie, and the one file lock (models, results store).
Imports nothing of the course's own.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__version__ = "0.1.0"  # how the course measures has a version of its own: provenance.MEASUREMENT_METHOD

# The binary units PyTorch's memory counters and nvidia-smi report in.
MiB = 1024**2
GiB = 1024**3

# What a byte of training memory is for (memtrack's tagging, a Measurement's peak_by_category); the
# estimator predicts the first five ("other" is what no tag claims).
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "temporaries", "other")


def shipped(*parts: str) -> Path:
    """A file (or folder) shipped inside the package, e.g. shipped("reference", "t4", "t4-check.jsonl"):
    course_utils/<parts>, in a checkout and in an installed wheel alike. No parts: the package folder."""
    return Path(__file__).resolve().parent.joinpath(*parts)


def json_lines(text: str) -> list[dict]:
    """The JSON objects of a JSON-lines text, one a line (blank lines skipped): the shipped records' format."""
    import json

    return [json.loads(line) for line in text.splitlines() if line.strip()]


# The shipped instruction data (course_utils/data), used when the hub's datasets cannot be reached.
SHIPPED_DATA = shipped("data", "instructions.jsonl")


def course_home() -> Path:
    """Where built models and the results store live: $COURSE_HOME, else ~/.cache/memory-efficient-training."""
    home = os.environ.get("COURSE_HOME") or Path.home() / ".cache" / "memory-efficient-training"
    return Path(home)


@contextlib.contextmanager
def file_lock(path: Path):
    """An exclusive lock on `path` (made with its folder where missing), held while the block runs: two processes
    never build the same model, or rewrite the same results store, at once."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def lock_path(target: Path) -> Path:
    """The lock beside a file or folder: its whole name + '.lock' (with_suffix would cut 'random-llama-3.1-8b'
    at '.1-8b', so that every Llama 3 preset shared one lock)."""
    return target.parent / f"{target.name}.lock"
