"""Run a notebook's code cells as plain Python, in order, in one namespace: for machines without
Jupyter (a lent GPU). Figures go to PNG files beside --out instead of a screen.

    python scripts/notebooks/run_notebook_code.py notebooks/09_beyond_the_recipe.ipynb --out figures/

Prints each cell's number and what it printed; stops at the first cell that raises, naming it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

FLAG = re.compile(r"^USE_LLAMA_8B = False", re.M)


def _display(*objects) -> None:
    """Jupyter's display() without Jupyter: each object's text form (a Table's is its plain-text table)."""
    for obj in objects:
        print(obj)


def _run_cell(source: str, name: str, namespace: dict) -> None:
    """Run a cell as Jupyter does: its last line, if an expression (and not ending in ';'), is shown."""
    import ast

    tree = ast.parse(source, name)
    last = tree.body[-1] if tree.body else None
    shown = isinstance(last, ast.Expr) and not source.rstrip().endswith(";")
    body = ast.Module(tree.body[:-1] if shown else tree.body, type_ignores=[])
    exec(compile(body, name, "exec"), namespace)
    if shown:
        value = eval(compile(ast.Expression(last.value), name, "eval"), namespace)
        if value is not None and not type(value).__module__.startswith("matplotlib"):
            _display(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebook")
    parser.add_argument("--out", default=None, help="folder for the figures (default: none saved)")
    parser.add_argument("--skip-quiz", action="store_true", help="skip the quiz cells (for machines without ipywidgets)")
    parser.add_argument("--use-llama-8b", action="store_true",
                        help="run the notebook's USE_LLAMA_8B = True variant (the Llama-3.1-8B architecture on a GPU)")
    args = parser.parse_args(argv)
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib.pyplot as plt

    nb = json.loads(Path(args.notebook).read_text())
    namespace: dict = {"__name__": "__main__", "display": _display}
    figures = 0
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        if args.use_llama_8b and FLAG.search(source):
            source = FLAG.sub("USE_LLAMA_8B = True", source)
            print(f"--- cell {i}: USE_LLAMA_8B = True", flush=True)
        if args.skip_quiz and "course_utils.chapter.quiz" in source:
            print(f"--- cell {i}: a quiz, skipped", flush=True)
            continue
        print(f"--- cell {i}", flush=True)
        started = time.perf_counter()
        try:
            _run_cell(source, f"{args.notebook}#cell{i}", namespace)
        except Exception as exc:
            traceback.print_exc()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            print(f"FAILED cell {i}: {type(exc).__name__}: {first}", file=sys.stderr, flush=True)
            return 1
        for number in plt.get_fignums():
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                plt.figure(number).savefig(Path(args.out) / f"cell{i:02d}-{number}.png", dpi=80)
            figures += 1
        plt.close("all")
        print(f"--- cell {i}: {time.perf_counter() - started:.1f} s", flush=True)
    if args.use_llama_8b and not any(FLAG.search("".join(c["source"])) for c in nb["cells"]):
        print(f"{args.notebook} has no USE_LLAMA_8B switch", file=sys.stderr)
        return 2
    print(f"all code cells of {args.notebook} ran; {figures} figure(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
