"""Rewrite every notebook's "Open in Colab" badge and Colab install line from the one repository
address in course_utils/notebook.py (REPOSITORY, BRANCH). Run it after changing that address:

    python scripts/update_badges.py          # rewrite in place
    python scripts/update_badges.py --check  # exit 1 if any notebook is out of date
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_utils.notebook import BRANCH, REPOSITORY, colab_url  # noqa: E402

BADGE = re.compile(r"\[!\[Open In Colab\]\(https://colab\.research\.google\.com/assets/colab-badge\.svg\)\]\([^)]*\)")
INSTALL = re.compile(r"git\+https://github\.com/[^\"'@\s]+(@[^\"'\s]+)?")


def badge(path: str) -> str:
    """The badge markdown for one notebook path (relative to the repository root)."""
    return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(path)})"


def install_url() -> str:
    """What the Colab setup cell pip-installs."""
    return f"git+https://{REPOSITORY}@{BRANCH}"


def rewrite(nb_path: Path) -> bool:
    """Rewrite one notebook's badge and install line; True if it changed."""
    rel = nb_path.resolve().relative_to(ROOT).as_posix()
    text = nb_path.read_text()
    nb = json.loads(text)
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        new = BADGE.sub(badge(rel), source) if cell["cell_type"] == "markdown" else INSTALL.sub(install_url(), source)
        if new != source:
            cell["source"] = new.splitlines(keepends=True)
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
