"""The memory-against-speed figure as notebooks 03, 07 and 09 draw it (issue 13), from measurements shaped like
theirs (tests/plot_cases.py): arrows join only the steps that add one technique, and this run's ids can be
read in a crowded plot (no overlaps, none nearer another point than its own without a leader line).
tests/test_plots_figure.py checks every label of every panel, notebooks 00-06 too."""

from __future__ import annotations

import itertools
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

import plot_cases  # noqa: E402
from course_utils.show import plots  # noqa: E402
from course_utils.show.placement import overlaps  # noqa: E402
from course_utils.recipe import Recipe  # noqa: E402


@pytest.fixture(scope="module")
def figures():
    """Each case's figure, drawn once."""
    drawn = {}
    yield lambda case: drawn.setdefault(case, plot_cases.draw(case))
    for fig in drawn.values():
        plt.close(fig)


def _arrow_ends(ax):
    return [(tuple(a.xyann), tuple(a.xy)) for a in ax.texts if a.get_gid() == "path-arrow"]


def _xy(m, ax):
    """(tokens/s, peak) of a measurement in the unit of the panel that shows it (MiB or GiB)."""
    return (m.tokens_per_s, m.peak_gib * (1024 if "(MiB" in ax.get_ylabel() else 1))


def _is(p, q):
    return np.allclose(p, q, rtol=1e-9)


@pytest.mark.parametrize("case, apart", [
    ("03-cpu", ["full FT, adamw_torch", "full FT, adamw_8bit"]),
    ("07-cpu", ["source chapter recipe (seq 256)"]),
    ("07-t4", ["source chapter recipe (seq 512)"]),
    ("07-h200", ["source chapter recipe (seq 512)"]),
    ("09-h200", ["fast recipe (16x1)", "fast, embeddings + activations on CPU (16x1)"]),
])
def test_arrows_join_only_the_steps_that_add_one_technique(case, apart, figures):
    mine, _ = plot_cases.CASES[case]()
    ax = figures(case).axes[0]
    ends = _arrow_ends(ax)
    off = [_xy(m, ax) for m in mine if m.label in apart]
    steps = [m for m in mine if m.label not in apart]
    for p in off:  # a full fine-tune or the source recipe: no arrow starts or ends there
        assert not any(_is(p, a) or _is(p, b) for a, b in ends), p
    assert len(ends) == len(steps) - 1
    for (a, b), (m, n) in zip(ends, zip(steps, steps[1:])):  # each arrow: one step to the next, in order
        assert _is(a, _xy(m, ax)) and _is(b, _xy(n, ax))
        assert plots.one_technique(m, n), (m.label, n.label)
    points = [c for c in ax.collections if c.get_gid() == "points"]
    diamonds = [p for c in points if c.get_label().startswith("not a step") for p in c.get_offsets().tolist()]
    np.testing.assert_allclose(sorted(diamonds), sorted(off))  # drawn, with a marker of their own
    key = " ".join(t.get_text() for t in ax.figure.texts if t.get_gid() == "caption").split()
    key = " ".join(key)  # a long item goes on over lines of its own
    assert "\u25c6 not one technique added: no arrow" in key  # the key says what they are


def test_one_technique_is_one_group_of_knobs_and_nothing_else():
    base = plot_cases.make(Recipe(label="a"), 100, 1000)
    step = lambda **changes: plot_cases.make(Recipe(label="b", **changes), 90, 900)  # noqa: E731
    assert plots.one_technique(base, step(gradient_checkpointing=True))
    assert plots.one_technique(base, step(micro_batch=1, grad_accum=4))  # accumulation: one technique, two knobs
    assert not plots.one_technique(base, step(gradient_checkpointing=True, optimizer="adamw_8bit"))
    assert not plots.one_technique(base, step(lora_r=None))  # a full fine-tune is not a technique added
    assert not plots.one_technique(base, step(learning_rate=1e-3))
    assert not plots.one_technique(base, plot_cases.make(Recipe(label="same"), 90, 900))  # nothing added
    auto = plot_cases.make(Recipe(label="auto", precision="auto", load_in_4bit=True), 60, 800)  # fp32 on a CPU
    assert plots.one_technique(base, auto)
    ddp = plot_cases.make(Recipe(label="2 processes"), 100, 1800)
    ddp.gpus, ddp.strategy = 2, "ddp"  # notebook 11: one process against two
    assert plots.one_technique(base, ddp)


def test_the_path_goes_on_past_a_point_of_its_own():
    a = plot_cases.make(Recipe(label="baseline"), 100, 1000)
    full = plot_cases.make(Recipe(label="full", lora_r=None), 200, 900)
    b = plot_cases.make(Recipe(label="+ ckpt", gradient_checkpointing=True), 80, 800)
    assert plots.path_steps([a, full, b]) == [True, False, True]
    series = plots.build_series([a, full, b])[0]
    assert series.apart == {"2"}


def _label_boxes(ax, renderer, series_ids):
    """(annotation, box) of the point labels whose text is one of `series_ids` or starts with '<id>. '."""
    out = []
    for t in ax.texts:
        if t.get_gid() != "point-label":
            continue
        key = t.get_text().split(". ", 1)[0]
        if key in series_ids:
            b = Text.get_window_extent(t, renderer)
            out.append((t, (b.x0, b.y0, b.x1, b.y1)))
    return out


def _distance(box, p):
    dx = max(box[0] - p[0], 0.0, p[0] - box[2])
    dy = max(box[1] - p[1], 0.0, p[1] - box[3])
    return (dx * dx + dy * dy) ** 0.5


@pytest.mark.parametrize("case", list(plot_cases.CASES))
def test_this_runs_labels_can_be_read(case, figures):
    """No label overlaps another or a point; a label with no leader line is nearer its own point than any
    other; this run's points are marked by their numbers, named in the key under the axes (one that finds no
    room is said to be not marked)."""
    mine, reference = plot_cases.CASES[case]()
    fig = figures(case)
    ax = fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ids = {str(i) for i in range(1, len(mine) + 1)}
    own = _label_boxes(ax, renderer, ids)
    items = [" ".join(item.split()) for t in fig.texts if t.get_gid() == "caption"
             for item in re.split(r"\n(?! )", t.get_text())]  # an item goes on over lines indented
    unmarked = [i for i in sorted(ids) if i not in {t.get_text() for t, _ in own}]
    for i in unmarked:  # a point on top of another (07-h200: the source recipe under the 4-bit rung) says so
        item = next(item for item in items if item.startswith(f"{i}. {mine[int(i) - 1].label}"))
        assert item.endswith("(not marked)"), item
    assert len(unmarked) <= 1  # every other point of this run is marked on the plot
    everything = [(t, _box(t, renderer)) for t in ax.texts if t.get_gid() in ("point-label", "card-label")]
    for (ta, a), (tb, b) in itertools.combinations(everything, 2):
        assert not overlaps(a, b), f"{ta.get_text()!r} overlaps {tb.get_text()!r}"
    centres = [tuple(p) for c in ax.collections if c.get_gid() == "points"
               for p in ax.transData.transform(c.get_offsets())]
    r = 4 * fig.dpi / 72
    for t, box in own:
        covered = any(overlaps(box, (x - r, y - r, x + r, y + r)) for x, y in centres)
        assert not covered, f"{t.get_text()!r} covers a point"
        if t.arrow_patch is None:  # read without a leader line: it must sit nearest its own point
            p = tuple(ax.transData.transform(t.xy))
            others = [q for q in centres if abs(q[0] - p[0]) + abs(q[1] - p[1]) > 0.5]
            nearest = all(_distance(box, q) > _distance(box, p) for q in others)
            assert nearest, f"{t.get_text()!r} is nearer another point"
    numbered = [t.get_text() in ids for t, _ in own]
    assert all(numbered) or not any(numbered)
    if all(numbered):
        caption = " ".join(" ".join(t.get_text() for t in fig.texts if t.get_gid() == "caption").split())
        assert all(f"{i}. {m.label}" in caption for i, m in enumerate(mine, 1))


def _box(t, renderer):
    b = Text.get_window_extent(t, renderer)
    return (b.x0, b.y0, b.x1, b.y1)


def test_an_arrow_that_would_cross_another_point_is_bent_around_it():
    """Notebook 03 as re-executed on 2026-12-02: the full fine-tune's diamond lay on the straight line from
    step 2 to step 3, which then read as a path through it; the arrow is drawn as an arc instead."""
    import matplotlib.pyplot as plt

    from course_utils.show.path import _passes_over

    base = Recipe(model="tiny", label="baseline")
    a = plot_cases.make(base, 300, 3000)
    full = plot_cases.make(base.with_(lora_r=None, label="full"), 300, 2500)  # halfway, on the line
    b = plot_cases.make(base.with_(gradient_checkpointing=True, label="+ ckpt"), 300, 2000)
    ax = plots.memory_vs_speed([a, full, b], [])
    arrows = [t for t in ax.texts if t.get_gid() == "path-arrow"]
    assert len(arrows) == 1
    style = arrows[0].arrow_patch.get_connectionstyle()
    assert abs(style.rad) >= 0.2, "the arrow from 1 to 3 runs straight over point 2"
    p, q, m = (ax.transData.transform(_xy(x, ax)) for x in (a, b, full))
    assert _passes_over(p, q, m, 9.0)  # the case this test is about: straight, it would cross the diamond
    plt.close(ax.figure)


def test_the_arc_bends_away_from_the_point_it_avoids():
    """The marker sits just below the straight arrow and the axes' middle lies below it too (a reference run far
    down): towards the middle would bend the arc onto the marker; it bends away, upwards."""
    import matplotlib.pyplot as plt

    base = Recipe(model="tiny", label="baseline")
    a = plot_cases.make(base, 300, 3000)
    full = plot_cases.make(base.with_(lora_r=None, label="full"), 298, 2500)  # just below the line
    b = plot_cases.make(base.with_(gradient_checkpointing=True, label="+ ckpt"), 300, 2000)
    low = plot_cases.make(base.with_(label="far below"), 20, 2500)
    ax = plots.memory_vs_speed([a, full, b], [low])
    arrow = next(t for t in ax.texts if t.get_gid() == "path-arrow")
    rad = arrow.arrow_patch.get_connectionstyle().rad
    p, q, m = (ax.transData.transform(_xy(x, ax)) for x in (a, b, full))
    mid = (p + q) / 2
    control = mid + rad * (q - p)[::-1] * (1, -1)  # matplotlib's arc3 control point
    assert abs(rad) >= 0.2 and control[1] > mid[1] > m[1]  # display y grows upwards: the arc above, the marker below
    plt.close(ax.figure)
