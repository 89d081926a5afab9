"""What keeps a wrong figure out of the results store (issue 32), in one place, importing nothing of the course's own:

- loss_problem(losses): a run whose loss collapsed, exploded or stopped moving trained nothing a learner can
  compare: it is refused as a result (measure.check_sane in the child, ResultStore.add in the parent).
- the measuring registry: every process that trains to measure registers itself for the time it trains
  (a small file named after its pid in a folder of the machine's temporary folder), so a measurement can tell
  that another one ran beside it on the same machine: its speed is then marked noisy and never reused.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
from pathlib import Path

# A next-token loss at or below this (nats) after a few steps of a short run: the model predicts its labels
# with certainty, which only a broken run does (a learning rate of 10 or 1e30 drives it to exactly 0.0).
COLLAPSED_BELOW = 0.01
# A loss above this many times the first step's (the untrained model's) loss: the run diverged. The shipped
# H200 runs' largest rise is 1.53x (random weights, bf16, 8-bit AdamW: 12.58 -> 19.22, then falling).
EXPLODED_FACTOR = 3.0
# This many steps in a row with the same loss, each on other sequences: nothing is being computed any more.
STUCK_STEPS = 3
_SAME = 1e-7  # relative difference below which two losses are the same


def loss_problem(losses) -> str | None:
    """Why these per-step training losses are not a result (one phrase), or None when they look like training:
    finite, none collapsed toward 0, none far above the first, and not the same value step after step."""
    losses = [float(x) for x in losses]
    if not losses:
        return None
    bad = [i + 1 for i, x in enumerate(losses) if not math.isfinite(x)]
    if bad:
        return f"the loss was not finite at step(s) {bad}"
    low = [i + 1 for i, x in enumerate(losses) if x <= COLLAPSED_BELOW]
    if low:
        return (f"the loss collapsed to {min(losses):.3g} at step(s) {low} (at or below {COLLAPSED_BELOW}: the model "
                "predicts every label with certainty, which a working run does not)")
    first = losses[0]
    high = [i + 1 for i, x in enumerate(losses) if x > EXPLODED_FACTOR * first]
    if high:
        return (f"the loss exploded to {max(losses):.4g} at step(s) {high} (over {EXPLODED_FACTOR:g}x the first "
                f"step's {first:.4g})")
    run = 1
    for i in range(1, len(losses)):
        same = abs(losses[i] - losses[i - 1]) <= _SAME * max(1.0, abs(losses[i]))
        run = run + 1 if same else 1
        if run >= STUCK_STEPS:
            return (f"the loss stopped moving: {losses[i]:.6g} at steps {i + 2 - run} to {i + 1}, each on other "
                    "sequences")
    return None


# --- the measuring registry ----------------------------------------------------------------------------------
def registry() -> Path:
    """The folder where measuring processes register (one per machine and user: the temporary folder's)."""
    return Path(tempfile.gettempdir()) / "course-measuring"


def alive(pid: int) -> bool:
    """True when a process with this pid exists (or exists but is not ours to signal)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _group() -> str:
    """Which run this process belongs to: the ranks of one distributed run (torch's WORLD_SIZE above 1) share
    their rendezvous address and are not each other's 'others'; any other process is a run of its own."""
    if os.environ.get("WORLD_SIZE", "1") not in ("", "1"):
        return f"ranks@{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"
    return f"pid{os.getpid()}"


@contextlib.contextmanager
def measuring():
    """Register this process as measuring while the block runs; the file goes when it ends (a killed process's
    file is ignored: its pid is no longer alive)."""
    entry = None
    with contextlib.suppress(OSError):
        registry().mkdir(parents=True, exist_ok=True)
        entry = registry() / f"{os.getpid()}.json"
        entry.write_text(json.dumps({"pid": os.getpid(), "group": _group(), "command": " ".join(sys.argv)[:200]}))
    try:
        yield
    finally:
        if entry is not None:
            with contextlib.suppress(OSError):
                entry.unlink()


def others_measuring() -> list[dict]:
    """The other processes measuring on this machine now (alive, not us, not of our own process group): each
    as {'pid', 'group', 'command'}; stale files of dead processes are removed."""
    found = []
    try:
        entries = list(registry().glob("*.json"))
    except OSError:
        return found
    me, group = os.getpid(), _group()
    for entry in entries:
        try:
            info = json.loads(entry.read_text())
            pid = int(info["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid == me or info.get("group") == group:
            continue
        if not alive(pid):
            with contextlib.suppress(OSError):
                entry.unlink()
            continue
        found.append(info)
    return found


def beside_callback(beside: set):
    """A Trainer callback that adds the pids of the other measuring processes on this machine to
    `beside` at the start and the end of every step."""
    from transformers import TrainerCallback

    class Beside(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            beside.update(o["pid"] for o in others_measuring())

        on_step_end = on_step_begin

    return Beside()
