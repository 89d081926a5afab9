"""Plots drawn from synthetic measurements (Agg backend, no training)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from course_utils.plots import ladder_figure, memory_breakdown, memory_vs_speed  # noqa: E402
from course_utils.recipe import Recipe  # noqa: E402
from course_utils.results import MiB, Measurement  # noqa: E402


def make(label, peak_mib, tokens_per_s, status="ok", device="TestCPU", cuda_mib=None, **changes) -> Measurement:
    recipe = Recipe(label=label, **changes)
    by_cat = {"parameters": peak_mib * 0.5 * MiB, "activations": peak_mib * 0.3 * MiB,
              "temporaries": peak_mib * 0.2 * MiB}
    return Measurement(recipe=recipe.to_dict(), recipe_key=recipe.key, env={"device": device}, env_key="e",
                       status=status, peak_bytes=int(peak_mib * MiB), peak_by_category=by_cat,
                       tokens_per_s=tokens_per_s if status == "ok" else None,
                       cuda_max_allocated=int(cuda_mib * MiB) if cuda_mib else None,
                       error="" if status == "ok" else "BudgetExceeded: over the budget")


@pytest.fixture
def measurements():
    return [
        make("baseline", 100, 2000.0),
        make("with checkpointing", 70, 1500.0, gradient_checkpointing=True),
        make("far too big", 500, None, status="does_not_fit", micro_batch=64),
        make("accumulation", 40, 1200.0, micro_batch=1, grad_accum=4),
    ]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def _points(ax):
    offsets = [c.get_offsets() for c in ax.collections if len(c.get_offsets())]
    return np.concatenate(offsets) if offsets else np.empty((0, 2))


def _texts(ax):
    return [t.get_text() for t in ax.texts]


def test_memory_vs_speed_plots_the_fitting_recipes_in_order(measurements):
    ax = memory_vs_speed(measurements)
    pts = _points(ax)
    assert pts.tolist() == [[2000.0, 100.0], [1500.0, 70.0], [1200.0, 40.0]]
    texts = _texts(ax)
    assert "1. baseline" in texts and "2. with checkpointing" in texts and "3. accumulation" in texts
    assert ax.get_xlabel().startswith("training speed") and "MiB" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["this run: TestCPU"]


def test_does_not_fit_is_listed_not_plotted(measurements):
    ax = memory_vs_speed(measurements)
    assert 500.0 not in _points(ax)[:, 1]
    listed = [t for t in _texts(ax) if t.startswith("does not fit:")]
    assert listed == ["does not fit: far too big"]
    assert not any("far too big" in t and not t.startswith("does not fit") for t in _texts(ax))


def test_cuda_peak_is_plotted_when_measured():
    ax = memory_vs_speed([make("gpu run", 100, 900.0, cuda_mib=120)])
    assert _points(ax).tolist() == [[900.0, 120.0]]


def test_reference_points_are_a_second_series(measurements):
    reference = [make("ref a", 300, 9000.0, device="NVIDIA T4"), make("ref b", 200, 8000.0, device="NVIDIA T4")]
    ax = memory_vs_speed(measurements, reference)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["this run: TestCPU", "reference: NVIDIA T4"]
    assert len(_points(ax)) == 5


def test_memory_breakdown_stacks_the_categories():
    ms = [make("a", 100, 1.0), make("b", 50, 1.0, micro_batch=2)]
    ax = memory_breakdown(ms)
    widths = {}
    for patch in ax.patches:
        widths.setdefault(round(patch.get_y(), 3), []).append(patch.get_width())
    totals = sorted((sum(w) for w in widths.values()), reverse=True)
    assert totals == pytest.approx([100.0, 50.0])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1. a", "2. b"]


def test_ladder_figure_saves_and_lists_the_misfit(measurements, tmp_path):
    path = tmp_path / "ladder.png"
    fig = ladder_figure(measurements, path=path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    left, right = fig.axes[:2]
    assert len(_points(left)) == 3
    assert "does not fit: far too big" in _texts(left)
    annotations = [t for t in _texts(left) if not t.startswith("does not fit")]
    assert annotations == ["1", "2", "3"]  # numbers only; the names are on the bars
    bars = [t.get_text() for t in right.get_yticklabels()]
    assert bars == ["1. baseline", "2. with checkpointing", "3. accumulation"]


def test_ladder_figure_without_path_writes_nothing(measurements, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fig = ladder_figure(measurements)
    assert fig is not None
    assert list(tmp_path.iterdir()) == []
