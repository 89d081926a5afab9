"""What the course prints fits 100 characters a line (about 118 fit a JupyterLab output at 1366 px), and its
tables are tables: course_utils.tables (HTML for Jupyter, fitted text elsewhere), the course's tables and
prose built from the shipped reference runs, and every committed notebook's text outputs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course_utils.show.tables import WIDTH, Column, Flagged, Note, Table, TableError, common_parts, wrap, wrap_parts

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def widest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


# --- committed notebooks ------------------------------------------------------------------------
def long_lines(nb: dict) -> list[str]:
    """'code cell N (kind): length: line' for every text line over WIDTH in the notebook's outputs (streams
    and text/plain; Markdown and HTML are reflowed by what renders them)."""
    found = []
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for i, cell in enumerate(code):
        for out in cell.get("outputs", []):
            texts = [("stream", out.get("text", ""))] if out["output_type"] == "stream" else []
            texts += [("text/plain", out.get("data", {}).get("text/plain", ""))]
            for kind, text in texts:
                text = "".join(text) if isinstance(text, list) else text
                found += [f"code cell {i} ({kind}): {len(line)}: {line[:60]}..."
                          for line in text.splitlines() if len(line) > WIDTH]
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_outputs_fit_100_characters(path):
    """Fails on a notebook executed before its tables and prose were fitted: re-execute it."""
    found = long_lines(json.loads(path.read_text(encoding="utf-8")))
    assert not found, f"{path.name}: {len(found)} output lines over {WIDTH} characters:\n" + "\n".join(found[:15])


def test_the_check_sees_long_lines():
    nb = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "stream", "name": "stdout", "text": ["short\n", "x" * 101 + "\n"]},
        {"output_type": "execute_result", "data": {"text/plain": "y" * 120, "text/html": "z" * 500}}]}]}
    assert [f.split(":")[0] for f in long_lines(nb)] == ["code cell 0 (stream)", "code cell 0 (text/plain)"]


# --- the Table ----------------------------------------------------------------------------------
def sample(rows=None, **kw) -> Table:
    columns = [Column("recipe", wrap=True), Column("peak", "MiB", ".1f"), Column("tokens/s", fmt=",.0f")]
    return Table(columns, rows or [("baseline <fp32>", 304.25, 2425.4), ("+ checkpointing", 223.2, None)], **kw)


def test_text_has_header_units_and_aligned_numbers():
    lines = str(sample(title="A title", notes=["a note"])).splitlines()
    assert lines[0] == "A title" and lines[1] == "" and lines[-1] == "a note"
    assert lines[2].split() == ["recipe", "peak", "tokens/s"] and lines[3].split() == ["(MiB)"]
    assert lines[4].split() == ["baseline", "<fp32>", "304.2", "2,425"] and lines[5].endswith("-")
    assert len({len(line) for line in lines[4:6]}) == 1  # right-aligned numbers end in one column


def test_html_is_a_table_deterministic_and_escaped():
    table = sample(title="A <title>", notes=["a note"])
    html = table._repr_html_()
    assert "<table" in html and "peak (MiB)" in html and "304.2" in html
    assert "&lt;fp32&gt;" in html and "<fp32>" not in html and "A &lt;title&gt;" in html
    assert html == sample(title="A <title>", notes=["a note"])._repr_html_()  # no random ids (nbval compares it)
    assert "text-align: right" in html and "<th class=\"blank" not in html  # numbers right, no index


def test_frame_keeps_numbers_and_notes():
    table = sample([("a", 1.0, Flagged(10.0)), ("b", Note("skipped: why"))])
    frame = table.to_frame()
    assert list(frame.columns) == ["recipe", "peak (MiB)", "tokens/s", "note"]
    assert frame["tokens/s"].tolist()[0] == 10.0 and frame["note"].tolist() == ["", "skipped: why"]
    text = str(table)
    assert "10*" in text and re.search(r"^b\s+skipped: why$", text, re.M)


def test_long_names_wrap_and_a_long_note_stays_beside_them():
    name = "a recipe name that is far too long to sit in one column of a table " * 2
    table = sample([(name, 1.0, 2.0), ("short", Note("does not fit: " + "out of memory " * 12))])
    text = str(table)
    assert widest(text) <= WIDTH
    assert " ".join(name.split()) in " ".join(re.sub(r"\s{2,}[\d.,]+", " ", text).split())
    assert text.splitlines()[-1].startswith(" ") and "out of memory" in text.splitlines()[-1]


def test_too_many_columns_stack():
    columns = [Column("recipe")] + [Column(f"column {k}", "MiB", ".1f") for k in range(12)]
    text = str(Table(columns, [["r"] + [1000.0 + k for k in range(12)]]))
    assert widest(text) <= WIDTH
    assert text.splitlines()[0] == "r" and "column 11 1011.0 MiB" in " ".join(text.split())


def test_a_row_that_does_not_match_the_columns_is_refused():
    with pytest.raises(TableError, match=r"row 0 .* 2 values for 3 columns .*Note"):
        sample([("a", 1.0)])


def test_wrap_hangs_list_items_and_keeps_short_lines():
    assert wrap("short\n  kept   as is") == "short\n  kept   as is"
    text = wrap("   ( ) C. " + "word " * 40)
    assert widest(text) <= WIDTH and all(line.startswith(" " * 10) for line in text.splitlines()[1:])
    text = wrap("  - " + "note " * 40)
    assert all(line.startswith("    ") for line in text.splitlines()[1:])
    assert wrap("x " * 80, indent="").splitlines()[1].startswith("x")


def test_wrap_parts_breaks_between_parts():
    parts = [f"package-{k} 1.{k}.0," for k in range(20)]
    text = wrap_parts(parts, " ", first="versions: ")
    assert widest(text) <= WIDTH and text.startswith("versions: package-0")
    assert all(re.fullmatch(r"(versions: )?(\s*package-\d+ 1\.\d+\.0,)+", line) for line in text.splitlines())


def test_common_parts():
    assert common_parts(["a, b, c", "a, b, d"]) == (["a", "b"], ["c", "d"])
    assert common_parts(["a, b"]) == ([], ["a, b"])
    assert common_parts(["a, b", "a, b"]) == (["a", "b"], ["-", "-"])


# --- the course's tables and prose, from the shipped runs --------------------------------------------
def test_results_and_beyond_tables_fit():
    from course_utils.chapter import beyond_the_recipe as beyond
    from course_utils.chapter import toward_the_limit
    from course_utils.results import all_reference_results
    from course_utils.show.report import format_table

    assert widest(format_table(all_reference_results())) <= WIDTH
    side = beyond.reference()
    assert widest(beyond.format_rows(beyond.rows(side))) <= WIDTH
    assert "<table" in beyond.rows_table(beyond.rows(side))._repr_html_()
    labels, explore = beyond.by_label(side), beyond.by_label(beyond.reference(run="explore"))
    ours = {"1x16": [explore["+ Liger kernels"], labels["lean recipe (4x4)"]],
            "16x1": [labels["fast recipe (16x1)"], labels["fast, embeddings + activations on CPU (16x1)"]]}
    assert widest(toward_the_limit.peer_comparison(ours)) <= WIDTH


def test_reference_provenance_fits_and_keeps_run_ids_whole():
    from course_utils.chapter import beyond_the_recipe as beyond
    from course_utils.chapter import toward_the_limit
    from course_utils.chapter.every_notebook import describe_reference
    from course_utils.results import reference_results

    for ms in (reference_results(), beyond.reference(), beyond.reference(run="explore")):
        text = describe_reference(ms, prefix="reference: ")
        assert widest(text) <= WIDTH and text.startswith("reference: NVIDIA H200 (driver")
        for run_id in {m.run_id for m in ms if m.run_id}:
            assert f"run {run_id}" in text


def test_helpers_prose_fits():
    from course_utils.estimate import estimate, expected_memory_table, format_expected_table
    from course_utils.chapter.efficient_optimizers import paging
    from course_utils.chapter.complete_recipe import check_recipe
    from course_utils.recipe import base_recipe_for
    from course_utils.recipe import source_chapter_recipe

    texts = [format_expected_table(expected_memory_table()), paging(),
             check_recipe(source_chapter_recipe("llama-3.1-8b"), hardware="t4"),
             estimate(base_recipe_for("tiny", "cpu"), hardware="cpu").explain(),
             estimate(source_chapter_recipe("llama-3.1-8b"), hardware="gpu").explain()]
    for text in texts:
        assert widest(text) <= WIDTH, text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_t4_check_prose_fits(path):
    from course_utils.chapter import t4 as t4check

    assert widest(t4check.how_long_on_a_t4(path.stem)) <= WIDTH
    try:
        table = t4check.profile_table(path.stem)
    except t4check.T4CheckError:
        pytest.skip(f"no T4 profile record for {path.stem}")
    assert widest(table) <= WIDTH


def test_quiz_text_copies_fit():
    from course_utils.chapter.quiz import widget as quiz

    for name in quiz.bank_names():
        q = quiz.make_quiz(name)
        assert widest(q._repr_mimebundle_()["text/plain"]) <= WIDTH, name
    assert widest(quiz.make_chapter_quiz(10, 0).text()) <= WIDTH
