"""Rewrite every notebook's "Open in Colab" badge, its Colab setup cell (the first code cell) and its Colab
metadata from course_utils/chapter/every_notebook.py: the badge from REPOSITORY and RELEASE_TAG, the setup cell from the one
template SETUP_CELL (which installs REPOSITORY at RELEASE_TAG, v + course_utils.__version__) with its
SETUP_CELL_METADATA (Colab's form view), and COLAB_METADATA in the notebook's metadata (a T4 GPU runtime, as
Unsloth's notebooks ask for one). Run it after changing any of those:

    python scripts/notebooks/update_badges.py          # rewrite in place
    python scripts/notebooks/update_badges.py --check  # exit 1 if any notebook is out of date
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from course_utils.chapter.every_notebook import COLAB_METADATA, SETUP_CELL_METADATA, colab_url, setup_cell  # noqa: E402

BADGE = re.compile(r"\[!\[Open In Colab\]\(https://colab\.research\.google\.com/assets/colab-badge\.svg\)\]\([^)]*\)")


def badge(path: str) -> str:
    """The badge markdown for one notebook path (relative to the repository root)."""
    return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(path)})"


def rewrite(nb_path: Path) -> bool:
    """Rewrite one notebook's badge and setup cell (source; its outputs stay empty); True if it changed."""
    rel = nb_path.resolve().relative_to(ROOT).as_posix()
    text = nb_path.read_text()
    nb = json.loads(text)
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            source = "".join(cell["source"])
            new = BADGE.sub(badge(rel), source)
            if new != source:
                cell["source"] = new.splitlines(keepends=True)
    setup = next((c for c in nb["cells"] if c["cell_type"] == "code"), None)
    if setup is None or "google.colab" not in "".join(setup["source"]):
        raise SystemExit(f"{rel}: the first code cell is not the Colab setup cell; add one (any old one) first")
    setup["source"] = setup_cell().splitlines(keepends=True)
    setup["outputs"] = []
    setup["metadata"] = {**setup.get("metadata", {}), **SETUP_CELL_METADATA}
    nb["metadata"] = {**COLAB_METADATA, **{k: v for k, v in nb["metadata"].items() if k not in COLAB_METADATA}}
    out = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if out != text:
        nb_path.write_text(out)
        return True
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        before = nb.read_text()
        if rewrite(nb):
            stale.append(nb.name)
            if args.check:
                nb.write_text(before)
    print(("out of date: " if args.check else "rewrote: ") + (", ".join(stale) or "nothing"))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
