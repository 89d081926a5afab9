"""A virtual card: several runs under the T4 profile sharing one big GPU, each counting only its own processes
(scripts/t4_check.py --parallel sets $COURSE_CARD_GROUP; hardware.apply_profile then caps each measuring
process by what its session holds, read per process from NVML)."""

from __future__ import annotations

import os

from .common import GiB

CARD_GROUP_ENV = "COURSE_CARD_GROUP"


def group_used_bytes(session: int | None = None) -> int:
    """GPU memory held by the processes of one session (default: this process's), from NVML."""
    return sum(used for _, used in group_processes(session))


def group_processes(session: int | None = None) -> list[tuple[int, int]]:
    """(pid, bytes) of every process of one session (default: this process's) that holds GPU memory, from NVML."""
    import pynvml

    session = os.getsid(0) if session is None else session
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        found = []
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            try:
                if os.getsid(proc.pid) == session:
                    found.append((proc.pid, proc.usedGpuMemory or 0))
            except (ProcessLookupError, PermissionError):
                continue
        return found
    finally:
        pynvml.nvmlShutdown()


def _command(pid: int) -> str:
    """A process's command line, short (for a diagnosis)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    return " ".join(os.path.basename(w) if i < 2 else w for i, w in enumerate(words[:4]))[:60]


def group_note() -> str:
    """Which processes a virtual card counted (pid: GiB, this one marked), for the measurement's note."""
    if not os.environ.get(CARD_GROUP_ENV):
        return ""
    try:
        procs = group_processes()
    except Exception as exc:  # the note is a diagnosis; the cap itself was already computed
        return f"; counted: unknown ({type(exc).__name__})"
    parts = [f"{pid}{'*' if pid == os.getpid() else ''} {used / GiB:.2f} ({_command(pid)})" for pid, used in procs]
    return f"; counted (pid GiB, * this one): {', '.join(parts) or 'none'}"
