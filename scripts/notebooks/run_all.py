"""Run every cell of each notebook in place, as Run All does, and time what a learner waits through: the wall time
and the longest silent stretch (the longest time in which nothing on the page changes: no new output, no progress
bar or widget update). Then clean the notebooks for committing (`write_notebooks.py clean`).

    HF_HUB_OFFLINE=1 COURSE_HOME=/tmp/home-run python scripts/notebooks/run_all.py notebooks/*.ipynb [--no-write]

Prints one line per notebook and writes test-artifacts/run_all.json (git-ignored): per notebook its seconds, the
longest silent stretch and the cell it falls in (index and first line). --no-write runs without changing the files.
A stretch starts when a cell starts (its [*] shows, nothing else) or at the last change, and ends at the next change
or when the cell ends.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "test-artifacts" / "run_all.json"


class TimedClient(NotebookClient):
    """nbclient's Run All, noting the time of every change a learner would see."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.last = time.monotonic()
        self.cell = -1
        self.longest = (0.0, -1)

    def _changed(self) -> None:
        now = time.monotonic()
        if now - self.last > self.longest[0]:
            self.longest = (now - self.last, self.cell)
        self.last = now

    def output(self, outs, msg, display_id, cell_index):
        self._changed()
        return super().output(outs, msg, display_id, cell_index)

    def handle_comm_msg(self, outs, msg, cell_index):
        self._changed()
        return super().handle_comm_msg(outs, msg, cell_index)

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        self.cell, self.last = cell_index, time.monotonic()
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        finally:
            self._changed()


def run(path: Path, write: bool) -> dict:
    nb = nbformat.read(path, as_version=4)
    client = TimedClient(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    t0 = time.monotonic()
    client.execute()
    seconds, (silent, cell) = time.monotonic() - t0, client.longest
    if write:
        nbformat.write(nb, path)
    first = nb.cells[cell].source.splitlines()[0][:70] if cell >= 0 and nb.cells[cell].source else ""
    return dict(notebook=path.name, seconds=round(seconds, 1), longest_silent_s=round(silent, 1), cell=cell,
                first_line=first)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    for path in a.notebooks:
        row = run(path, not a.no_write)
        rows.append(row)
        print(f"{row['notebook']:<40} {row['seconds']:>7.1f} s   longest silent {row['longest_silent_s']:>5.1f} s "
              f"in cell {row['cell']} ({row['first_line']})", flush=True)
    REPORT.parent.mkdir(exist_ok=True)
    old = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    REPORT.write_text(json.dumps({**old, **{r["notebook"]: r for r in rows}}, indent=1) + "\n")
    if not a.no_write:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "notebooks" / "write_notebooks.py"), "clean",
                        *map(str, a.notebooks)], check=True)


if __name__ == "__main__":
    main()
