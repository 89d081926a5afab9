"""Write each notebook's troubleshooting cell (course_utils.chapter.troubleshooting.guide.notebook_markdown) right after
its setup cell, or replace the one already there (a Markdown cell tagged "troubleshooting"):

    python scripts/notebooks/insert_extras.py notebooks/*.ipynb

Idempotent; tests/test_troubleshooting.py checks the committed notebooks carry the current text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from course_utils.chapter.troubleshooting.guide import notebook_markdown

TAG = "troubleshooting"


def with_troubleshooting(nb: dict, name: str) -> dict:
    """The notebook with its troubleshooting cell in place after the first code cell (the setup)."""
    cells = [c for c in nb["cells"] if TAG not in c.get("metadata", {}).get("tags", [])]
    text = notebook_markdown(name[:2])
    cell = {"cell_type": "markdown", "id": TAG, "metadata": {"tags": [TAG]}, "source": text.splitlines(keepends=True)}
    setup = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
    cells.insert(setup + 1, cell)
    return {**nb, "cells": cells}


def main(paths: list[str]) -> int:
    for path in map(Path, paths):
        nb = with_troubleshooting(json.loads(path.read_text()), path.name)
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
