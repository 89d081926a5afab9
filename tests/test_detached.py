"""scripts/device/detached.py: a job that outlives the command that started it, waited for and collected later."""

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, str(ROOT / "scripts" / "device" / "detached.py")]


def run(*args, timeout=60):
    return subprocess.run([*SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def test_a_started_job_outlives_its_command_and_is_collected(tmp_path):
    jobs, made = tmp_path / "jobs", tmp_path / "made"
    job = f"import time, pathlib; time.sleep(2); pathlib.Path({str(made)!r}).write_text('done'); print('job ok')"
    started = run("start", "--name", "j", "--dir", jobs, "--", sys.executable, "-c", job)
    assert started.returncode == 0 and "started j: pid" in started.stdout  # it returned before the job ended
    assert not made.exists()
    waited = run("wait", "--name", "j", "--dir", jobs, "--for", 30, "--copy", made, tmp_path / "out" / "made.txt")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "job ok" in waited.stdout and "j: ended" in waited.stdout
    assert (tmp_path / "out" / "made.txt").read_text() == "done"


def test_waiting_stops_at_its_limit_and_says_the_job_still_runs(tmp_path):
    jobs = tmp_path / "jobs"
    run("start", "--name", "long", "--dir", jobs, "--", sys.executable, "-c", "import time; time.sleep(60)")
    pid = int((jobs / "long.pid").read_text())
    try:
        nothing = tmp_path / "nothing"
        waited = run("wait", "--name", "long", "--dir", jobs, "--for", 1, "--copy", nothing, tmp_path / "x")
        assert waited.returncode == 3 and "long: still running" in waited.stdout
        assert "nothing at" in waited.stdout and not (tmp_path / "x").exists()
        assert os.getsid(pid) == pid  # a session of its own: the device call's end does not take it down
    finally:
        os.kill(pid, signal.SIGKILL)
    assert run("wait", "--name", "none", "--dir", jobs, "--for", 1).returncode == 2
    assert run("start", "--name", "empty", "--dir", jobs).returncode == 2  # no command: argparse's error
