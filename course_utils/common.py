"""The low-level facts every layer shares, in one place: the byte units, the memory categories, the device an
estimate assumes, where the course keeps what it builds, where its shipped files lie (and the shipped records as
training text), and the one file lock (models, results store).
Imports nothing of the course's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__version__ = "0.1.0"  # how the course measures has a version of its own: provenance.MEASUREMENT_METHOD

# The binary units PyTorch's memory counters and nvidia-smi report in.
MiB = 1024**2
GiB = 1024**3

# What a byte of training memory is for (memtrack's tagging, a Measurement's peak_by_category); the
# estimator predicts the first five ("other" is what no tag claims).
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "temporaries", "other")


# The device an estimate assumes (course_utils.estimate): machine.HARDWARE names the course's three.
@dataclass(frozen=True)
class Hardware:
    """What the estimate assumes about the device: its kind, 'auto' precision and attention kernel."""

    name: str
    device: str  # "cuda" or "cpu"
    auto_precision: str  # what precision="auto" becomes there
    flash_attention: bool  # FlashAttention-2 kernels (compute capability 8.0+)
    memory_gib: float | None = None  # usable memory, when the hardware fixes it
    short: str = ""  # a few words for table headers
    compute_capability: tuple[int, int] | None = None  # whose CUDA libraries' workspaces the estimate counts


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


# The shipped instruction records (data.py loads them as a dataset) as the training text the tiny tokenizer is
# built on (models.py) and data.to_text_dataset writes: one format_prompt per record.
def _check_n(n: int | None) -> None:
    """Raise ValueError unless n is None or a positive int."""
    if n is None:
        return
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"n must be a positive int or None (meaning all records), got {n!r}")


def _read_shipped() -> list[dict[str, str]]:
    """Read the shipped JSON-lines file into a list of dicts."""
    with SHIPPED_DATA.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def format_prompt(record: Mapping[str, str]) -> str:
    """Turn one record into training text (Alpaca/dolly layout; no Context block if it is empty)."""
    missing = [field for field in ("instruction", "response") if field not in record]
    if missing:
        raise ValueError(
            f"format_prompt needs the field(s) {missing} but the record only has {sorted(record)}. "
            'Note: the source chapter used dataset_text_field="text", which fails on dolly because '
            'dolly has no "text" column; that is why we build the text with format_prompt.'
        )
    parts = [f"### Instruction:\n{record['instruction'].strip()}"]
    context = (record.get("context") or "").strip()
    if context:
        parts.append(f"### Context:\n{context}")
    parts.append(f"### Response:\n{record['response'].strip()}")
    return "\n\n".join(parts)


def corpus_text(n: int | None = None) -> list[str]:
    """Return the formatted texts of the shipped records (the first n if given)."""
    _check_n(n)
    return [format_prompt(r) for r in _read_shipped()[:n]]


def course_home() -> Path:
    """Where built models and the results store live: $COURSE_HOME, else ~/.cache/memory-efficient-training."""
    home = os.environ.get("COURSE_HOME") or Path.home() / ".cache" / "memory-efficient-training"
    return Path(home)


LOCK_WAIT_ENV = "COURSE_LOCK_TIMEOUT"  # seconds to wait for a lock another process holds (default 600)


class LockTimeout(OSError):
    """Another process held a lock for longer than we wait; the message names it (pid, command) and the lock."""


def lock_wait_s() -> float:
    """How long file_lock waits for another process's lock: $COURSE_LOCK_TIMEOUT, default 600 s."""
    try:
        return max(0.0, float(os.environ.get(LOCK_WAIT_ENV, "600")))
    except ValueError:
        return 600.0


def lock_holder(path: Path) -> str:
    """Who holds the lock at `path`, as its holder wrote it: 'pid N since <UTC time> (command)', or 'another
    process'. (A holder that died let go of the lock with its last file descriptor: flock, so a lock file left by a
    killed process is taken at once.)"""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        text = ""
    return text.splitlines()[0][:200] if text else "another process"


@contextlib.contextmanager
def file_lock(path: Path, wait_s: float | None = None, say=None):
    """An exclusive lock on `path` (made with its folder where missing), held while the block runs: two processes
    never build the same model, or rewrite the same results store, at once. The holder writes its pid, the time it
    took the lock and its command into the lock file; a process that finds the lock taken says who holds it (one
    line on stderr, or `say(line)`), waits up to `wait_s` seconds (default lock_wait_s()), then raises LockTimeout
    naming the holder."""
    import fcntl
    import sys
    import time

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            wait_s = lock_wait_s() if wait_s is None else wait_s
            holder = lock_holder(path)
            line = f"course: waiting for {path}, held by {holder}; up to {wait_s:g} s ({LOCK_WAIT_ENV} sets it)."
            (say or (lambda text: print(text, file=sys.stderr, flush=True)))(line)
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LockTimeout(f"{path} is still held by {lock_holder(path) or holder} after {wait_s:g} s: "
                                          f"wait for it to finish (or end it), then run again; {LOCK_WAIT_ENV} sets "
                                          "how long to wait") from None
                    time.sleep(min(0.2, max(0.01, deadline - time.monotonic())))
        try:
            fh.seek(0)
            fh.truncate()
            since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            fh.write(f"pid {os.getpid()} since {since} ({' '.join(sys.argv)[:150] or 'python'})\n")
            fh.flush()
        except OSError:  # who holds it is only a courtesy
            pass
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                fh.seek(0)
                fh.truncate()
            fcntl.flock(fh, fcntl.LOCK_UN)


def lock_path(target: Path) -> Path:
    """The lock beside a file or folder: its whole name + '.lock' (with_suffix would cut 'random-llama-3.1-8b'
    at '.1-8b', so that every Llama 3 preset shared one lock)."""
    return target.parent / f"{target.name}.lock"


@contextlib.contextmanager
def native_stderr_off():
    """Nothing that C++ code writes to the process's stderr (file descriptor 2) while inside: torch 2.13's profiler
    writes two "USDT ... profiler_start/stop" lines there each time it runs, which a notebook shows in red. Python's
    own warnings and errors are not affected. Used in notebook 09 around torch.profiler."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


PEERS = ("unsloth",)  # the stacks scripts/gpu/beyond_recipe.py --peers can run (scripts/peer_<name>.py)


def peer_name(m) -> str | None:
    """The peer that measured `m` ("unsloth": its package is among the run's versions), or None for a run of ours.
    A peer's run keeps its recipe's key; its environment's key (the versions, the peer's among them) is never ours."""
    versions = m.env.get("versions", {}) if isinstance(m.env, dict) else {}
    return next((name for name in PEERS if name in versions), None)
