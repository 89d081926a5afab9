"""Make executed notebooks fit to commit: no widget state, no widget-only outputs (progress bars
that GitHub cannot draw), no absolute paths. A widget that carries a static copy of itself (the
quiz: its questions as Markdown) keeps that copy, so GitHub and nbviewer show it. Fails, naming the
cell, if a path remains.

    python scripts/clean_notebooks.py notebooks/*.ipynb
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
STATIC_COPY = "text/markdown"  # what a widget adds for where it cannot render (course_utils.quiz)
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:home|root|work|tmp|usr|opt|Users|content)/[\w.\-/]+")


def clean(path: Path) -> list[str]:
    """Clean one notebook in place; return the problems left (absolute paths in outputs)."""
    nb = json.loads(path.read_text())
    nb.get("metadata", {}).pop("widgets", None)
    problems = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW in data:
                if STATIC_COPY not in data:
                    continue  # a progress bar or widget: its state is not saved, so drop its placeholder
                out = {**out, "data": {k: v for k, v in data.items() if k != WIDGET_VIEW}}
                data = out["data"]
            outputs.append(out)
            text = json.dumps(out.get("text", "")) + json.dumps(data.get("text/plain", ""))
            if ABSOLUTE_PATH.search(text):
                problems.append(f"{path.name} cell {i}: absolute path {ABSOLUTE_PATH.search(text).group(0)!r}")
        cell["outputs"] = outputs
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return problems


def main(paths: list[str]) -> int:
    problems = [p for path in paths for p in clean(Path(path))]
    print("\n".join(problems) or f"cleaned {len(paths)} notebook(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
