"""The texts the truth test reads (`python -m pytest -m truth`, scripts/notebooks/unsourced.py): every quiz bank, every
notebook's Markdown, README.md and TROUBLESHOOTING.md, each as (where, text) pairs whose figures
course_utils.chapter.facts.unsourced checks."""

from __future__ import annotations

import re
from pathlib import Path

from course_utils.chapter.facts import unsourced
from course_utils.chapter.quiz.question import quiz_dir
from course_utils.common import shipped

ROOT = shipped().parent  # a checkout: notebooks/ and README.md live beside the package
TEXT_KEYS = ("title", "prompt", "text", "explanation", "hint")
# a block of Markdown between `<!-- name -->` and `<!-- /name -->` is a course function's output, which a test
# keeps equal to that function (tests/test_readme.py, tests/test_t4check.py, tests/test_estimate.py)
MARKER_BLOCK = re.compile(r"(<!-- ([\w-]+) -->\n).*?(<!-- /\2 -->)", re.S)


def bank_texts(path: Path):
    """(where, text) for every text of a quiz bank, as written (placeholders unrendered)."""
    import yaml

    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    yield f"{path.name}: title", data["title"]
    for q in data["questions"]:
        where = f"{path.name}: {q['id']}"
        for key in TEXT_KEYS:
            if isinstance(q.get(key), str):
                yield f"{where} {key}", q[key]
        for i, c in enumerate(q.get("choices", [])):
            yield f"{where} choice {i + 1}", c["text"] if isinstance(c["text"], str) else str(c["text"])
            yield f"{where} choice {i + 1} explanation", c["explanation"]
        for w in q.get("wrong_answers", []):
            yield f"{where} wrong answer {w['answer']}", w["explanation"]
        if q.get("type") == "numeric" and not isinstance(q["answer"], str):
            # a typed answer is a figure too: a count, or the result of arithmetic its explanation shows
            shown = unsourced(q["explanation"]) == [] and f"= {q['answer']}" in q["explanation"].replace("**", "")
            if not shown:
                yield f"{where} answer", str(q["answer"])


def notebook_texts(path: Path):
    """(where, text) for every Markdown cell of a notebook (its Colab badge aside)."""
    import json

    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "markdown":
            text = "\n".join(line for line in "".join(cell["source"]).splitlines() if "colab-badge" not in line)
            yield f"{path.name}: cell {i}", text


def markdown_texts(path: Path):
    """(where, text) for a Markdown file, with the content of each marker block removed."""
    yield path.name, MARKER_BLOCK.sub(lambda m: m.group(1) + m.group(3), path.read_text(encoding="utf-8"))


def texts_of(path: Path):
    """The texts of one file: a quiz bank, a notebook or a Markdown file."""
    reader = {".yaml": bank_texts, ".ipynb": notebook_texts, ".md": markdown_texts}.get(path.suffix)
    return reader(path) if reader else [(path.name, path.read_text())]


def every_text():
    """Every quiz bank, every notebook's Markdown, README.md and TROUBLESHOOTING.md: what `pytest -m truth` checks."""

    for path in [*sorted(quiz_dir().glob("*.yaml")), *sorted((ROOT / "notebooks").glob("*.ipynb")),
                 ROOT / "README.md", ROOT / "TROUBLESHOOTING.md"]:
        yield from texts_of(path)


def module_map() -> str:
    """README's map of the package: every module, a line each, with the first sentence of its docstring (the
    README block `module-map`, kept equal to this by tests/test_readme.py, so a new module cannot go unnamed)."""
    import ast

    package = shipped()
    lines = ["| module | what it holds |", "|---|---|"]
    for path in sorted(package.rglob("*.py"), key=lambda p: (p.parent != package, "chapter" in p.parts, str(p))):
        doc = " ".join((ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").split())
        first = re.split(r"(?<=\.)\s", doc, maxsplit=1)[0] if doc else ""
        lines.append(f"| `{path.relative_to(package.parent).as_posix()}` | {first.replace('|', '/')} |")
    return "\n".join(lines)
