"""Make executed notebooks fit to commit: no widget state, no absolute paths. Fails, naming the cell,
if a path remains. Running it twice changes nothing the second time.

What it removes is widget state only: the notebook's `widgets` metadata and each output's widget view
(`application/vnd.jupyter.widget-view+json`, a model id that means nothing without a kernel). A widget
that carries a static copy of itself (the quiz's questions, the checklist's state: text/markdown,
course_utils.static_copy) keeps that copy, which GitHub and nbviewer show. An output left with nothing
but the widget's Python repr (a progress bar frozen at 0%, `VBox(children=...)`) is dropped whole.

It also names the kernel as ipykernel names itself (`kernelspec`: "Python 3 (ipykernel)"): JupyterLab
rewrites a different display name when the kernel starts, which marks a notebook modified as soon as
it is opened.

    python scripts/notebooks/clean_notebooks.py notebooks/*.ipynb
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
REPR_ONLY = {"text/plain"}  # what ipywidgets and tqdm add beside the view: the widget's repr
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:home|root|work|tmp|usr|opt|Users|content)/[\w.\-/]+")


def without_widget_state(out: dict) -> dict | None:
    """An output without its widget view; None when what is left is only the widget's repr."""
    data = out.get("data", {})
    if WIDGET_VIEW not in data:
        return out
    static = {k: v for k, v in data.items() if k != WIDGET_VIEW}
    if set(static) <= REPR_ONLY:
        return None
    return {**out, "data": static}


def _shown_text(out: dict) -> str:
    """The text an output shows (stream text and the text mime entries), for the path check."""
    data = out.get("data", {})
    return json.dumps(out.get("text", "")) + "".join(json.dumps(data.get(k, "")) for k in ("text/plain", "text/markdown"))


def kernelspec() -> dict:
    """The notebook metadata of ipykernel's own kernel spec (what JupyterLab writes when the kernel starts)."""
    from ipykernel.kernelspec import KERNEL_NAME, get_kernel_dict

    spec = get_kernel_dict()
    return {"display_name": spec["display_name"], "language": spec["language"], "name": KERNEL_NAME}


def clean(path: Path) -> list[str]:
    """Clean one notebook in place; return the problems left (absolute paths in outputs)."""
    nb = json.loads(path.read_text())
    nb.get("metadata", {}).pop("widgets", None)
    nb.setdefault("metadata", {})["kernelspec"] = kernelspec()
    problems = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        cell["outputs"] = [kept for out in cell.get("outputs", []) if (kept := without_widget_state(out)) is not None]
        for out in cell["outputs"]:
            if match := ABSOLUTE_PATH.search(_shown_text(out)):
                problems.append(f"{path.name} cell {i}: absolute path {match.group(0)!r}")
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return problems


def main(paths: list[str]) -> int:
    problems = [p for path in paths for p in clean(Path(path))]
    print("\n".join(problems) or f"cleaned {len(paths)} notebook(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
