"""The memory-against-speed figure as notebooks 00-06 draw it (their shipped reference runs, read from each
notebook's own reference_points call, beside the CPU figures of their committed outputs), notebooks 07 and 09's
cases and a synthetic crowded case: the learner's run and the reference in panels of their own, no label over
another label, a point or a card's line (text extents read from the Agg renderer), and a size that fits
JupyterLab at 1366 x 768 with the file browser open."""

from __future__ import annotations

import io
import itertools
import struct

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

import plot_cases  # noqa: E402
from course_utils.show import plots  # noqa: E402

CASES = [*plot_cases.NOTEBOOKS, "crowded", *plot_cases.CASES]


@pytest.fixture(scope="module")
def figures():
    drawn = {}

    def get(case):
        if case not in drawn:
            drawn[case] = plot_cases.draw(case)
            drawn[case].canvas.draw()
        return drawn[case]

    yield get
    for fig in drawn.values():
        plt.close(fig)


def _box(artist, renderer):
    b = Text.get_window_extent(artist, renderer) if isinstance(artist, Text) else artist.get_window_extent(renderer)
    return (b.x0, b.y0, b.x1, b.y1)


def _overlaps(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _panels(fig):
    return [ax for ax in fig.axes if any(c.get_gid() == "points" for c in ax.collections)]


def problems(fig) -> list[str]:
    """Every label (a point's id, a card's name) that overlaps another label, a point's marker or a card's line,
    or lies outside its axes; every key text that overlaps another or an axes."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    out = []
    labels = [(ax, t) for ax in _panels(fig) for t in ax.texts if t.get_gid() in ("point-label", "card-label")]
    boxes = [(t, _box(t, renderer)) for _, t in labels]
    for (ta, a), (tb, b) in itertools.combinations(boxes, 2):
        if _overlaps(a, b):
            out.append(f"label {ta.get_text()!r} overlaps label {tb.get_text()!r}")
    for ax, t in labels:
        box, frame = _box(t, renderer), _box(ax, renderer)
        if not (frame[0] <= box[0] and box[2] <= frame[2] and frame[1] <= box[1] and box[3] <= frame[3]):
            out.append(f"label {t.get_text()!r} is outside its axes")
        for c in ax.collections:
            if c.get_gid() != "points":
                continue
            r = (max(c.get_sizes()) ** 0.5 / 2 + c.get_linewidth()[0] / 2) * fig.dpi / 72  # half a marker, in pixels
            for x, y in ax.transData.transform(c.get_offsets()):
                if _overlaps(box, (x - r, y - r, x + r, y + r)):
                    out.append(f"label {t.get_text()!r} overlaps a point at ({x:.0f}, {y:.0f}) px")
        for line in ax.lines:
            if line.get_gid() == "card-line":
                y = ax.transData.transform((0, line.get_ydata()[0]))[1]
                half = line.get_linewidth() * fig.dpi / 72 / 2
                if box[1] < y + half and y - half < box[3]:
                    out.append(f"label {t.get_text()!r} overlaps the card line at {line.get_ydata()[0]:g} GiB")
    keys = [_box(t, renderer) for t in fig.texts if t.get_gid() == "caption"]
    for a, b in itertools.combinations(keys, 2):
        if _overlaps(a, b):
            out.append("two key texts overlap")
    for k in keys:
        for ax in fig.axes:
            if _overlaps(k, _box(ax, renderer)) or _overlaps(k, _box(ax.xaxis.label, renderer)):
                out.append("a key text overlaps an axes or its label")
    return out


def png_size(fig) -> tuple[int, int]:
    """The pixel size of the PNG the inline backend shows: savefig at the figure's dpi, bbox_inches="tight"."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    return struct.unpack(">II", buffer.getvalue()[16:24])


@pytest.mark.parametrize("case", CASES)
def test_no_label_overlaps_a_label_a_point_or_a_card_line(case, figures):
    fig = figures(case)
    assert problems(fig) == []
    assert [t for ax in _panels(fig) for t in ax.texts if t.get_gid() == "point-label"]  # labels were checked


@pytest.mark.parametrize("case", CASES)
def test_the_figure_fits_jupyterlab_at_1366_by_768(case, figures):
    width, height = png_size(figures(case))
    assert width <= 900 and height <= 520, (width, height)


@pytest.mark.parametrize("case", CASES)
def test_the_learners_run_and_the_reference_each_have_a_panel(case, figures):
    mine, reference = (plot_cases.NOTEBOOKS.get(case) or plot_cases.CASES.get(case) or plot_cases.crowded)()
    left, right = _panels(figures(case))
    assert left.get_title(loc="left").startswith("Your run: ")
    assert right.get_title(loc="left").startswith("Reference (shipped): ")
    assert sum(len(c.get_offsets()) for c in left.collections if c.get_gid() == "points") == \
        sum(1 for m in mine if m.fits and m.tokens_per_s)
    assert sum(len(c.get_offsets()) for c in right.collections if c.get_gid() == "points") == len(reference)
    unit = "MiB" if max(m.peak_gib for m in mine) < 1 else "GiB"  # each panel in its own unit
    assert f"({unit}" in left.get_ylabel() and "(GiB" in right.get_ylabel()


@pytest.mark.parametrize("case", ["00", "03", "crowded"])
def test_every_point_is_marked_or_its_key_says_it_is_not(case, figures):
    fig = figures(case)
    key = "\n".join(t.get_text() for t in fig.texts if t.get_gid() == "caption").splitlines()
    for ax in _panels(fig):
        ids = {t.get_text() for t in ax.texts if t.get_gid() == "point-label"}
        n = sum(len(c.get_offsets()) for c in ax.collections if c.get_gid() == "points")
        named = [k for k in key if k.split(". ", 1)[0] in ids]
        unmarked = [k for k in key if k.endswith("(not marked)") and k.split(". ", 1)[0] not in ids]
        assert len(ids) + len(unmarked) >= n and len(named) == len(ids)


def test_the_check_finds_a_label_over_a_label_a_point_and_a_card_line():
    """problems() is the test: it must see each kind of overlap it is there to catch."""
    fig = plot_cases.draw("00")
    assert problems(fig) == []
    ax = _panels(fig)[1]
    label = next(t for t in ax.texts if t.get_gid() == "point-label")
    ax.annotate("X", label.xy, xytext=label.xyann, textcoords="offset points", ha=label.get_ha(),
                va=label.get_va(), fontsize=plots.FONT_PT, gid="point-label")
    assert any("overlaps label" in p for p in problems(fig))
    ax.texts[-1].remove()
    ax.annotate("Y", label.xy, ha="center", va="center", fontsize=plots.FONT_PT, gid="point-label")
    assert any("overlaps a point" in p for p in problems(fig))
    ax.texts[-1].remove()
    ax.annotate("Z", (ax.get_xlim()[1] / 2, 16.0), ha="center", va="center", fontsize=plots.FONT_PT,
                gid="point-label")
    assert any("card line at 16 GiB" in p for p in problems(fig))
    plt.close(fig)
