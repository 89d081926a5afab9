"""Speeds only as far as they are measured (issue 30): a speed change is stated as an effect only when it is outside
the spread measured in that run (interleaved repeats, the spread shown); otherwise the words are 'no speed difference
measurable here'. Speeds timed once (shipped reference runs) fall back to the labelled run-to-run spread, SPEED_SPREAD.
The quizzes' speed claims follow the same rule."""

from __future__ import annotations

import dataclasses
import json

import pytest

from course_utils import measure as measure_mod
from course_utils.results import ResultStore
from course_utils.show.speeds import NO_DIFFERENCE, SPEED_SPREAD, speed_change, speed_text, speed_words
from course_utils.show.report import describe_change, results_table
from tests.test_results import make


def timed(label: str, *speeds: float, step_spread: float = 0.02):
    """A made-up measurement timed len(speeds) times in one run (its tokens/s their median)."""
    import statistics

    return dataclasses.replace(make(label, tokens_per_s=statistics.median(speeds)), speeds=list(speeds),
                               timing={"timed_steps": 3, "spread": step_spread})


def flat(text: str) -> str:
    return " ".join(text.split())


# --- the rule, on made-up pairs -------------------------------------------------------------------


def test_a_pair_inside_the_measured_spread_is_no_difference():
    before, after = timed("before", 1000.0, 900.0), timed("after", 880.0, 960.0)  # 950 ± 50 against 920 ± 40
    assert speed_change(before, after) is None
    line = flat(describe_change(before, after))
    assert f"speed 950 ± 50 -> 920 ± 40 tokens/s: {NO_DIFFERENCE}" in line, line
    assert "%" not in line.split("speed", 1)[1].split(";")[0].replace("(+", "").replace("(-", "")  # no percentage


def test_a_pair_outside_the_measured_spread_states_the_change_with_the_spread():
    before, after = timed("before", 1000.0, 960.0), timed("after", 700.0, 760.0)  # 980 ± 20 against 730 ± 30
    assert speed_change(before, after) == pytest.approx(730 / 980 - 1)
    line = flat(describe_change(before, after))
    assert "speed 980 ± 20 -> 730 ± 30 tokens/s (-26%, beyond the spread of repeats in this run)" in line, line


def test_a_speed_not_to_be_trusted_is_compared_with_nothing():
    before = timed("before", 1000.0, 960.0)
    shared = dataclasses.replace(timed("after", 80.0, 90.0), timing={"timed_steps": 3, "spread": 0.02, "others": 1})
    assert speed_change(before, shared) is None and speed_change(shared, before) is None  # -91% would be "beyond"
    line = flat(describe_change(before, shared))
    assert ("speed 980 -> 85 tokens/s: no speed difference stated (~ not to be trusted: after: another measurement "
            "ran on this machine at the same time)") in line, line
    assert "%" not in line.split("speed", 1)[1].split(";")[0]


def test_ranges_that_only_just_overlap_are_no_difference():
    before, after = timed("before", 1000.0, 900.0), timed("after", 880.0, 800.0)  # 900-1000 against 800-880
    assert speed_change(before, after) is not None  # apart by 20
    after = timed("after", 910.0, 800.0)  # 800-910 overlaps 900-1000
    assert speed_change(before, after) is None and NO_DIFFERENCE in speed_words(before, after)


def test_a_run_whose_own_steps_were_noisier_widens_its_spread():
    before = timed("before", 1000.0, 990.0, step_spread=0.02)
    after = timed("after", 800.0, 805.0, step_spread=0.48)  # steps apart by 48% (not yet noisy): ± 24% of 802
    assert after.speed_spread == pytest.approx(0.24) and not after.noisy
    assert speed_change(before, after) is None
    assert "802 ± 193" in speed_words(before, after)


def test_speeds_timed_once_fall_back_to_the_labelled_run_to_run_spread():
    before = make("before", tokens_per_s=1000.0)
    for rate in (1000.0 * (1 + SPEED_SPREAD) - 1, 1000.0 * (1 - SPEED_SPREAD) + 1, 1250.0, 850.0):
        line = flat(describe_change(before, make("after", tokens_per_s=rate)))
        assert NO_DIFFERENCE in line and "timed once each; runs of one recipe differ by up to ±30%" in line, line
    line = flat(describe_change(before, make("after", tokens_per_s=500.0)))
    assert "speed 1,000 -> 500 tokens/s (-50%; timed once each, beyond the ±30%" in line
    # one side repeated, the other not: judged as timed once
    assert "timed once each" in speed_words(timed("a", 1000.0, 990.0), make("b", tokens_per_s=980.0))


def test_the_spread_is_shown_next_to_the_speed():
    assert speed_text(timed("x", 400.0, 424.0)) == "412 ± 12 tokens/s"
    assert speed_text(make("x", tokens_per_s=412.0)) == "412 tokens/s (timed once)"
    table = results_table([timed("a", 400.0, 424.0), make("b", tokens_per_s=300.0)])
    text, page = str(table), table._repr_html_()
    assert "412 ± 12" in text and "412 ± 12" in page and "interleaved timings" in text
    assert table.to_frame()["tokens/s"].tolist() == [412.0, 300.0]  # the numbers stay numbers


def test_the_figure_draws_the_spread_of_a_repeated_speed_and_says_what_it_is():
    import matplotlib

    matplotlib.use("Agg")
    from course_utils.chapter.every_notebook import technique_figure

    fig = technique_figure([timed("a", 400.0, 424.0), make("b", tokens_per_s=300.0)])
    ax = fig.axes[0]
    bars = [c for c in ax.collections if c.get_gid() == "speed-spread"]
    assert len(bars) == 1  # the repeated speed only
    (segment,) = bars[0].get_segments()
    assert [round(x) for x in segment[:, 0]] == [400, 424]  # 412 ± 12
    assert any("spread over its repeats in this run" in t.get_text() for t in fig.texts + ax.texts)
    matplotlib.pyplot.close(fig)


def test_a_spread_bar_stays_inside_the_axes():
    """The fastest point's bar reaches past the point itself: the x axis makes room for it (notebook 01's figure
    cut its baseline's bar at the frame, 2026-12-03)."""
    import matplotlib

    matplotlib.use("Agg")
    from course_utils.chapter.every_notebook import technique_figure

    fig = technique_figure([timed("a", 2800.0, 3900.0), timed("b", 2600.0, 3100.0)])
    ax = fig.axes[0]
    ends = [seg[:, 0].max() for c in ax.collections if c.get_gid() == "speed-spread" for seg in c.get_segments()]
    assert ends and max(ends) < ax.get_xlim()[1], (ends, ax.get_xlim())
    matplotlib.pyplot.close(fig)


def test_the_h200_liger_step_is_not_called_a_speed_effect():
    """Notebook 09's '+ Liger kernels' at 1 x 16: +25% in one explore run, slower than its source in the peer run."""
    from course_utils.chapter import beyond_the_recipe as beyond
    from course_utils.chapter import toward_the_limit

    reference = toward_the_limit.shipped_runs("llama-3.1-8b", "explore")
    found = beyond.by_label(reference)
    assert NO_DIFFERENCE in flat(describe_change(found["+ embeddings on CPU"], found["+ Liger kernels"]))


def test_the_closing_cells_say_the_same_of_this_machines_speed():
    """Notebooks 01, 02 and 05 close with this run's change: within the repeats' spread it is no effect."""
    from course_utils.chapter import gradient_accumulation, gradient_checkpointing, qlora_4bit

    before = timed("before", 1000.0, 940.0)
    noise, real = timed("after", 1010.0, 930.0), timed("after", 400.0, 420.0)
    reference = (make("ref a", tokens_per_s=1000.0), make("ref b", tokens_per_s=500.0))
    for close in (lambda a: gradient_checkpointing.closing_01(before, a, reference, "tiny"),
                  lambda a: gradient_accumulation.closing_02(before, a, reference + reference[:1]),
                  lambda a: qlora_4bit.closing_05(before, a, reference)):
        assert f"970 ± 30 -> 970 ± 40 tokens/s: {NO_DIFFERENCE}" in flat(close(noise))
        assert "970 ± 30 -> 410 ± 10 tokens/s (-58%" in flat(close(real))


# --- the repeats: interleaved, in the same run ------------------------------------------------------


def _stub_timing(order: list, rates: dict):
    """A stand-in for one more timing run: records the recipe it timed, returns the next rate for it."""
    def once(recipe, isolate, progress):
        order.append(recipe.label)
        return dataclasses.replace(make(recipe.label, tokens_per_s=rates[recipe.label].pop(0)),
                                   timing={"timed_steps": 3, "spread": 0.01})
    return once


def test_time_again_times_in_reverse_order_and_records_every_timing(monkeypatch, tmp_path):
    order = []
    rates = {"A": [110.0], "B": [190.0], "C": [330.0]}
    monkeypatch.setattr(measure_mod, "_time_once", _stub_timing(order, rates))
    first = [make(label, tokens_per_s=rate) for label, rate in (("A", 100.0), ("B", 200.0), ("C", 300.0))]
    store = ResultStore(tmp_path / "results.jsonl")
    again = measure_mod.time_again(first, store=store, progress=False)
    assert order == ["C", "B", "A"]  # measured A, B, C: timed again C, B, A
    assert [m.speeds for m in again] == [[100.0, 110.0], [200.0, 190.0], [300.0, 330.0]]
    assert [m.tokens_per_s for m in again] == [105.0, 195.0, 315.0]
    assert [m.label for m in store.load()] == ["A", "B", "C"]  # stored again, with their speeds
    assert store.load()[1].speeds == [200.0, 190.0]


def test_time_again_leaves_alone_what_it_cannot_time_and_what_the_store_already_repeated(monkeypatch, tmp_path):
    order = []
    monkeypatch.setattr(measure_mod, "_time_once", _stub_timing(order, {"A": [100.0]}))
    oom = make("B", status="does_not_fit")
    got = measure_mod.time_again([make("A"), oom], store=ResultStore(tmp_path / "r.jsonl"), progress=False)
    assert order == ["A"] and got[1] is oom
    stored = dataclasses.replace(timed("A", 100.0, 110.0), cached=True)
    assert measure_mod.time_again([stored], store=ResultStore(tmp_path / "r.jsonl"), progress=False) == [stored]
    assert order == ["A"]  # read back with its repeats: not timed again


def test_run_ladder_times_the_last_rungs_again_after_the_ladder(monkeypatch, tmp_path):
    order = []

    def measure_stub(recipe, **how):
        order.append(("ladder", recipe.label))
        return measure_mod._as_asked(make(recipe.label, tokens_per_s=100.0), recipe)

    def once(recipe, isolate, progress):
        order.append(("again", recipe.label))
        return make(recipe.label, tokens_per_s=120.0)

    monkeypatch.setattr(measure_mod, "measure", measure_stub)
    monkeypatch.setattr(measure_mod, "_time_once", once)
    from course_utils.recipe import Recipe

    rungs, _ = measure_mod.run_ladder(Recipe(), through="+ accumulation (micro-batch 1)", progress=False,
                                      store=ResultStore(tmp_path / "r.jsonl"), repeat_last=2)
    names = ["baseline (LoRA, fp32)", "+ gradient checkpointing", "+ accumulation (micro-batch 1)"]
    assert order == [("ladder", n) for n in names] + [("again", names[2]), ("again", names[1])]
    assert [len(m.speeds) for m in rungs] == [0, 2, 2] and rungs[2].tokens_per_s == 110.0


# --- the quizzes: the same rule ---------------------------------------------------------------------

# Every speed comparison a quiz states between two shipped reference runs (timed once each, so judged by the
# fallback spread): (question id, before, after, model, what the quiz says: "changed" or "no difference").
QUIZ_SPEED_CLAIMS = (
    ("01-speed-cost", "LoRA bf16, no ckpt, 1x16, adamw_torch", "LoRA bf16, ckpt, 1x16, adamw_torch", "llama-3.1-8b",
     "changed"),
    ("02-speed-cost", "source chapter recipe (QLoRA 1x16)", "QLoRA 16x1", "llama-3.1-8b", "changed"),
    ("03 paging", "LoRA bf16, ckpt, 1x16, adamw_8bit", "LoRA bf16, ckpt, 1x16, paged 8-bit", "llama-3.1-8b",
     "no difference"),
    ("03 paging", "LoRA bf16, ckpt, 1x16, adamw_8bit", "LoRA bf16, ckpt, 1x16, paged 8-bit", "llama-2-13b",
     "no difference"),
    ("04 bf16", "LoRA fp32, no ckpt, 1x16 (baseline)", "LoRA bf16, no ckpt, 1x16, adamw_torch", "llama-3.1-8b",
     "changed"),
    ("06 shorter sequences", "source chapter recipe (QLoRA 1x16)", "QLoRA 4x4", "llama-3.1-8b", "changed"),
    ("06 12 GiB", "source chapter recipe (QLoRA 1x16)", "QLoRA 16x1", "llama-3.1-8b", "changed"),
    ("07 4x4", "source chapter recipe (QLoRA 1x16)", "QLoRA 4x4", "llama-3.1-8b", "changed"),
)


@pytest.mark.parametrize("question, before, after, model, said", QUIZ_SPEED_CLAIMS)
def test_the_quizzes_state_a_speed_change_only_where_the_rule_does(question, before, after, model, said):
    from course_utils.results import reference_results

    ref = {m.label: m for m in reference_results() if m.recipe.get("model") == model}
    change = speed_change(ref[before], ref[after])
    assert (change is not None) == (said == "changed"), (question, speed_words(ref[before], ref[after]))


def test_the_quizzes_compare_speeds_only_where_the_claims_above_are_checked():
    """A quiz that names two reference runs' tokens/s in one choice is in QUIZ_SPEED_CLAIMS (or compares a
    single run's figure, or the TF32 set, checked below)."""
    import re
    from pathlib import Path

    from course_utils.chapter.figures import registry

    figures = registry()  # a quiz names a figure ({{ ref_qlora_4x4_tokens_per_s }}); its expression says which run
    expand = lambda text: re.sub(r"\{\{\s*([a-z][a-z0-9_]*)",  # noqa: E731
                                 lambda g: "{{ " + (figures[g[1]].expr if g[1] in figures else g[1]), text)
    checked = {(b, a) for _, b, a, _, _ in QUIZ_SPEED_CLAIMS} | {(a, b) for _, b, a, _, _ in QUIZ_SPEED_CLAIMS}
    unchecked, compared = [], 0
    for bank in sorted(Path("quizzes").glob("*.yaml")):
        for block in re.split(r"\n\s*- (?:text|id|answer):", bank.read_text(encoding="utf-8")):
            named = re.findall(r"ref\('([^']+)'[^)]*\)\.tokens_per_s", expand(block))
            pairs = {(x, y) for x in named for y in named if x != y}
            compared += bool(pairs)
            if pairs and not pairs & checked:
                unchecked.append((bank.name, sorted(set(named))))
    assert compared >= 10 and not unchecked, (compared, unchecked)


def test_the_tf32_quiz_speed_claims_follow_the_rule():
    """04-tf32: 'Speed only' (TF32 against fp32: a change) and bf16 'about the speed' of TF32 (no difference)."""
    from course_utils.chapter.mixed_precision import tf32_run

    assert speed_change(tf32_run("fp32"), tf32_run("tf32")) is not None
    assert speed_change(tf32_run("tf32"), tf32_run("bf16")) is None


def test_the_notebook_09_and_10_quiz_speed_claims_follow_the_rule():
    """Bank 10: torch.compile made no speed difference measurable (one run each); against Unsloth, our 1 x 16
    recipe was slower and the 16 x 1 one no measurably different."""
    from course_utils.chapter.facts import beyond_run, peer

    def run(label, ran):
        return beyond_run(label, ran)

    for plain, compiled in (("fast recipe (16x1)", "fast + torch.compile"),
                            ("lean recipe (4x4)", "lean + torch.compile")):
        assert speed_change(run(plain, "explore"), run(compiled, "explore")) is None
    theirs = {b: make(f"unsloth {b}", tokens_per_s=float(peer(b).tokens_per_s)) for b in ("1x16", "16x1")}
    assert speed_change(theirs["1x16"], run("+ Liger kernels", "peer-run")) < 0
    assert speed_change(theirs["16x1"], run("fast, embeddings + activations on CPU (16x1)", "peer-run")) is None


def test_old_records_without_speeds_stay_readable_and_bad_speeds_are_refused():
    from course_utils.results import Measurement, ResultLineError

    old = json.loads(make("old").to_json())
    del old["speeds"]
    assert Measurement.from_dict(old).speeds == [] and Measurement.from_dict(old).speed_spread is None
    with pytest.raises(ResultLineError, match="speeds"):
        Measurement.from_dict({**old, "speeds": [100.0, -1.0]})


# What each notebook compares is timed again in it (its measuring cells): notebook -> the calls that do it
TIMED_AGAIN = {"00_where_memory_goes": ["time_again(["], "01_gradient_checkpointing": ["repeat_last=2"],
               "02_gradient_accumulation": ["repeat_last=2"],
               "03_efficient_optimizers": ["repeat_last=3", "time_again("],
               "04_mixed_precision": ["time_again("], "05_qlora_4bit": ["repeat_last=2"]}


@pytest.mark.parametrize("name", sorted(TIMED_AGAIN))
def test_the_notebooks_time_the_speeds_they_compare_again(name):
    from pathlib import Path

    cells = json.loads(Path(f"notebooks/{name}.ipynb").read_text(encoding="utf-8"))["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert all(call in code for call in TIMED_AGAIN[name]), (name, TIMED_AGAIN[name])
