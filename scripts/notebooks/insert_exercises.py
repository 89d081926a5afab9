"""Insert each notebook's "Try it" exercise (course_utils/chapter/exercises.py) right before its quiz section: the
Markdown cell that says "Check what you measured".

The exercise is five cells, each tagged "exercise": a "## Try it" Markdown cell; a code cell that shows the
task (`show_exercise`, whose figures come from the notebook's base recipe: a Markdown cell cannot compute);
the answer cell, the libraries' objects of the rung the task starts from (the learner changes the lines
marked `# <- ?`); a collapsed solution cell (tags exercise + solution, source
hidden) whose button shows the worked solution when the learner asks (nothing of it is in an output
before); and the check cell (`check_exercise`), which, while the answer is still that rung, checks the
worked solution without showing it (so the notebook still tests it under nbval) and asks for a change.

Idempotent: the cells tagged "exercise" are taken out and the block is put back before the quiz; a cell
whose source and tags are already right is kept as it is, with its outputs and id. Nothing is executed.

    python scripts/notebooks/insert_exercises.py                # every notebooks/NN_*.ipynb, in place
    python scripts/notebooks/insert_exercises.py --check        # exit 1 if any notebook would change
    python scripts/notebooks/insert_exercises.py /tmp/copy/*.ipynb
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from course_utils.chapter.exercises import EXERCISES, WITHOUT_EXERCISE, Exercise  # noqa: E402
from course_utils.recipe import base_recipe_for  # noqa: E402

TAG, SOLUTION_TAG = "exercise", "solution"
QUIZ_MARK = "Check what you measured"
INTRO = """## Try it

A short task on this notebook's technique, set from this notebook's own recipe: the next cell shows it,
with its figures computed when it runs. You answer in the libraries' own code: the answer cell holds the
`SFTConfig` (and where the task needs them the `LoraConfig`, `BitsAndBytesConfig` or accelerate config) of
the rung you start from. Change the lines marked `# <- ?`, run it, then run the check: the course reads
your objects back into a recipe (`course_utils.from_library`), estimates it and says why it holds or not.
The worked solution shows only when you ask for it: the cell after the answer has a button (try the task
first)."""


def block(ex: Exercise) -> list[tuple[str, str, dict]]:
    """The exercise's cells as (cell type, source, metadata)."""
    name, base = ex.notebook, ex.base_name
    imports = "from course_utils.chapter.exercises import check_exercise, show_exercise, show_solution\n"
    show = imports + (ex.setup + "\n" if ex.setup else "") + f'\nshow_exercise("{name}", {base})'
    tags = {"tags": [TAG]}
    return [("markdown", INTRO, tags),
            ("code", show, tags),
            ("code", ex.answer_cell(base_recipe_for("tiny", "cpu"), "cpu"), tags),  # the rung, in library code
            ("code", f'show_solution("{name}", {base})',
             {"jupyter": {"source_hidden": True}, "tags": [TAG, SOLUTION_TAG]}),
            ("code", f'check_exercise("{name}", answer, {base})', tags)]


def make_cell(kind: str, source: str, metadata: dict, cell_id: str) -> dict:
    """A new notebook cell (nbformat 4.5), code cells unexecuted."""
    cell = {"cell_type": kind, "id": cell_id, "metadata": metadata, "source": source.splitlines(keepends=True)}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return dict(sorted(cell.items()))


def same(cell: dict, kind: str, source: str, metadata: dict) -> bool:
    """Whether an existing cell already is this one (outputs and execution metadata aside)."""
    meta = cell.get("metadata", {})
    return (cell["cell_type"] == kind and "".join(cell["source"]) == source
            and meta.get("tags") == metadata["tags"] and meta.get("jupyter") == metadata.get("jupyter"))


def insert(nb: dict, ex: Exercise, where: str) -> dict:
    """`nb` with the exercise's block before its quiz section, replacing any earlier block."""
    tagged = lambda c: TAG in c.get("metadata", {}).get("tags", [])  # noqa: E731
    old = [c for c in nb["cells"] if tagged(c)]
    cells = [c for c in nb["cells"] if not tagged(c)]
    quiz = next((i for i, c in enumerate(cells)
                 if c["cell_type"] == "markdown" and QUIZ_MARK in "".join(c["source"])), None)
    if quiz is None:
        raise SystemExit(f"{where}: no Markdown cell says {QUIZ_MARK!r}, so there is no quiz section to put the "
                         "exercise before; add the quiz section first")
    ids = {c.get("id") for c in cells}
    new = []
    for k, (kind, source, metadata) in enumerate(block(ex)):
        kept = old[k] if k < len(old) and same(old[k], kind, source, metadata) else None
        cell_id = f"{ex.notebook[:2]}-try-{k}"
        if kept is None and cell_id in ids:
            raise SystemExit(f"{where}: a cell already has the id {cell_id!r}; rename it")
        new.append(kept or make_cell(kind, source, metadata, cell_id))
    nb["cells"] = cells[:quiz] + new + cells[quiz:]
    return nb


def rewrite(path: Path, check: bool = False) -> bool:
    """Insert the exercise into one notebook (unless `check`); True if the file changes (or would)."""
    if path.stem not in EXERCISES:
        raise SystemExit(f"{path}: no exercise named {path.stem!r} in course_utils/chapter/exercises.py "
                         f"(there are: {', '.join(EXERCISES)})")
    text = path.read_text(encoding="utf-8")
    out = json.dumps(insert(json.loads(text), EXERCISES[path.stem], str(path)), indent=1, ensure_ascii=False) + "\n"
    if out == text:
        return False
    if not check:
        path.write_text(out, encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/NN_*.ipynb")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook would change")
    args = parser.parse_args(argv)
    paths = args.notebooks or [p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
                               if p.stem not in WITHOUT_EXERCISE]  # those say why they have no Try it
    changed = [p for p in paths if rewrite(p, args.check)]
    for p in changed:
        print(f"{'would change' if args.check else 'inserted the exercise into'}: {p}")
    if not changed:
        print(f"{len(paths)} notebooks already have their exercise.")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
