"""Rewrite the pinned figures of README.md and the notebooks' markdown (`8.2<!--{{ expr :.1f }}-->`) as their
sources give them now, and list each one that changed, so that the prose around it can be read again.

    python scripts/notebooks/refresh_figures.py            # README.md and notebooks/*.ipynb
    python scripts/notebooks/refresh_figures.py --check    # list what is stale, change nothing (exit 1 if any)

The truth test (`python -m pytest -m truth`) fails on a stale pinned figure; this script is how it gets mended
after a new reference run ships. A number is only rewritten, never reworded: a sentence that compares two figures
("less memory", "slower") still needs a reader.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from course_utils.chapter import facts  # noqa: E402


def refresh_notebook(path: Path, write: bool) -> list:
    nb = json.loads(path.read_text(encoding="utf-8"))
    changes = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        new, changed = facts.refresh(text)
        if changed:
            changes += changed
            cell["source"] = new.splitlines(keepends=True)
    if changes and write:
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return changes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=Path, help="default: README.md and notebooks/*.ipynb")
    ap.add_argument("--check", action="store_true", help="list the stale figures, change nothing")
    args = ap.parse_args(argv)
    files = args.files or [ROOT / "README.md", *sorted((ROOT / "notebooks").glob("*.ipynb"))]
    stale = 0
    for path in files:
        if path.suffix == ".ipynb":
            changes = refresh_notebook(path, not args.check)
        else:
            text, changes = facts.refresh(path.read_text(encoding="utf-8"))
            if changes and not args.check:
                path.write_text(text, encoding="utf-8")
        for was, now, expr in changes:
            print(f"{path.name}: {was} -> {now}   {{{{ {expr} }}}}")
        stale += len(changes)
    print(f"{stale} figure(s) {'stale' if args.check else 'rewritten'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
