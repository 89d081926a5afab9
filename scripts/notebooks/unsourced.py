"""List the figures without a source in quiz banks, notebooks or Markdown files (course_utils.facts).

    python scripts/notebooks/unsourced.py                       # every bank, notebook and README.md (what pytest -m truth checks)
    python scripts/notebooks/unsourced.py quizzes/01_*.yaml notebooks/05_qlora_4bit.ipynb README.md

A Markdown file is checked without the content of its marker blocks (`<!-- name -->` ... `<!-- /name -->`),
which tests keep equal to the course function that prints them.

Prints one line per figure (file, question or cell, the number and its context) and renders every bank, so a
placeholder that cannot be evaluated is named too. Exit status 1 when anything is listed.

The figures are the named figures' shipped values (course_utils/reference/facts.json), so this needs no torch and
takes seconds; a placeholder that types a source instead of a name of course_utils/chapter/figures.yaml is listed.
Whether facts.json still matches its sources: `python -m course_utils.chapter.facts --check`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    from course_utils.chapter import facts, figures
    from course_utils.chapter import texts as truth_texts
    from course_utils.chapter.quiz.bank import QuizError, load_bank, quiz_dir

    paths = [Path(a) for a in argv]
    texts = truth_texts.every_text() if not paths else (item for p in paths for item in truth_texts.texts_of(p))
    def check(where: str, text: str) -> list[str]:
        try:
            return [f"{where}: {u}" for u in facts.unsourced(text)]
        except facts.FactError as e:
            return [f"{where}: {e}"]

    with figures.from_shipped():
        problems = [line for where, text in texts for line in check(where, text)]
        for p in paths or sorted(quiz_dir().glob("*.yaml")):
            if p.suffix == ".yaml":
                try:
                    load_bank(p)
                except QuizError as e:
                    problems += str(e).splitlines()
    print("\n".join(problems) or "every figure has a source")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
