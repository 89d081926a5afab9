"""Every figure the quiz banks, the notebooks' prose and README.md state has a source (course_utils.facts).

    python -m pytest -m truth
"""

from __future__ import annotations

import pytest

from course_utils.chapter import facts
from course_utils.chapter import texts
from course_utils.chapter.quiz.bank import load_bank, quiz_dir

pytestmark = pytest.mark.truth
def test_every_figure_has_a_source():
    problems = [f"{where}: {u}" for where, text in texts.every_text() for u in facts.unsourced(text)]
    assert not problems, f"{len(problems)} figures without a source:\n" + "\n".join(problems)


def test_every_bank_renders():
    for path in sorted(quiz_dir().glob("*.yaml")):
        load_bank(path)  # raises QuizError naming any placeholder that cannot be rendered


def test_a_typed_figure_fails_and_a_placeholder_passes():
    assert [u.number for u in facts.unsourced("the run peaked at 42.7 MiB")] == ["42.7"]
    assert facts.unsourced("the run peaked at {{ ref('QLoRA 16x1').peak_bytes / MiB :.1f }} MiB") == []
    assert facts.unsourced("two fp32 states: 4 + 4 = 8 bytes; QLoRA 16x1 on Llama-3.1-8B, trl 1.16") == []
    wrong = facts.unsourced("4 + 4 + 8 = 20 bytes")
    assert wrong and "does not hold" in wrong[0].context
    assert facts.unsourced('the chapter says "~30% memory reduction"') == []  # a quote the chapter holds
    assert [u.number for u in facts.unsourced('the chapter says "~35% memory reduction"')] == ["~35%"[:3]]


def test_a_placeholder_follows_its_source(monkeypatch):
    m = facts.ref("QLoRA 16x1")
    text = "{{ ref('QLoRA 16x1').cuda_max_allocated / GiB :.2f }} GiB"
    assert facts.render(text) == f"{m.cuda_max_allocated / 2**30:.2f} GiB"
    monkeypatch.setattr(m, "cuda_max_allocated", 2**30 * 3)
    assert facts.render(text) == "3.00 GiB"


def test_library_constants_match_the_installed_libraries():
    import inspect

    from bitsandbytes.optim.optimizer import Optimizer2State, Optimizer8bit

    from course_utils import estimate as E

    init = inspect.getsource(Optimizer2State.init_state)
    assert f"blocksize = {E.BNB_8BIT_BLOCK}" in init
    assert inspect.signature(Optimizer8bit.__init__).parameters  # the class still exists
    from bitsandbytes.optim import AdamW8bit

    assert inspect.signature(AdamW8bit.__init__).parameters["min_8bit_size"].default == E.BNB_MIN_8BIT_SIZE
    assert facts.page_min() == E.BNB_PAGE_MIN


def test_a_pinned_figure_goes_stale_with_its_source(monkeypatch):
    m = facts.ref("QLoRA 16x1")
    now = f"{m.cuda_max_allocated / 2**30:.2f}"
    text = f"it allocated {now}<!--{{{{ ref('QLoRA 16x1').cuda_max_allocated / GiB :.2f }}}}--> GiB"
    assert facts.unsourced(text) == []
    monkeypatch.setattr(m, "cuda_max_allocated", 2**30 * 3)
    assert "stale" in facts.unsourced(text)[0].context


def test_the_8b_reference_runs_are_one_measurement_run():
    """Every ratio the notebooks print between Llama-3.1-8B reference runs is taken within one measurement run."""
    from course_utils.chapter.every_notebook import describe_reference
    from course_utils.results import reference_results

    ms = [m for m in reference_results() if m.recipe["model"] == "llama-3.1-8b"]
    assert len(ms) >= 12 and ms[0].run_id and {m.run_id for m in ms} == {ms[0].run_id}
    assert f"run {ms[0].run_id}" in describe_reference(ms)


def test_paging_pages_nothing_of_lora_and_nearly_all_of_a_full_fine_tune():
    from course_utils.chapter.efficient_optimizers import paging

    text = paging("llama-3.1-8b")
    assert "elements: 0 paged" in text  # every r=16 LoRA tensor is under bitsandbytes' threshold
    full = facts.ref("full FT bf16, ckpt, 1x16, adamw_8bit"), facts.ref("full FT bf16, ckpt, 1x16, paged 8-bit")
    # measured: paged state leaves PyTorch's allocator, the training does not change
    assert full[1].peak_by_category["optimizer"] < full[0].peak_by_category["optimizer"] / 10
    assert full[1].losses == full[0].losses


def test_the_tf32_reference_ships_with_provenance_and_the_text_follows_it():
    import dataclasses

    from course_utils.chapter.mixed_precision import tf32_reference, tf32_summary

    runs = tf32_reference()
    assert sorted(m.label for m in runs) == ["LoRA bf16, no ckpt, 1x16", "LoRA fp32 + TF32, no ckpt, 1x16",
                                             "LoRA fp32, no ckpt, 1x16"]
    for m in runs:  # hardware, versions, command, date, one run
        assert m.env["device_type"] == "cuda" and m.env["versions"]["torch"] and m.fits
        assert m.command.startswith("reference_runs.py --set tf32-llama-3.1-8b") and m.date.startswith("20")
    assert len({m.run_id for m in runs}) == 1
    text = tf32_summary(runs)
    fp32, tf32 = (next(m for m in runs if m.label == name) for name in runs_names())
    assert f"x{tf32.tokens_per_s / fp32.tokens_per_s:.2f} of fp32" in text and "the same bytes" in text
    faster = [dataclasses.replace(m, tokens_per_s=m.tokens_per_s * (3 if m is tf32 else 1)) for m in runs]
    assert f"x{3 * tf32.tokens_per_s / fp32.tokens_per_s:.2f} of fp32" in tf32_summary(faster)
    mixed = [dataclasses.replace(m, run_id="other" if m is tf32 else m.run_id) for m in runs]
    with pytest.raises(ValueError, match="different measurement runs"):
        tf32_summary(mixed)


def runs_names() -> tuple[str, str]:
    return "LoRA fp32, no ckpt, 1x16", "LoRA fp32 + TF32, no ckpt, 1x16"


def test_refresh_rewrites_a_stale_pinned_figure_and_says_which():
    m = facts.ref("QLoRA 16x1")
    now = f"{m.cuda_max_allocated / 2**30:.2f}"
    expr = "{{ ref('QLoRA 16x1').cuda_max_allocated / GiB :.2f }}"
    text, changed = facts.refresh(f"peaked at 1.23<!--{expr}--> GiB")
    assert text == f"peaked at {now}<!--{expr}--> GiB" and changed == [("1.23", now, expr.strip("{} "))]
    assert facts.refresh(text) == (text, []) and not facts.unsourced(text)


def test_the_figures_writer_checks_and_rewrites_a_readme_and_a_notebook(tmp_path, capsys):
    import json
    import runpy
    from pathlib import Path

    script = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "notebooks" / "write_notebooks.py"),
                            run_name="write_notebooks")
    expr = "{{ ref('QLoRA 16x1').cuda_max_allocated / GiB :.2f }}"
    now = f"{facts.ref('QLoRA 16x1').cuda_max_allocated / 2**30:.2f}"
    readme, nb = tmp_path / "README.md", tmp_path / "x.ipynb"
    readme.write_text(f"peaked at 9.99<!--{expr}--> GiB\n")
    cells = [{"cell_type": "markdown", "metadata": {}, "source": [f"peak 9.99<!--{expr}--> GiB\n", "more\n"]},
             {"cell_type": "code", "metadata": {}, "source": ["x = 9.99\n"], "outputs": [], "execution_count": None}]
    nb.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1) + "\n")
    assert script["main"](["figures", str(readme), str(nb), "--check"]) == 1 and "9.99" in readme.read_text()
    assert script["main"](["figures", str(readme), str(nb)]) == 0
    assert readme.read_text() == f"peaked at {now}<!--{expr}--> GiB\n"
    cells = json.loads(nb.read_text())["cells"]
    assert cells[0]["source"] == [f"peak {now}<!--{expr}--> GiB\n", "more\n"] and cells[1]["source"] == ["x = 9.99\n"]
    assert script["main"](["figures", str(readme), str(nb), "--check"]) == 0 and "figures: nothing to change" in capsys.readouterr().out
