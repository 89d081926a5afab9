"""Link each glossary term (course_utils/chapter/glossary.py, GLOSSARY.md) where it first appears in a notebook: its first
prose mention becomes a link, or, when it first shows in a cell's output, the Markdown cell above that output gets
a "Terms" line with the link and a few words. Idempotent; nothing is executed, outputs stay as they are.

    python scripts/notebooks/link_glossary.py notebooks/*.ipynb          # add the missing links
    python scripts/notebooks/link_glossary.py --check notebooks/*.ipynb  # exit 1 if a link is missing
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from course_utils.chapter.glossary import missing_links, with_links  # noqa: E402


def main(argv: list[str]) -> int:
    check = "--check" in argv
    missing = []
    for path in map(Path, (a for a in argv if a != "--check")):
        text = path.read_text(encoding="utf-8")
        nb = json.loads(text)
        if check:
            missing += [f"{path.name} {m}" for m in missing_links(nb)]
            continue
        out = json.dumps(with_links(nb), indent=1, ensure_ascii=False) + "\n"
        if out != text:
            path.write_text(out, encoding="utf-8")
            print(f"linked: {path.name}")
    if check:
        print("\n".join(missing) or "every term is linked where it first appears")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
