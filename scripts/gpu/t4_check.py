"""Run every chapter notebook under the T4 profile on a bigger CUDA GPU and record how each one went.

    python scripts/gpu/t4_check.py --out course_utils/reference/t4/t4-check.jsonl [--variants small,llama-8b]
                               [--notebooks 05,07] [--parallel 9]

Each notebook's code cells run as plain Python (scripts/notebooks/run_notebook_code.py) in a process of their
own with COURSE_PROFILE=t4: fp16 where bf16 is not native, no flash attention, and 14.75 GiB for the
whole card, the notebook's own process and every CUDA context included. One record per notebook and
variant ("small": the model a GPU notebook picks; "llama-8b": its USE_LLAMA_8B = True variant): ran
through or not, the first failure, wall time, the precisions chosen, what its measurements found, and
the peak the whole (virtual) card held, polled through NVML every 0.25 s.

Each notebook and its measuring processes get --cores CPU cores of their own (default 2, as a Colab
free-tier runtime has), so start-ups and model builds take about as long as there.

On a lent GPU machine without internet the course's stack and ipywidgets come as wheels: scripts/device/device_wheels.py
writes them to .whl/ here and says how to install them there (PYTHONPATH=/tmp/site:$PWD); the check asks a
notebook-like process whether it can import them before it starts.

--parallel N runs N notebooks at once, each as its own virtual T4 (COURSE_CARD_GROUP: a run counts only
its own processes' memory, read from NVML). It falls back to one at a time where NVML cannot see this
machine's processes. Speed is the real GPU's, shared between the runs: memory is a T4's, speed is not.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("COURSE_PROFILE", "t4")

from course_utils.chapter.t4 import strip_env  # noqa: E402
from course_utils.machine import CARD_GROUP_ENV, group_used_bytes  # noqa: E402

VARIANTS = {"small": [], "llama-8b": ["--use-llama-8b"]}


def notebooks(selected: str) -> list[Path]:
    """The notebooks to check: all, or those whose number is in a comma list ('05,07')."""
    every = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if not selected:
        return every
    wanted = {n.strip().zfill(2) for n in selected.split(",")}
    return [p for p in every if p.name[:2] in wanted]


class CardPoll(threading.Thread):
    """Polls the memory one run's processes hold on the GPU (its session, through NVML), keeping the peak."""

    def __init__(self, session: int | None, every_s: float = 0.25):
        super().__init__(daemon=True)
        self.session, self.every_s, self.peak, self.stop = session, every_s, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                if self.session is None:  # one run at a time: the whole card
                    import torch

                    free, total = torch.cuda.mem_get_info(0)
                    used = total - free - self.baseline
                else:
                    used = group_used_bytes(self.session)
                self.peak = max(self.peak, used)
            except Exception:
                pass
            self.stop.wait(self.every_s)


# What every notebook imports in a plain Python process (the quiz and checklist cells need ipywidgets).
NEEDED = ("course_utils", "ipywidgets", "transformers", "peft", "trl", "bitsandbytes", "datasets")


def preflight() -> str:
    """'' when a notebook's process can import what the notebooks need; else a line naming what is missing.

    Asked in a child like a notebook's (`-P`: as scripts/notebooks/run_notebook_code.py, the checkout itself is not on
    sys.path unless PYTHONPATH puts it there), before any run starts: on
    2026-12-02 a check without course_utils on PYTHONPATH, then one without ipywidgets, each failed every
    notebook minutes in (course_utils: at once; ipywidgets: at the last cell). Each package is imported, not
    only found: wheels installed with --no-deps can be there and still lack a dependency."""
    code = ("import importlib\nmissing = []\n"
            f"for n in {NEEDED!r}:\n"
            "    try:\n        importlib.import_module(n)\n"
            "    except Exception as exc:\n        missing.append(f'{n} ({type(exc).__name__}: {exc})')\n"
            "print('MISSING: ' + ', '.join(missing))")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    said = [line for line in done.stdout.splitlines() if line.startswith("MISSING: ")]
    missing = said[-1][len("MISSING: "):].strip() if said else ""
    if done.returncode or missing:
        return (f"t4_check: a notebook's process cannot import {missing or done.stderr.strip()[-300:]}: install "
                "the course's dependencies there (with --target, put that folder and this checkout on PYTHONPATH: "
                "PYTHONPATH=/tmp/site:$PWD), then run again")
    return ""


def nvml_sees_sessions() -> bool:
    """True when NVML lists this machine's processes by a pid we can map to a session (a 1 GiB probe)."""
    code = ("import torch, time; x = torch.empty(2**30, dtype=torch.uint8, device='cuda'); "
            "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(5)")
    probe = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        probe.stdout.readline()
        return group_used_bytes(probe.pid) >= 2**30
    except Exception as exc:
        print(f"NVML cannot count processes here ({type(exc).__name__}: {exc}); running one at a time")
        return False
    finally:
        probe.kill()
        probe.wait()


def read_store(path: Path) -> list[dict]:
    """The measurements a run stored (its own results store)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_one(nb: Path, variant: str, base_home: Path, logs: Path, parallel: bool, timeout_s: float,
              cores: list[int] | None = None) -> dict:
    """Run one notebook (one variant) under the profile, on `cores` CPU cores; return its record."""
    name = f"{nb.stem}-{variant}"
    home = base_home / name
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "models").exists():  # built models are shared; stores are the run's own
        (home / "models").symlink_to(base_home / "models", target_is_directory=True)
    for stale in home.glob("results.jsonl*"):  # a check measures: nothing is read back from an earlier one
        stale.unlink()
    env = dict(os.environ, COURSE_HOME=str(home), MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    if parallel:
        env[CARD_GROUP_ENV] = "1"
    if cores:
        env.update({name: str(len(cores)) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")})
    cmd = [sys.executable, str(ROOT / "scripts" / "notebooks" / "run_notebook_code.py"), str(nb), *VARIANTS[variant]]
    started = time.perf_counter()
    log = (logs / f"{name}.log").open("w")
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None  # children inherit it
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True,
                            preexec_fn=pin)
    poll = CardPoll(proc.pid if parallel else None)
    if not parallel:
        import torch

        free, total = torch.cuda.mem_get_info(0)
        poll.baseline = total - free  # what this checking process itself holds
    poll.start()
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        code = "timeout"
    poll.stop.set()
    poll.join()
    log.close()
    wall = time.perf_counter() - started
    text = (logs / f"{name}.log").read_text()
    failed = [line for line in text.splitlines() if line.startswith("FAILED cell")]
    stored = read_store(home / "results.jsonl")
    return dict(
        notebook=nb.stem, variant=variant, ran_through=code == 0,
        first_failure=failed[0] if failed else ("" if code == 0 else stopped_in(text, timeout_s) if code == "timeout"
                                                else f"exit {code}: " + text[-400:]),
        wall_s=round(wall, 1), models=sorted({m["recipe"]["model"] for m in stored}),
        precisions=sorted({m["precision"] for m in stored if m.get("precision")}),
        measured=len(stored), fits=sum(m["status"] == "ok" for m in stored),
        does_not_fit=[m["recipe"].get("label") or m["recipe_key"] for m in stored if m["status"] != "ok"],
        max_process_reserved_gib=round(max([m.get("cuda_max_reserved") or 0 for m in stored] + [0]) / 2**30, 2),
        card_peak_gib=round(poll.peak / 2**30, 2), parallel=parallel, cores_per_run=len(cores) if cores else None,
        runs=[strip_env(m) for m in stored],
    )


def stopped_in(log: str, timeout_s: float) -> str:
    """Where a notebook stopped by the limit was: the cell it had started last (run_notebook_code's '--- cell N')
    and how many it had finished, then the end of its output."""
    started = re.findall(r"^--- cell (\d+)$", log, re.M)
    done = re.findall(r"^--- cell (\d+): [\d.]+ s$", log, re.M)
    where = f"in cell {started[-1]} ({len(done)} cells done)" if started else "before its first cell"
    return f"stopped at the {timeout_s:.0f} s limit {where}: " + log[-300:]


def not_run(nb: Path, variant: str, why: str) -> dict:
    """The record of a notebook the check did not start (check_one's fields, nothing measured)."""
    return dict(notebook=nb.stem, variant=variant, ran_through=False, first_failure=why, wall_s=0.0, models=[],
                precisions=[], measured=0, fits=0, does_not_fit=[], max_process_reserved_gib=0.0, card_peak_gib=0.0,
                parallel=None, cores_per_run=None, runs=[])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON-lines file for the records (appended)")
    parser.add_argument("--variants", default="small", help="comma list of: " + ", ".join(VARIANTS))
    parser.add_argument("--notebooks", default="", help="comma list of notebook numbers (default: all)")
    parser.add_argument("--jobs", default="", help="comma list of NN:variant pairs instead (05:llama-8b,07:small)")
    parser.add_argument("--parallel", type=int, default=1, help="notebooks at once, each its own virtual T4")
    parser.add_argument("--home", default=None, help="scratch COURSE_HOME (default: a fresh folder)")
    parser.add_argument("--logs", default=None, help="folder for each run's output (default: beside --out)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per notebook before it is stopped")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds for the whole check: each notebook is stopped by then and its record written "
                             "(what it measured, the cell it was in), so a device call that waits this long gets "
                             "every record; a notebook not started with a minute left is recorded as not run")
    parser.add_argument("--cores", type=int, default=2, help="CPU cores per notebook (Colab's free tier has 2); 0: all")
    args = parser.parse_args(argv)
    ends = time.monotonic() + args.deadline if args.deadline else None  # from the start: the preflight counts too

    import torch

    from course_utils.machine import active_profile
    from course_utils.results import environment_record

    if not torch.cuda.is_available() or active_profile() is None:
        print("t4_check needs a CUDA GPU to stand in for the T4", file=sys.stderr)
        return 2
    missing = preflight()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    base_home = Path(args.home or f"/tmp/t4-check-{uuid.uuid4().hex[:6]}")
    (base_home / "models").mkdir(parents=True, exist_ok=True)
    logs = Path(args.logs or Path(args.out).parent / "t4-logs")
    logs.mkdir(parents=True, exist_ok=True)
    parallel = args.parallel > 1 and nvml_sees_sessions()
    jobs = [(nb, v) for v in args.variants.split(",") for nb in notebooks(args.notebooks)]
    if args.jobs:
        jobs = [(notebooks(n)[0], v) for n, v in (job.split(":") for job in args.jobs.split(","))]
    env, run_id = environment_record(), f"t4-{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}"
    provenance = dict(run_id=run_id, env=env, date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                      command="python scripts/gpu/t4_check.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                      profile=active_profile().label)
    print(f"{provenance['profile']} on {torch.cuda.get_device_name(0)}: {len(jobs)} runs, "
          f"{args.parallel if parallel else 1} at a time", flush=True)
    from concurrent.futures import ThreadPoolExecutor

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    at_once = args.parallel if parallel else 1
    mine = sorted(os.sched_getaffinity(0))
    if args.cores and len(mine) < args.cores * at_once:
        print(f"{len(mine)} CPU cores cannot give {at_once} runs {args.cores} each", file=sys.stderr)
        return 2
    if args.cores != 2:  # the shipped records are Colab's 2 cores (tests/test_t4check.py): say so before it runs
        print(f"note: --cores {args.cores} is not a free Colab's 2 cores; these records' memory is a T4's, their wall "
              "times are not, and course_utils/reference/t4/ takes only 2-core records", flush=True)
    slots: queue.Queue = queue.Queue()
    for i in range(at_once):
        slots.put(mine[i * args.cores:(i + 1) * args.cores] if args.cores else None)

    def one(job):
        cores = slots.get()
        try:
            left = args.timeout if ends is None else min(args.timeout, ends - time.monotonic())
            record = {**(check_one(*job, base_home, logs, parallel, left, cores) if left >= 60 else
                         not_run(*job, f"not started: {max(left, 0):.0f} s of the --deadline left")), **provenance}
        finally:
            slots.put(cores)
        with lock, out.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        print(f"{record['notebook']:34} {record['variant']:9} {'ran through' if record['ran_through'] else 'FAILED':12}"
              f"{record['wall_s']:7.0f} s  {','.join(record['precisions']) or '-':10} card peak "
              f"{record['card_peak_gib']:5.2f} GiB  {record['first_failure'][:90]}", flush=True)
        return record

    with ThreadPoolExecutor(max_workers=at_once) as pool:
        records = list(pool.map(one, jobs))
    return 0 if all(r["ran_through"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
