"""A speed change of one run each is called an effect only beyond the run-to-run spread (issue 29, finding C18):
describe_change prints "+35%" only when one run each can show it."""

from __future__ import annotations

import dataclasses

from course_utils.results import SPEED_SPREAD
from course_utils.show.report import describe_change
from tests.test_results import make


def test_a_change_within_the_spread_is_no_effect():
    before = make("before", tokens_per_s=1000.0)
    for rate in (1000.0 * (1 + SPEED_SPREAD) - 1, 1000.0 * (1 - SPEED_SPREAD) + 1, 1250.0, 850.0):
        line = " ".join(describe_change(before, make("after", tokens_per_s=rate)).split())
        assert "speed within run-to-run spread (±30%)" in line, line
        assert "speed +" not in line and "speed -" not in line


def test_a_change_beyond_the_spread_is_shown():
    before = make("before", tokens_per_s=1000.0)
    assert "speed +69%" in describe_change(before, make("after", tokens_per_s=1690.0))
    assert "speed -50%" in describe_change(before, make("after", tokens_per_s=500.0))


def test_a_run_whose_own_steps_were_noisier_widens_the_spread():
    before = make("before", tokens_per_s=1000.0)
    after = dataclasses.replace(make("after", tokens_per_s=1690.0), timing={"spread": 0.8, "timed_steps": 3})
    line = " ".join(describe_change(before, after).split())
    assert "within run-to-run spread (±80%)" in line and "+69%" not in line


def test_the_h200_liger_step_is_not_called_a_speed_effect():
    """Notebook 09's '+ Liger kernels' at 1 x 16: +25% in one explore run, slower than its source in the peer run."""
    from course_utils.chapter import beyond_the_recipe as beyond
    from course_utils.chapter import toward_the_limit

    reference = toward_the_limit.shipped_runs("llama-3.1-8b", "explore")
    found = beyond.by_label(reference)
    line = " ".join(describe_change(found["+ embeddings on CPU"], found["+ Liger kernels"]).split())
    assert "within run-to-run spread" in line


def test_the_closing_cells_say_the_same_of_this_machines_speed():
    """Notebooks 01, 02 and 05 close with this run's change: a CPU's +35% is no effect to report."""
    from course_utils.chapter import every_notebook as L
    from course_utils.chapter import gradient_accumulation
    from course_utils.chapter import gradient_checkpointing
    from course_utils.chapter import qlora_4bit

    before = make("before", tokens_per_s=1000.0)
    noise, real = make("after", tokens_per_s=1250.0), make("after", tokens_per_s=400.0)
    reference = (make("ref a", tokens_per_s=1000.0), make("ref b", tokens_per_s=500.0))
    for close in (lambda a: gradient_checkpointing.closing_01(before, a, reference, "tiny"), lambda a: gradient_accumulation.closing_02(before, a, reference + reference[:1]),
                  lambda a: qlora_4bit.closing_05(before, a, reference)):
        assert "speed within run-to-run spread (±30%)" in " ".join(close(noise).split())
        assert "speed -60%" in " ".join(close(real).split())
