"""Plots drawn from synthetic measurements and the shipped reference runs (Agg backend, no training)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from course_utils.show import plots  # noqa: E402
from course_utils.common import GiB
from course_utils.machine import PROFILES  # noqa: E402
from course_utils.show.placement import overlaps  # noqa: E402
from course_utils.show import charts  # noqa: E402
from course_utils.show.charts import memory_breakdown, memory_curves  # noqa: E402
from course_utils.show.plots import ladder_figure, memory_vs_speed, technique_figure
from course_utils.recipe import Recipe  # noqa: E402
from course_utils.common import MiB
from course_utils.results import Measurement, reference_results  # noqa: E402


def make(label, peak_mib, tokens_per_s, status="ok", device="TestCPU", cuda_mib=None, model="tiny",
         **changes) -> Measurement:
    recipe = Recipe(label=label, model=model, **changes)
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
        make("accumulation", 40, 1200.0, gradient_checkpointing=True, micro_batch=1, grad_accum=4),
    ]  # a ladder: each fitting recipe adds one technique to the one before


@pytest.fixture
def h200():
    return _h200()


def _h200():
    """The shipped Llama-3.1-8B reference runs: 13 points, several nearly on top of each other."""
    return [m for m in reference_results() if m.recipe["model"] == "llama-3.1-8b"]


@pytest.fixture
def t4_ladder():
    return _t4_ladder()


def _t4_ladder():
    """A learner's ladder on a T4 (GiB-sized, a log range), with one rung that did not fit; each rung adds one
    technique to the one before (a path of arrows)."""
    t4 = dict(device="Tesla T4", model="smollm2-360m")
    ckpt = dict(gradient_checkpointing=True)
    accum = dict(ckpt, micro_batch=1, grad_accum=4)
    eight = dict(accum, optimizer="adamw_8bit")
    return [make("baseline (LoRA, fp32)", 8050, 8377.0, **t4),
            make("+ gradient checkpointing", 2040, 5830.0, **t4, **ckpt),
            make("+ accumulation (micro-batch 1)", 1633, 1602.0, **t4, **accum),
            make("+ 8-bit AdamW", 1615, 1425.0, **t4, **eight),
            make("full fine-tune", 20000, None, status="does_not_fit", **t4, lora_r=None),
            make("+ 4-bit QLoRA (NF4, double quant)", 620, 1029.0, **t4, **eight, load_in_4bit=True),
            make("+ shorter sequences", 570, 463.0, **t4, **eight, load_in_4bit=True, max_seq_length=128)]


@pytest.fixture(autouse=True)
def close_figures(request):
    before = set(plt.get_fignums())
    yield
    for num in set(plt.get_fignums()) - before:
        plt.close(num)


def _collection(ax, gid):
    return [c for c in ax.collections if c.get_gid() == gid]


def _points(ax):
    offsets = [c.get_offsets() for c in _collection(ax, "points") if len(c.get_offsets())]
    return np.concatenate(offsets) if offsets else np.empty((0, 2))


def _texts(ax, gid=None):
    """The texts of the axes and of its figure (the keys under the panels), of this gid if given."""
    return [t.get_text() for t in ax.texts + ax.figure.texts if gid is None or t.get_gid() == gid]


def _arrows(ax):
    return [(tuple(a.xyann), tuple(a.xy)) for a in ax.texts if a.get_gid() == "path-arrow"]


def _box(artist, renderer):
    b = Text.get_window_extent(artist, renderer) if isinstance(artist, Text) else artist.get_window_extent(renderer)
    return (b.x0, b.y0, b.x1, b.y1)


def test_memory_vs_speed_plots_the_fitting_recipes_in_order_in_mib_under_a_gib(measurements):
    ax = memory_vs_speed(measurements)
    np.testing.assert_allclose(_points(ax), [[2000.0, 100], [1500.0, 70], [1200.0, 40]])
    assert sorted(_texts(ax, "point-label")) == ["1", "2", "3"]  # each point marked by its id
    key = "\n".join(_texts(ax, "caption"))
    for name in ("1. baseline", "2. with checkpointing", "3. accumulation"):
        assert name in key
    assert ax.get_xlabel().startswith("training speed") and "(MiB)" in ax.get_ylabel()
    assert "(GiB)" in memory_vs_speed([make("big", 2048, 100.0)]).get_ylabel()


def test_arrows_follow_the_order_given_and_reference_points_are_not_joined(measurements, h200):
    ax = memory_vs_speed(measurements, h200)
    mine = [(m.tokens_per_s, m.peak_bytes / GiB) for m in measurements if m.fits]
    assert _arrows(ax) == [(a, b) for a, b in zip(mine, mine[1:])]
    reversed_ax = memory_vs_speed(measurements[::-1], h200)
    assert _arrows(reversed_ax) == [(a, b) for a, b in zip(mine[::-1], mine[::-1][1:])]
    assert not [line for line in ax.lines if line.get_gid() not in ("card-line", "baseline-line")]


def test_this_run_and_the_reference_have_panels_of_their_own(measurements, h200):
    fig = technique_figure(measurements, h200)
    mine, ref = fig.axes
    assert mine.get_title(loc="left") == "Your run: tiny on TestCPU"
    assert ref.get_title(loc="left") == "Reference (shipped): llama-3.1-8b on NVIDIA H200"
    assert len(_points(mine)) == 3 and len(_points(ref)) == len(h200)
    (m,), refs = _collection(mine, "points"), _collection(ref, "points")
    assert m.get_paths()[0] != refs[0].get_paths()[0]  # another marker
    assert tuple(m.get_edgecolor()[0]) != tuple(refs[0].get_edgecolor()[0])  # and another colour
    assert "(MiB)" in mine.get_ylabel() and "(GiB)" in ref.get_ylabel()  # each in its own unit
    assert mine.get_legend() is None and ref.get_legend() is None  # the titles and the keys say it all


def test_card_lines_reach_the_smallest_card_that_holds_the_peak(h200, t4_ladder):
    ax = memory_vs_speed([], h200)  # up to 75 GiB: every card
    lines = sorted(line.get_ydata()[0] for line in ax.lines if line.get_gid() == "card-line")
    assert lines == [PROFILES["t4"].card_bytes / GiB, 16.0, 24.0, 80.0]
    names = _texts(ax, "card-label")
    assert names == [f"{name}: {gib:g} GiB" for name, gib in plots.LEARNER_CARDS]
    assert names[0] == "free T4 (Colab): 14.75 GiB"
    small = memory_vs_speed(t4_ladder)  # under 8 GiB: the free T4 holds it all
    assert [line.get_ydata()[0] for line in small.lines if line.get_gid() == "card-line"] == [14.75]
    cpu = memory_vs_speed([make("a", 300, 1000.0), make("b", 60, 900.0)])  # a CPU's MiB: no card says anything
    assert not [line for line in cpu.lines if line.get_gid() == "card-line"]


def test_memory_axis_turns_log_when_the_range_needs_it(measurements, h200, t4_ladder):
    assert memory_vs_speed(measurements).get_yscale() == "linear"  # 40 to 100 MiB
    assert memory_vs_speed(measurements).get_ylim()[0] == 0  # from zero: a saving looks as big as it is
    assert memory_vs_speed(t4_ladder).get_yscale() == "log"  # 0.56 to 14.75 GiB
    assert memory_vs_speed(measurements, h200).get_yscale() == "log"
    assert "log scale" in memory_vs_speed(t4_ladder).get_ylabel()
    lo, hi = memory_vs_speed(t4_ladder).get_ylim()
    assert lo < 570 / 1024 and hi > 14.75  # nothing clipped, the T4's line inside


def test_no_point_is_clipped(h200):
    ax = memory_vs_speed([], [m for m in h200 if m.label.startswith("LoRA bf16, ckpt, 1x16")])
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    for x, y in _points(ax):
        assert x0 < x < x1 and y0 < y < y1


def test_does_not_fit_is_listed_not_plotted(measurements):
    ax = memory_vs_speed(measurements)
    assert 500 not in _points(ax)[:, 1]
    assert [t for t in _texts(ax) if t.startswith("does not fit:")] == ["does not fit: far too big"]
    assert not any("far too big" in t and not t.startswith("does not fit") for t in _texts(ax))


def test_cuda_peak_is_plotted_when_measured():
    ax = memory_vs_speed([make("gpu run", 100, 900.0, cuda_mib=120)])
    assert _points(ax).tolist() == [[900.0, 120]]  # MiB


def _all_text(fig):
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


@pytest.mark.parametrize("kind", ["technique", "ladder", "breakdown", "curves", "loss", "speed only"])
def test_figures_fit_jupyterlab_at_full_size_with_readable_text(kind, measurements, h200, t4_ladder):
    sweep = {"no checkpointing": [make(f"seq={v}", v, 1000.0, max_seq_length=v) for v in (64, 128, 256)]}
    fig = {"technique": lambda: technique_figure(t4_ladder[:3], h200[:3]),
           "ladder": lambda: ladder_figure(t4_ladder, h200),
           "breakdown": lambda: charts.breakdown_figure(measurements[:2], h200[:2]),
           "curves": lambda: charts.curves_figure({"max_seq_length": sweep, "micro_batch": sweep}),
           "loss": lambda: charts.loss_figure(measurements, h200[:2]),
           "speed only": lambda: memory_vs_speed(measurements).figure}[kind]()
    fig.canvas.draw()
    assert fig.get_size_inches()[0] <= 10 and fig.get_size_inches()[0] * fig.dpi <= 1000
    tight = fig.get_tightbbox(fig.canvas.get_renderer())
    assert tight.width <= 10  # what the inline backend's bbox_inches="tight" keeps
    small = [(t.get_text(), t.get_fontsize()) for t in _all_text(fig) if t.get_fontsize() < plots.FONT_PT]
    assert not small


def test_memory_breakdown_stacks_the_categories():
    ms = [make("a", 100, 1.0), make("b", 50, 1.0, micro_batch=2)]
    ax = memory_breakdown(ms)
    widths = {}
    for patch in ax.patches:
        widths.setdefault(round(patch.get_y(), 3), []).append(patch.get_width())
    totals = sorted((sum(w) for w in widths.values()), reverse=True)
    assert totals == pytest.approx([100.0, 50.0])  # MiB: every peak is under 1 GiB
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1. a", "2. b"]
    assert ax.get_xlabel().startswith("MiB")
    assert memory_breakdown([make("big", 40 * 1024, 1.0)]).get_xlabel().startswith("GiB")


def test_memory_breakdown_legend_keeps_off_the_bars():
    ax = memory_breakdown([make("a", 100, 1.0), make("b", 50, 1.0, micro_batch=2)])
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    assert not overlaps(_box(ax.get_legend(), renderer), _box(ax, renderer))


def test_memory_curves_are_linear_with_ticks_at_the_values_swept():
    sweep = {"no checkpointing": [make(f"seq={v}", 0.5 * v, 1000.0, max_seq_length=v) for v in (64, 128, 256, 512)]}
    ax = memory_curves(sweep, "max_seq_length")
    assert ax.get_xscale() == "linear" and ax.get_yscale() == "linear"  # a straight line is linear growth
    assert list(ax.get_xticks()) == [64, 128, 256, 512]
    assert ax.get_xlim()[0] == 0 and ax.get_ylim()[0] == 0


def test_ladder_figure_saves_and_lists_the_misfit(measurements, tmp_path):
    path = tmp_path / "ladder.png"
    fig = ladder_figure(measurements, path=path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    left, right = fig.axes[:2]
    assert len(_points(left)) == 3
    assert "does not fit: far too big" in _texts(left)
    bars = [t.get_text() for t in right.get_yticklabels()]
    assert bars == ["1. baseline", "2. with checkpointing", "3. accumulation"]  # numbered as the points are
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    bars_top = _box(right, renderer)[3] + right.title.get_window_extent(renderer).height
    assert bars_top < min(_box(t, renderer)[1] for t in fig.texts if t.get_gid() == "caption")
    with_reference = ladder_figure(measurements, _h200())  # course run: its ladder beside the shipped runs
    assert [len(_points(ax)) for ax in with_reference.axes[:2]] == [3, len(_h200())]


def test_ladder_figure_without_path_writes_nothing(measurements, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fig = ladder_figure(measurements)
    assert fig is not None
    assert list(tmp_path.iterdir()) == []


def test_notebooks_technique_figure_draws_a_panel_for_each(measurements, h200):
    from course_utils.chapter.every_notebook import technique_figure as notebook_figure

    fig = notebook_figure(measurements + [None], h200, title="every technique so far")
    assert len(fig.axes) == 2 and _texts(fig.axes[0], "title") == ["every technique so far"]
    assert [len(_points(ax)) for ax in fig.axes] == [3, len(h200)]
    alone = notebook_figure(measurements, title="no reference")  # notebook 09: one panel, the figure's width
    assert len(alone.axes) == 1 and alone.axes[0].get_window_extent().width > 0.7 * alone.bbox.width


def test_a_path_step_back_along_the_way_it_came_is_curved():
    """3 -> 4 -> 5 where 5 undoes 4's speed at the same memory: drawn straight, the two arrows read as one
    double-headed arrow; the second is bent (arc3) and labels keep off the curve it draws."""
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.set_xlim(0, 3000)
    ax.set_ylim(0, 1)
    xy = [(2400, 0.8), (1300, 0.2), (1900, 0.2), (1350, 0.2)]
    segments = [[a, b, 0.0, ax.annotate("", xy=b, xytext=a, arrowprops=dict(arrowstyle="-|>"))]
                for a, b in zip(xy, xy[1:])]
    plots.bend_retraced(ax, segments)
    assert [s[2] == 0 for s in segments] == [True, True, False]
    assert segments[2][3].arrow_patch.get_connectionstyle().rad == pytest.approx(segments[2][2], abs=1e-3)
    from course_utils.show.placement import segment_boxes

    ys = [(b[1] + b[3]) / 2 for b in segment_boxes(ax, *xy[2:], rad=segments[2][2])]
    y_line = ax.transData.transform((0, 0.2))[1]
    assert max(ys) - y_line > 8  # the bend goes up, towards the middle of the axes
    plt.close(fig)
