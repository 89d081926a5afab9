"""The budget planner: budgets, what fits, the pick, the margin against the reference runs, `course plan`."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from course_utils.models import PRESETS
from course_utils.results import all_reference_results

GIB = 2**30


@pytest.mark.parametrize("text,expected", [
    ("16GiB", 16 * GIB), ("16GB", 16 * 10**9), ("8GiB", 8 * GIB), ("14.7GiB", int(14.7 * GIB)),
    (" 8 gib ", 8 * GIB), ("8000MiB", 8000 * 2**20),
])
def test_parse_budget(text, expected):
    from course_utils.estimate.plan import parse_budget

    assert parse_budget(text) == expected


@pytest.mark.parametrize("text", ["16", "16XB", "sixteen GiB", "", "-5GiB", "0GiB", "16 GiB of memory"])
def test_bad_budget_names_the_input(text):
    from course_utils.estimate.plan import BudgetError, parse_budget

    with pytest.raises(BudgetError) as info:
        parse_budget(text)
    assert repr(text) in str(info.value)


@pytest.fixture(scope="module")
def plan_16():
    from course_utils.estimate.planner import plan

    return plan("llama-3.1-8b", "16GiB")


def test_candidate_grid():
    from course_utils.estimate.plan import EFFECTIVE_BATCH, candidate_recipes

    grid = candidate_recipes("llama-3.1-8b")
    # notebook 09's changes on the 30 4-bit ones: 24 combinations with checkpointing (32, less the 8 with Liger and
    # compiled layers, which refuse each other), 8 without (reentrant checkpointing and compiled layers need it)
    assert len(grid) == len({r.key for r in grid}) == 90 + 15 * 24 + 15 * 8
    assert all(r.gradient_checkpointing for r in grid if r.reentrant_checkpointing)
    assert len(candidate_recipes("llama-3.1-8b", tuned=False)) == 90
    assert len(candidate_recipes("llama-3.1-8b", precision="fp16")) == 90  # no upcast-free recipes in fp16
    assert all(r.effective_batch == EFFECTIVE_BATCH and r.max_seq_length == 512 for r in grid)
    assert not any(r.load_in_4bit and not r.uses_lora for r in grid)
    assert {r.optimizer for r in grid} == {"adamw_torch", "adamw_8bit", "paged_adamw_8bit"}


def test_pick_fits_with_the_margin_and_is_the_fastest(plan_16):
    from course_utils.estimate.plan import MARGIN_FACTOR, MARGIN_GIB

    pick = plan_16.pick
    assert pick is not None and pick.fits
    assert pick.needed == int(pick.estimate.peak_bytes * MARGIN_FACTOR + MARGIN_GIB * GIB)
    assert pick.needed <= plan_16.budget == 16 * GIB
    assert pick.speed.tokens_per_s == max(r.speed.tokens_per_s for r in plan_16.rows if r.fits)
    for r in plan_16.rows:
        assert r.fits == (r.needed <= plan_16.budget)
    assert any(not r.fits for r in plan_16.rows)


def test_speed_is_measured_where_a_reference_run_exists(plan_16):
    from course_utils.recipe import source_chapter_recipe

    source = source_chapter_recipe("llama-3.1-8b")
    row = next(r for r in plan_16.rows if r.recipe.with_(label="").describe() == source.describe())
    assert row.speed.measured and row.speed.basis.startswith("measured")
    from course_utils.chapter.facts import ref

    assert row.speed.tokens_per_s == ref("source chapter recipe (QLoRA 1x16)").tokens_per_s
    modelled = [r for r in plan_16.rows if not r.speed.measured]
    assert modelled and all(r.speed.tokens_per_s > 0 for r in modelled)
    assert all(r.speed.basis.startswith(("model:", "measured with", "measured (")) or "without the changes" in
               r.speed.basis for r in modelled)


def test_plan_text_names_the_rule_and_the_pick(plan_16):
    text = " ".join(plan_16.format().split())  # the text is wrapped at 100 characters
    assert "x 1.15 + 0.75 GiB" in text and "Pick (*)" in text
    assert "measured" in text and "model:" in text


def test_plan_is_a_table_within_100_characters(plan_16):
    from course_utils.estimate.planner import plan
    from course_utils.show.tables import WIDTH

    for p, show in ((plan_16, None), (plan_16, 6), (plan("llama-3.1-8b", hardware="t4"), 4),
                    (plan("llama-3.1-8b", "4GiB"), None)):
        text = p.format(show=show)
        assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    table = plan_16.table(show=6)
    assert len(table.rows) == 6 and [r[0] for r in table.rows].count("*") == 1
    html = table._repr_html_()
    assert "<table" in html and "estimate (GiB)" in html and "Pick (*)" in html
    # what every shown recipe shares is said once, above the table; the rows name the rest
    assert "Every recipe below: 4-bit NF4 +DQ, LoRA r=16, bf16, ckpt" in " ".join(table.title.split())
    assert all("LoRA r=16" not in r[1] for r in table.rows)


def test_shipped_checks_is_a_table_within_100_characters():
    from course_utils.chapter.complete_recipe import checks_table, shipped_checks
    from course_utils.show.tables import WIDTH

    text = shipped_checks("llama-3.1-8b")
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    table = checks_table("llama-3.1-8b")
    assert [r[-1] for r in table.rows].count("does not fit, source recipe") == 1
    assert "<table" in table._repr_html_() and "check_plan.py" in table._repr_html_()
    assert "no planner check ships" in shipped_checks("no-such-model")


def test_budget_too_small_gives_a_clear_message(capsys):
    from course_utils.cli import main
    from course_utils.estimate.planner import plan

    p = plan("llama-3.1-8b", "4GiB")
    assert p.pick is None and p.fitting == []
    text = " ".join(p.format().split())
    assert "Nothing" in text and "4.00 GiB" in text and "--seq 256" in text
    assert main(["plan", "--model", "llama-3.1-8b", "--budget", "1GiB"]) == 0
    assert "Nothing" in capsys.readouterr().out


def test_8gib_pick_is_the_measured_pick_with_fused_lora_checked_on_the_gpu():
    """8 GiB: the source recipe does not fit (9.44 GiB reserved); notebook 09's changes do. The pick is the pick the
    H200 measured (scripts/gpu/check_plan.py) with fused LoRA, by its factor measured at 8 x 2 in three runs (a pair
    each), and
    check_plan.py's run of that pick (beyond/checks/plan-check-fused) found it fits."""
    from course_utils.chapter.shipped_runs import reference
    from course_utils.estimate.plan import fits_on_card
    from course_utils.estimate.planner import plan

    pick = plan("llama-3.1-8b", "8GiB").pick
    assert pick is not None and not pick.speed.measured
    assert pick.recipe.load_in_4bit and not pick.recipe.prepare_kbit and pick.recipe.offload_embeddings
    assert pick.recipe.fused_lora and not pick.recipe.reentrant_checkpointing
    assert pick.speed.basis.startswith("measured (pick for 8.0 GiB) without fused LoRA; fused LoRA x")
    assert "(measured at micro-batch 8, median of 3 pairs)" in pick.speed.basis
    checked = next(m for m in reference("llama-3.1-8b", "plan-check-fused") if m.label == "pick for 8.0 GiB")
    assert checked.recipe_obj == pick.recipe.with_(label=checked.label, steps=5, warmup_steps=1)
    assert fits_on_card(checked.cuda_max_reserved, 8 * GIB)


def test_t4_plan_uses_fp16_and_its_memory():
    from course_utils.estimate.planner import plan

    p = plan("llama-3.1-8b", hardware="t4")
    assert p.budget == int(14.75 * GIB)  # the T4 profile's card (hardware.PROFILES)
    assert {r.recipe.precision for r in p.rows} == {"fp16"}
    assert p.pick is not None and p.pick.needed <= p.budget


def test_margin_covers_every_reference_run():
    from course_utils.estimate.plan import margin_calibration

    checks = margin_calibration()
    assert len(checks) >= 18
    for c in checks:
        assert c.covered, (c.model, c.label, c.reserved / GIB, c.needed / GIB)


@pytest.mark.parametrize("model", list(PRESETS))
def test_course_plan_every_preset(model, capsys):
    from course_utils.cli import main

    assert main(["plan", "--model", model, "--budget", "16GiB"]) == 0
    assert main(["plan", "--model", model, "--hardware", "t4"]) == 0
    out = capsys.readouterr().out
    assert f"Budget planner: {model}" in out


def test_course_plan_bad_budget_is_an_argument_error(capsys):
    from course_utils.cli import main

    with pytest.raises(SystemExit) as info:
        main(["plan", "--model", "llama-3.1-8b", "--budget", "16XB"])
    assert info.value.code == 2
    assert "'16XB'" in capsys.readouterr().err


def test_course_plan_without_budget_on_a_plain_gpu(capsys):
    from course_utils.cli import main

    assert main(["plan", "--model", "llama-3.1-8b"]) == 2
    assert "budget" in capsys.readouterr().err


def test_check_plan_script_dry_run(capsys):
    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "check_plan.py"
    check = runpy.run_path(str(script), run_name="check_plan")
    assert check["main"](["--model", "llama-3.1-8b", "--budget", "16GiB", "--budget", "4GiB", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "pick" in out and "source" in out and "smallest (nothing fits)" in out


def _run(recipe, tokens_per_s: float, run_id: str):
    from course_utils.results import Measurement

    return Measurement(recipe=recipe.to_dict(), recipe_key=recipe.key, env={"device": "test"}, env_key="e",
                       status="ok", tokens_per_s=tokens_per_s, source="test", run_id=run_id)


def test_a_change_without_a_measured_pair_keeps_the_measured_speed_of_the_rest(plan_16):
    """A tuned recipe starts from the measured recipe with the fewest of its changes left out: fused LoRA, with no
    measured pair for a recipe at sequence 1,024 (every shipped pair is at 512), gets that recipe's speed x1.00."""
    from course_utils.estimate.plan import speed_of

    measured = plan_16.pick.recipe.with_(fused_lora=False, max_seq_length=1024)
    speed = speed_of(measured.with_(fused_lora=True), [_run(measured, 5000.0, "a")])
    assert not speed.measured and speed.tokens_per_s == 5000.0 and "fused LoRA x1.00 (no measured pair)" in speed.basis


def test_a_changes_factor_is_the_median_of_its_pairs_each_measured_in_one_run(plan_16):
    """Each pair's ratio is taken within one run (tokens/s drift between runs and GPUs); the factor is their median
    at the nearest measured micro-batch. A pair across two runs (here 2,000 against 1,000) counts for nothing."""
    from course_utils.estimate.plan import tuning_factor

    plain = plan_16.pick.recipe.with_(fused_lora=False, max_seq_length=1024)
    fused = plain.with_(fused_lora=True)
    refs = [_run(plain, 1000.0, "a"), _run(fused, 1100.0, "a"), _run(plain, 1000.0, "b"), _run(fused, 1200.0, "b"),
            _run(plain, 1000.0, "c"), _run(fused, 2000.0, "d")]
    factor, parts = tuning_factor(fused, refs, knobs=("fused_lora",))
    assert factor == pytest.approx(1.15)
    assert parts == [f"fused LoRA x1.15 (measured at micro-batch {plain.micro_batch}, median of 2 pairs)"]
    assert tuning_factor(fused, refs[4:], knobs=("fused_lora",)) == (1.0, ["fused LoRA x1.00 (no measured pair)"])


def test_the_count_runs_give_the_factors_at_micro_batch_1():
    """At 1 x 16 the pairs are count_launches.py's processes (beyond/tries/counts-*.jsonl; 13 pairs) and the two peer
    runs (beyond/checks/peer1-, peer2-: 2 pairs), each pair from one run: there reentrant checkpointing wins (it loses at 8 x 2 and 16 x 1), and the planner says so."""
    from course_utils.estimate.plan import tuning_factor
    from course_utils.estimate.planner import plan

    refs = [m for m in all_reference_results() if m.fits and m.tokens_per_s]
    pick = plan("llama-3.1-8b", "8GiB").pick.recipe.with_(reentrant_checkpointing=True)
    at_1 = tuning_factor(pick.with_(micro_batch=1, grad_accum=16), refs, knobs=("reentrant_checkpointing",))
    at_8 = tuning_factor(pick, refs, knobs=("reentrant_checkpointing",))
    assert at_1[0] > 1.1 and "measured at micro-batch 1, median of 15 pairs" in at_1[1][0]
    assert at_8[0] < 1 and "measured at micro-batch 8" in at_8[1][0]



def test_compiled_layers_are_priced_against_liger_and_picked_only_where_they_won():
    """Compiled layers take Liger's place (a Recipe refuses both): the planner prices them against the same recipe
    with Liger, from pairs within one run each (run 7's beyond/checks/compiled-peer-*, run 8's count runs): faster at
    1 x 16, slower at 16 x 1. So its picks keep Liger from 8 x 2 up and compile the layers at 7 GiB (4 x 4; README,
    "Compiled layers")."""
    from course_utils.estimate.plan import speed_of, tuning_factor
    from course_utils.estimate.planner import plan

    refs = [m for m in all_reference_results() if m.fits and m.tokens_per_s]
    liger = plan("llama-3.1-8b", "8GiB").pick.recipe
    assert liger.liger_kernels and not liger.compile_layers
    for mb, won in ((1, True), (16, False)):
        compiled = liger.with_(micro_batch=mb, grad_accum=16 // mb, liger_kernels=False, compile_layers=True)
        factor, parts = tuning_factor(compiled, refs, knobs=("compile_layers",))
        assert (factor > 1) == won and parts[0].startswith("compiled layers in place of Liger x")
        assert f"measured at micro-batch {mb}" in parts[0]
        with_liger = speed_of(compiled.with_(liger_kernels=True, compile_layers=False), refs).tokens_per_s
        assert (speed_of(compiled, refs).tokens_per_s > with_liger) == won
    assert plan("llama-3.1-8b", "7GiB").pick.recipe.compile_layers
    assert not plan("llama-3.1-8b", "16GiB").pick.recipe.compile_layers
