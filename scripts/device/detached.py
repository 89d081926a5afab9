"""A job that outlives one device call: start it in a process session of its own, then wait for it (in the same
call or a later one on the same warm machine) and copy what it wrote.

    python3 scripts/device/detached.py start --name t4 --dir /tmp/jobs -- python3 scripts/gpu/t4_check.py --deadline 1100 ...
    python3 scripts/device/detached.py wait --name t4 --dir /tmp/jobs --for 570 --copy /tmp/t4out $OUT/t4

The device machine kills what a command leaves running when the command returns, except a process that started a
new process session (setsid), which runs on until the machine is given back (/work/.library/device/README.md). A
call returns after 600 s at most and the machine stays warm 30 s after it, so a job of 15 minutes (notebook 07
under the T4 profile) needs two calls back to back: `start` then `wait` in the first, `wait` again in the second.

`start` writes <dir>/<name>.pid and sends the job's output to <dir>/<name>.log. `wait` polls every second until the job
has ended or --for seconds have passed, then copies each --copy SRC DST (files or folders) and prints the log's
last lines and whether the job still runs (exit status 0: it ended; 3: it still runs; 2: there is no such job).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def start(name: str, folder: Path, command: list[str]) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # setsid: the call's end does not take it down
    (folder / f"{name}.pid").write_text(str(proc.pid))
    print(f"started {name}: pid {proc.pid}, log {folder / f'{name}.log'}", flush=True)
    return 0


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    try:  # a child of this process that has ended but not been reaped is a zombie: ended
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def wait(name: str, folder: Path, seconds: float, copies: list[tuple[str, str]], tail: int = 20) -> int:
    pid_file = folder / f"{name}.pid"
    if not pid_file.exists():
        print(f"no job {name!r} in {folder} (start it first)", flush=True)
        return 2
    pid, t0 = int(pid_file.read_text()), time.monotonic()
    while running(pid) and time.monotonic() - t0 < seconds:
        time.sleep(min(1.0, max(0.0, seconds - (time.monotonic() - t0))))
    alive = running(pid)
    for src, dst in copies:
        s, d = Path(src), Path(dst)
        if s.is_dir():
            shutil.copytree(s, d, dirs_exist_ok=True)
        elif s.exists():
            d.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(s, d)
        else:
            print(f"nothing at {s} to copy", flush=True)
    log = folder / f"{name}.log"
    lines = log.read_text(errors="replace").splitlines()[-tail:] if log.exists() else []
    print("\n".join(lines), flush=True)
    print(f"{name}: {'still running' if alive else 'ended'} after {time.monotonic() - t0:.0f} s of waiting",
          flush=True)
    return 3 if alive else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage="%(prog)s {start,wait} --name NAME [options] [-- COMMAND ...]")
    ap.add_argument("action", choices=("start", "wait"))
    ap.add_argument("--name", required=True)
    ap.add_argument("--dir", default="/tmp/jobs", type=Path, help="where the pid file and the log go")
    ap.add_argument("--for", dest="seconds", type=float, default=570, help="wait: at most this long (s)")
    ap.add_argument("--copy", nargs=2, action="append", default=[], metavar=("SRC", "DST"),
                    help="wait: copy SRC to DST afterwards (repeatable)")
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # start: the job is everything after --
    a, command = ap.parse_args(argv[:cut]), argv[cut + 1:]
    if a.action == "start":
        if not command:
            ap.error("start needs the job's command after --")
        return start(a.name, a.dir, command)
    return wait(a.name, a.dir, a.seconds, a.copy)


if __name__ == "__main__":
    sys.exit(main())
