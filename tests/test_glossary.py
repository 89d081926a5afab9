"""The glossary (course_utils/chapter/glossary.py, GLOSSARY.md, scripts/notebooks/write_notebooks.py glossary): every term of the teaching
review's jargon list (section 3.2) is defined, GLOSSARY.md is the current rendering, and each notebook links a
term where it first appears (its first prose mention, or the Markdown cell that introduces the output showing it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course_utils.chapter import glossary as G

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# The review's list of terms used without explanation at first appearance (findings 2026-12-03, teaching, 3.2),
# plus the three it says are defined in place (temporaries, launch-bound, unified memory).
JARGON = ["GFLOP/tok", "TFLOP", "T4 peak", "start+build", "RMSNorm", "logsumexp", "fused loss", "loss tile",
          "rotary tables", "autocast", "math kernel", "grouped-query attention", "compute capability",
          "fused attention", "score matrix", "allocator's reserve", "CUDA context", "planner's rule", "Pareto front",
          "residual stream", "Triton", "CUDA graphs", "graph break", "lease", "peer", "x floor", "of limit",
          "root unit", "flat parameter", "meta device", "gloo", "NCCL", "rank", "temporaries", "launch-bound",
          "unified memory"]


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_every_term_of_the_review_is_defined():
    names = [t.term for t in G.TERMS]
    assert len(names) == len(set(names))
    assert set(JARGON) <= set(names), sorted(set(JARGON) - set(names))
    for t in G.TERMS:
        assert t.definition.endswith(".") and len(t.definition.split()) >= 12, t.term
        assert t.short and not re.search(r"\d", t.short.replace("T4", "")), t.term  # no figure in a notebook's line
        assert '"' not in t.short, t.term  # it is a link's title
        assert re.search(t.pattern, t.term, flags=re.I) or t.term == "rotary tables", t.term


def test_glossary_md_is_current_and_has_every_anchor():
    text = (ROOT / "GLOSSARY.md").read_text(encoding="utf-8")
    assert text == G.render(), "GLOSSARY.md is stale: run python -m course_utils.chapter.glossary"
    headings = re.findall(r"(?m)^## (.+)$", text)
    for t in G.TERMS:
        assert t.term in headings
        assert G.link(t.term).endswith(f"/GLOSSARY.md#{t.anchor}")
    assert G.term("GFLOP/tok").anchor == "gfloptok" and G.term("allocator's reserve").anchor == "allocators-reserve"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebook_links_a_term_where_it_first_appears(path):
    nb = _load(path)
    assert G.missing_links(nb) == [], "run python scripts/notebooks/write_notebooks.py glossary"
    assert G.with_links(nb) == nb  # nothing left to add: the script is idempotent on the committed notebooks
    assert G.first_uses(nb), f"{path.name} shows no glossary term"


def test_the_jargon_is_linked_in_the_notebooks_that_use_it():
    linked = {name for p in NOTEBOOKS for name in G.first_uses(_load(p))}
    # every term of the list that a notebook shows in prose or text output; the others are in a figure's legend
    # (Pareto front), in code or an HTML table only (graph break), or no longer in the notebooks (flat parameter)
    assert set(JARGON) - linked == {"Pareto front", "graph break", "flat parameter"}, sorted(set(JARGON) - linked)


def _cell(kind: str, source: str, outputs=None, tags=()) -> dict:
    cell = {"cell_type": kind, "metadata": {"tags": list(tags)} if tags else {}, "source": [source]}
    if kind == "code":
        cell.update(outputs=outputs or [], execution_count=None)
    return cell


def test_first_mention_in_prose_is_linked_and_an_output_term_gets_a_terms_line():
    nb = {"cells": [
        _cell("markdown", "# Title about `autocast`\nWhere the **activations** go, and `temporaries` in code."),
        _cell("markdown", "If a cell fails, activations ...", tags=["troubleshooting"]),
        _cell("code", "print(t)", outputs=[{"output_type": "stream", "name": "stdout",
                                            "text": ["recipe  GFLOP/tok  temporaries\n"]}]),
        _cell("markdown", "Activations again, and RMSNorm."),
    ]}
    out = G.with_links(nb)
    first, generated, _, last = ("".join(c["source"]) for c in out["cells"])
    assert f"**[activations]({G.link('activations')} \"{G.term('activations').short}\")**" in first
    assert "# Title about `autocast`" in first and "in code." in first  # a heading and code spans stay as they are
    terms_line = first.splitlines()[-1]
    assert terms_line.startswith(G.TERMS_LINE) and f"[GFLOP/tok]({G.link('GFLOP/tok')})" in terms_line
    assert f"[temporaries]({G.link('temporaries')}): {G.term('temporaries').short}" in terms_line
    assert generated == "If a cell fails, activations ..."  # another script's cell is never edited
    # only the first use is linked
    assert last == f"Activations again, and [RMSNorm]({G.link('RMSNorm')} \"{G.term('RMSNorm').short}\")."
    assert G.missing_links(out) == [] and G.with_links(out) == out


def test_links_to_an_older_address_move_to_the_current_one():
    old = "https://github.com/someone/else/blob/v0.0.1/GLOSSARY.md#activations"
    nb = {"cells": [_cell("markdown", f"The [activations]({old}) of a step.")]}
    out = G.with_links(nb)
    assert "".join(out["cells"][0]["source"]) == f"The [activations]({G.link('activations')}) of a step."
    titled = {"cells": [_cell("markdown", f'The [activations]({old} "a title") of a step.')]}
    assert "".join(G.with_links(titled)["cells"][0]["source"]) == (
        f'The [activations]({G.link("activations")} "a title") of a step.')
