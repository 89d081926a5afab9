"""Measurement and ResultStore with synthetic measurements (no training), and the text outputs."""

from __future__ import annotations

import json
import os
import re

import pytest

from course_utils.recipe import Recipe
from course_utils.common import MiB
from course_utils.results import Measurement, ResultStore, StoreError, reference_results
from course_utils.show.report import describe_change, format_table, results_table, summary_row
from course_utils.show.tables import WIDTH

CATS = ("parameters", "gradients", "optimizer", "activations", "temporaries", "other")


def make(label="baseline", env_key="envA", status="ok", peak_mib=None, tokens_per_s=1000.0, losses=(2.5,),
         error="", **recipe_changes) -> Measurement:
    recipe = Recipe(label=label, **recipe_changes)
    by_cat = {"parameters": 10 * MiB, "gradients": 2 * MiB, "optimizer": 4 * MiB, "activations": 20 * MiB,
              "temporaries": 8 * MiB, "other": 0}
    return Measurement(
        recipe=recipe.to_dict(), recipe_key=recipe.key, env={"device": "TestDevice"}, env_key=env_key,
        status=status, peak_bytes=int((peak_mib if peak_mib is not None else 44) * MiB), peak_by_category=by_cat,
        tokens_per_s=tokens_per_s if status == "ok" else None, losses=list(losses), error=error,
        date="2025-01-01T00:00:00+00:00", command="pytest",
    )


@pytest.fixture
def store(tmp_path):
    return ResultStore(tmp_path / "results.jsonl")


# --- Measurement ---------------------------------------------------------------------------------


def test_measurement_json_round_trip():
    m = make(gradient_checkpointing=True)
    m.cached = True
    d = json.loads(m.to_json())
    assert "cached" not in d
    back = Measurement.from_dict(d)
    assert back == m
    assert back.cached is False
    assert back.recipe_obj == Recipe(gradient_checkpointing=True)
    assert back.label == "baseline"
    assert back.final_loss == 2.5
    assert back.fits
    assert back.mib("parameters") == 10.0
    assert back.mib("peak") == 44.0


def test_from_dict_ignores_unknown_keys_and_names_missing_ones():
    d = json.loads(make().to_json()) | {"from_a_newer_version": 1}
    assert Measurement.from_dict(d) == make()
    with pytest.raises(ValueError, match=r"recipe_key.*status|status.*recipe_key"):
        Measurement.from_dict({"recipe": {}, "env": {}, "env_key": "x"})


def test_does_not_fit_is_not_fits():
    assert not make(status="does_not_fit").fits


# --- store: add / load / find --------------------------------------------------------------------


def test_missing_store_is_empty(store):
    assert store.load() == []
    assert store.find(Recipe(), "envA") is None


def test_add_load_find_round_trip(store):
    a = make("a")
    b = make("b", gradient_checkpointing=True)
    store.add(a)
    store.add(b)
    assert store.load() == [a, b]
    assert store.find(Recipe(), "envA") == a
    assert store.find(Recipe(gradient_checkpointing=True), "envA") == b
    assert store.find(Recipe(label="another label"), "envA") == a  # the label is not part of the key


def test_find_respects_env_and_recipe_key(store):
    store.add(make(env_key="envA"))
    assert store.find(Recipe(), "envB") is None
    assert store.find(Recipe(micro_batch=2), "envA") is None
    store.add(make(env_key="envB", peak_mib=99))
    assert store.find(Recipe(), "envB").peak_bytes == 99 * MiB
    assert store.find(Recipe(), "envA").peak_bytes == 44 * MiB


def test_find_returns_the_latest(store):
    for peak in (10, 20, 30):
        store.add(make(peak_mib=peak))
    store.add(make(peak_mib=40, env_key="other"))
    assert store.find(Recipe(), "envA").peak_bytes == 30 * MiB


def test_add_creates_missing_folders(tmp_path):
    s = ResultStore(tmp_path / "a" / "b" / "results.jsonl")
    s.add(make())
    assert s.load() == [make()]


# --- corrupted lines -----------------------------------------------------------------------------


def _write_with_corruption(store):
    good1, good2 = make("one"), make("two", micro_batch=2)
    missing_fields = json.dumps({"recipe": Recipe().to_dict(), "env": {}})  # no recipe_key, env_key, status
    store.path.write_text("\n".join([good1.to_json(), "}} this is not json {{", missing_fields, good2.to_json()])
                          + "\n", encoding="utf-8")
    return good1, good2


def test_corrupted_lines_are_skipped_with_a_warning_naming_file_and_line(store):
    good1, good2 = _write_with_corruption(store)
    with pytest.warns(UserWarning) as record:
        loaded = store.load()
    assert loaded == [good1, good2]
    messages = [str(w.message) for w in record]
    assert any(f"{store.path}:2:" in m for m in messages), messages
    assert any(f"{store.path}:3:" in m and "recipe_key" in m for m in messages), messages
    assert not any(f"{store.path}:1:" in m or f"{store.path}:4:" in m for m in messages)


def test_find_still_works_past_corrupted_lines(store):
    _write_with_corruption(store)
    with pytest.warns(UserWarning, match=re.escape(str(store.path))):
        assert store.find(Recipe(micro_batch=2), "envA").label == "two"


def test_add_after_a_corrupted_line_keeps_it(store):
    _write_with_corruption(store)
    before = store.path.read_bytes()
    new = make("three", micro_batch=3)
    store.add(new)
    after = store.path.read_bytes()
    assert after.startswith(before)  # nothing lost, the bad line included
    assert after[len(before):] == new.to_json().encode() + b"\n"
    with pytest.warns(UserWarning):
        assert [m.label for m in store.load()] == ["one", "two", "three"]


def test_a_binary_garbage_line_is_skipped_too(store):
    good = make()
    store.path.write_bytes(good.to_json().encode() + b"\n\xff\xfe\x00garbage\n")
    with pytest.warns(UserWarning, match=re.escape(f"{store.path}:2:")):
        assert store.load() == [good]


# --- atomic writes -------------------------------------------------------------------------------


def test_atomic_add_leaves_no_temp_files(store):
    for i in range(3):
        store.add(make(peak_mib=i))
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["results.jsonl", "results.jsonl.lock"]
    assert len(store.path.read_text().splitlines()) == 3


def test_failed_add_leaves_the_file_whole_and_no_temp_files(store, monkeypatch):
    store.add(make("kept"))
    before = store.path.read_bytes()

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(StoreError, match=re.escape(f"{store.path}") + ".*No space left on device.*free some disk space"):
        store.add(make("lost", micro_batch=2))
    assert store.path.read_bytes() == before
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["results.jsonl", "results.jsonl.lock"]


def test_missing_trailing_newline_is_added_before_the_new_line(store):
    a, b = make("a"), make("b", micro_batch=2)
    store.path.write_text(a.to_json(), encoding="utf-8")  # no trailing newline
    store.add(b)
    assert store.path.read_text(encoding="utf-8") == a.to_json() + "\n" + b.to_json() + "\n"
    assert store.load() == [a, b]


def test_blank_lines_are_ignored_silently(store, recwarn):
    a = make()
    store.path.write_text("\n" + a.to_json() + "\n\n", encoding="utf-8")
    assert store.load() == [a]
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]


# --- text outputs --------------------------------------------------------------------------------


def test_format_table_has_labels_and_mib():
    base = make("baseline run", tokens_per_s=1234.0, losses=(3.0, 2.5))
    ckpt = make("with checkpointing", peak_mib=30, gradient_checkpointing=True)
    ckpt.peak_by_category["activations"] = 6 * MiB
    text = format_table([base, ckpt])
    lines = text.splitlines()
    assert "(MiB)" in lines[1]
    row_base = next(line for line in lines if line.startswith("baseline run"))
    row_ckpt = next(line for line in lines if line.startswith("with checkpointing"))
    assert row_base.split()[2:] == ["10.0", "2.0", "4.0", "20.0", "8.0", "44.0", "1234", "2.500"]
    assert row_ckpt.split()[2:] == ["10.0", "2.0", "4.0", "6.0", "8.0", "30.0", "1000", "2.500"]
    assert "cuda" not in lines[0]  # no CUDA columns without CUDA numbers


def test_format_table_cuda_columns_when_measured():
    m = make()
    m.cuda_max_allocated, m.cuda_max_reserved = 50 * MiB, 64 * MiB
    lines = format_table([m]).splitlines()
    assert lines[0].split() == ["cuda", "cuda"] and lines[1].split()[7:9] == ["alloc", "rsrvd"]
    assert lines[-1].split()[7:9] == ["50.0", "64.0"]
    frame = results_table([m]).to_frame()
    assert frame["CUDA allocated (MiB)"].tolist() == [50.0] and frame["CUDA reserved (MiB)"].tolist() == [64.0]


def test_results_table_is_html_and_text_within_the_width():
    """The chapter's shipped H200 runs (8B and 13B models, GiB figures, CUDA columns, long recipe names)."""
    table = results_table(reference_results())
    html = table._repr_html_()
    assert "<table" in html and "peak (GiB)" in html and "CUDA reserved (GiB)" in html
    assert html == results_table(reference_results())._repr_html_()  # no random ids: nbval compares it
    text = str(table)
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    names = []  # a long name wraps onto indented lines under its first one, whole
    for line in text.splitlines()[3:]:
        first = re.split(r"\s{2,}", line.strip())[0]
        if line.startswith(" "):
            names[-1] += " " + first
        else:
            names.append(first)
    assert names == [m.label for m in reference_results()]


def test_results_table_units_follow_the_size_and_mark_a_noisy_speed():
    small, big = make("small"), make("big", peak_mib=20_000)
    assert "(MiB)" in format_table([small]) and "(GiB)" in format_table([small, big])
    assert "19.53" in format_table([small, big])  # 20,000 MiB in GiB
    noisy = make("noisy", tokens_per_s=1234.0)
    if not hasattr(noisy, "timing"):
        pytest.skip("this Measurement records no timing")
    noisy.timing = {"spread": 0.9}
    text = format_table([small, noisy])
    assert "1234~" in text and "a speed not to be trusted" in " ".join(text.split())
    assert "noisy (its timed steps differed a lot, by 90% of their median)" in " ".join(text.split())
    assert "~" not in format_table([small])


def test_format_table_does_not_fit_and_skipped_rows():
    ok = make("fits")
    oom = make("too big", status="does_not_fit", error="BudgetExceeded: over the budget", micro_batch=64)
    # a skipped rung is a name and a reason (run_ladder's rungs.skipped), not a copy of the rung above
    table = results_table([ok, oom], skipped={"same as above": "same recipe as the rung above"},
                          order=["fits", "too big", "same as above"])
    text = str(table)
    oom_line = next(line for line in text.splitlines() if line.startswith("too big"))
    assert "does not fit: BudgetExceeded: over the budget" in oom_line
    skipped_line = next(line for line in text.splitlines() if line.startswith("same as above"))
    assert "skipped: same recipe as the rung above" in skipped_line
    assert "44.0" not in skipped_line
    frame = table.to_frame()  # the HTML and the DataFrame keep the reason in a column of its own
    assert frame["note"].tolist() == ["", "does not fit: BudgetExceeded: over the budget",
                                      "skipped: same recipe as the rung above"]
    assert frame["peak (MiB)"].isna().tolist() == [False, True, True]


def test_a_skipped_rung_sits_in_its_place_on_the_ladder():
    """run_ladder's {rung name: why}: each skipped rung is a skip row between the measured rungs, in the ladder's
    order (RUNG_NAMES, the default), with no numbers."""
    from course_utils.recipe import RUNG_NAMES

    first, third, fifth = (make(RUNG_NAMES[i]) for i in (0, 2, 4))
    why = {RUNG_NAMES[3]: "same recipe as the rung above", RUNG_NAMES[1]: "cannot run here", "elsewhere": "not here"}
    frame = results_table([first, third, fifth], skipped=why).to_frame()
    assert frame["recipe"].tolist() == [*RUNG_NAMES[:5], "elsewhere"]
    assert frame["note"].tolist() == ["", "skipped: cannot run here", "", "skipped: same recipe as the rung above",
                                      "", "skipped: not here"]
    assert frame["peak (MiB)"].isna().tolist() == [False, True, False, True, False, True]


def test_describe_change_names_labels_numbers_and_category():
    before = make("before", tokens_per_s=1000.0)
    after = make("after", peak_mib=30, tokens_per_s=500.0, gradient_checkpointing=True)
    after.peak_by_category["activations"] = 6 * MiB
    line = describe_change(before, after)
    assert line.startswith("after:")
    assert "peak -14.0 MiB (-32%)" in line
    assert "speed 1,000 -> 500 tokens/s (-50%" in " ".join(line.split())
    assert "largest change in activations (-14.0 MiB)" in line


def test_describe_change_wraps_a_long_line():
    before = make("x" * 60, tokens_per_s=1000.0)
    after = make("a long label that takes most of the line, " * 2, peak_mib=30, tokens_per_s=500.0)
    text = describe_change(before, after)
    assert len(text.splitlines()) >= 2 and max(map(len, text.splitlines())) <= WIDTH
    assert "largest change in" in " ".join(text.split())


def test_describe_change_does_not_fit():
    before = make("before")
    oom = make("after", status="does_not_fit", micro_batch=64)
    assert describe_change(before, oom) == "after: does not fit"
    assert "previous rung did not fit" in describe_change(oom, make("next", micro_batch=2))


def test_summary_row():
    row = summary_row(make("x"))
    assert row["recipe"] == "x" and row["peak"] == 44.0 and row["activations"] == 20.0
    assert "status" not in row
    assert summary_row(make("y", status="does_not_fit"))["status"] == "does not fit"
