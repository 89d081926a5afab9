"""Plots: memory against speed (every technique so far), and where the bytes went.

One figure the chapter comes back to, one message per panel: the learner's run on the left, the shipped GPU
reference runs on the right, each on its own axes and in its own unit (MiB for the tiny model on a CPU, GiB on
a GPU), with dotted lines through its first point, its baseline. Peak memory (a log scale when the points
span more than LOG_RATIO) against training speed; the learner's recipes joined by arrows in the order they
were added (only a recipe that adds one technique to the arrow's start is a step of that path: a full
fine-tune or the source recipe is a point of its own, a diamond); a noisy speed drawn hollow; the cards
learners have drawn as lines. Each point is marked by its id (numbers for this run, letters for reference
runs) where no label, point or card line is in the way (course_utils.show.placement), and named in a key
under its panel. The figure is FIGURE_IN (see there for the arithmetic: JupyterLab at 1366 x 768 with its
file browser open); no text is below FONT_PT.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from string import ascii_uppercase
from typing import Sequence

from course_utils.show.path import bend_retraced, one_technique, path_steps  # noqa: F401 (one_technique: plots' API too)
from course_utils.common import GiB, MiB
from course_utils.machine import PROFILES
from course_utils.results import Measurement, measured_on
from course_utils.show.charts import FIG_WIDTH_IN, FONT_PT, memory_breakdown, peak_gib, where  # noqa: F401 (plots' API too)
from course_utils.show.placement import (Label, columns, fit_width, place_labels,
                                         place_line_labels, point_boxes, segment_boxes, text_size, wrap)

LOG_RATIO = 20  # an axis turns logarithmic when its largest value is more than this times its smallest

# The cards learners have, as horizontal lines: (name, GiB). The free T4's is the course's T4 profile.
FREE_T4 = ("free T4 (Colab)", PROFILES["t4"].card_bytes / GiB)
CARD_16_GIB = ("V100 16GB, RTX 4080", 16.0)
CARD_24_GIB = ("RTX 3090, RTX 4090", 24.0)
CARD_80_GIB = ("A100 80GB, H100", 80.0)
LEARNER_CARDS = (FREE_T4, CARD_16_GIB, CARD_24_GIB, CARD_80_GIB)

MINE = ("o", "#1f5fa8")  # marker and colour of this run's points
APART = "D"  # marker of this run's points that are not a step of its path (a full fine-tune, the source recipe)
REFERENCE = (("s", "#d9730d"), ("^", "#2a9d4b"), ("D", "#8e44ad"), ("v", "#7f5539"))  # one per model and GPU
MARKER_PT2 = 55  # marker area (points squared)

@dataclass
class Series:
    """Points of one legend entry: this run (a path, numbered) or one reference model and GPU (lettered)."""

    name: str
    marker: str
    color: str
    path: bool
    points: list = field(default_factory=list)  # (id, Measurement) of the recipes that fit and have a speed
    misfits: list = field(default_factory=list)  # labels of the recipes that did not fit
    apart: set = field(default_factory=set)  # ids of this run's points that are not steps of its path

    @property
    def xy(self) -> list[tuple[float, float]]:
        """(tokens/s, GiB) of each point."""
        return [(m.tokens_per_s, peak_gib(m)) for _, m in self.points]


def letters(i: int) -> str:
    """0 -> 'A', 25 -> 'Z', 26 -> 'AA': the ids of reference points."""
    return ascii_uppercase[i] if i < 26 else letters(i // 26 - 1) + ascii_uppercase[i % 26]


def build_series(measurements: Sequence[Measurement], reference: Sequence[Measurement] = ()) -> list[Series]:
    """This run as one numbered path (numbered among the recipes that fit, as the breakdown numbers them; its
    points that do not add one technique to the path in `apart`), then the reference runs, one lettered
    series per model and GPU, in the order given."""
    out = []
    mine = [m for m in measurements if m is not None]
    if mine:
        places = sorted({where(m) for m in mine}, key=[where(m) for m in mine].index)
        out.append(Series("this run: " + "; ".join(places), *MINE, path=True))
        fits = [m for m in mine if m.fits]
        out[0].points = [(str(i), m) for i, m in enumerate(fits, 1) if m.tokens_per_s]
        out[0].misfits = [m.label for m in mine if not m.fits]
        steps = path_steps([m for _, m in out[0].points])
        out[0].apart = {i for (i, _), step in zip(out[0].points, steps) if not step}
    groups: dict[str, Series] = {}
    for m in reference:
        key = where(m)
        if key not in groups:
            marker, color = REFERENCE[len(groups) % len(REFERENCE)]
            groups[key] = Series(f"reference (shipped): {key}", marker, color, path=False)
        if not m.fits:
            groups[key].misfits.append(m.label)
    n = 0
    for m in (m for m in reference if m.fits):
        groups[where(m)].points.append((letters(n), m))
        n += 1
    for s in groups.values():
        s.points = [(i, m) for i, m in s.points if m.tokens_per_s]
    return out + list(groups.values())


def cards_to_draw(peaks: Sequence[float]) -> list[tuple[str, float]]:
    """The learner cards up to the smallest one that holds the largest peak (every card when none does);
    none when every peak is under 1 GiB (a CPU run of the tiny model: a card's line says nothing there)."""
    if not peaks or max(peaks) < 1:
        return []
    out = []
    for card in sorted(LEARNER_CARDS, key=lambda c: c[1]):
        out.append(card)
        if card[1] >= max(peaks):
            break
    return out


def _number(v: float, _pos=None) -> str:
    """Tick text: 0.05, 0.5, 5, 12.5, 50, 5,000."""
    return f"{v:,.0f}" if v >= 10 and v == round(v) else f"{v:.3g}"


def set_scale(axis, values: Sequence[float], linear_headroom: float = 1.15) -> str:
    """Log when the values span more than LOG_RATIO (1-2-5 ticks, plain numbers), else linear from 0.
    Returns 'log' or 'linear'."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    lo, hi = min(values), max(values)
    set_lim = axis.axes.set_ylim if axis.axis_name == "y" else axis.axes.set_xlim
    if lo > 0 and hi / lo > LOG_RATIO:
        axis._set_axes_scale("log")
        set_lim(lo / 1.5, hi * 1.6)
        axis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
        axis.set_minor_locator(NullLocator())
        axis.set_major_formatter(FuncFormatter(_number))
        return "log"
    set_lim(0, hi * linear_headroom if hi > 0 else 1)
    axis.set_major_formatter(FuncFormatter(_number))
    return "linear"


FIGURE_IN = (9.0, 5.2)  # the notebooks' closing figure: 900 x 520 px (technique_figure says why)
_SAVE_PAD_IN = 0.1  # savefig's pad_inches, which the inline backend adds around the tight box
_PAD_IN = 0.05  # between what is drawn and the figure's edge
_GAP_IN = 0.35  # between two panels
KEY_GAP_PX = 14.0  # between the key's columns


@dataclass
class _Panel:
    """One axes of the memory-against-speed figure: its series, unit, cards, path arrows and key."""

    ax: object
    series: list
    unit: str  # "MiB" or "GiB"
    scale: float  # the unit per GiB
    cards: list
    segments: list = field(default_factory=list)
    key: list = field(default_factory=list)  # the Labels of its points, in key order
    span: tuple = (0.0, 0.0)  # its column of the figure, display pixels from the left


def _panel_unit(series: list[Series]) -> tuple[str, float]:
    """MiB when every peak on the panel is under 1 GiB (the tiny model on a CPU: 0.06 GiB reads as 60 MiB)."""
    peaks = [y for s in series for _, y in s.xy]
    return ("GiB", 1.0) if peaks and max(peaks) >= 1 else ("MiB", 1024.0)


def _panel_title(series: list[Series], fallback: str) -> str:
    """'Your run: tiny on CPU' or 'Reference (shipped): llama-3.1-8b on NVIDIA H200'."""
    names = [s.name for s in series]
    if not names:
        return fallback
    if all(n.startswith("this run: ") for n in names):
        return "Your run: " + "; ".join(n[len("this run: "):] for n in names)
    if all(n.startswith("reference (shipped): ") for n in names):
        return "Reference (shipped): " + "; ".join(n[len("reference (shipped): "):] for n in names)
    return "; ".join(names)


def _draw_series(panel: _Panel) -> None:
    """Markers (hollow where the speed is noisy, a diamond for a point that is not a step of the path) and the
    path's arrows. This run's points are drawn over the reference runs'."""
    ax = panel.ax
    for s in panel.series:
        xy = [(x, y * panel.scale) for x, y in s.xy]
        if not xy:
            continue
        z = 4.5 if s.path else 4
        kinds: dict[tuple, list] = {}
        for (i, m), p in zip(s.points, xy):
            kinds.setdefault((i in s.apart, m.noisy), []).append(p)
        for (apart, noisy), pts in kinds.items():
            ax.scatter(*zip(*pts), marker=APART if apart else s.marker, s=MARKER_PT2 * (0.8 if apart else 1),
                       zorder=z, gid="points", label="not a step: " + s.name if apart else s.name,
                       facecolors="white" if noisy else s.color,
                       edgecolors=s.color, linewidths=1.4)
        for (_, m), (x, y) in zip(s.points, xy):  # a speed timed again in this run: its spread, ± half the range
            if m.speed_spread is not None:
                bars = ax.errorbar(x, y, xerr=m.speed_spread * x, fmt="none", ecolor=s.color, elinewidth=1.2,
                                   capsize=3, zorder=z - 0.1)
                for artist in [*bars.lines[1], *bars.lines[2]]:
                    artist.set_gid("speed-spread")
        if s.path:
            on = [p for (i, _), p in zip(s.points, xy) if i not in s.apart]
            for a, b in zip(on, on[1:]):
                arrow = ax.annotate("", xy=b, xytext=a, gid="path-arrow", zorder=3, arrowprops=dict(
                    arrowstyle="-|>", color=s.color, lw=1.2, alpha=0.8, shrinkA=4.5, shrinkB=5.5, mutation_scale=10))
                panel.segments.append([a, b, 0.0, arrow])  # the bend (arc3's rad) is set once the scales are known
        panel.key += [Label(*p, f"{i}. {m.label}", i) for (i, m), p in zip(s.points, xy)]


def _draw_axes(panel: _Panel) -> None:
    """The cards' lines, dotted lines through the panel's first point (its baseline), both scales, labels, grid."""
    ax = panel.ax
    xy = [(x, y * panel.scale) for s in panel.series for x, y in s.xy]
    for name, gib in panel.cards:
        ax.axhline(gib, color="0.45", ls=(0, (5, 3)), lw=0.9, zorder=1, gid="card-line")
    if xy:
        ax.axhline(xy[0][1], color="0.6", ls=":", lw=0.9, zorder=1, gid="baseline-line")
        ax.axvline(xy[0][0], color="0.6", ls=":", lw=0.9, zorder=1, gid="baseline-line")
    yscale = set_scale(ax.yaxis, [y for _, y in xy] + [g for _, g in panel.cards] or [1.0])
    bar_ends = [x * (1 + m.speed_spread) for s in panel.series for (_, m), (x, _) in zip(s.points, s.xy)
                if m.speed_spread is not None]  # a speed's spread bar stays inside the axes
    set_scale(ax.xaxis, [x for x, _ in xy] + bar_ends or [1.0])
    ax.set_xlabel("training speed (tokens/s, after warm-up)", fontsize=FONT_PT + 1)
    ax.set_ylabel(f"peak memory ({panel.unit}" + (", log scale)" if yscale == "log" else ")"), fontsize=FONT_PT + 1)
    ax.tick_params(labelsize=FONT_PT)
    ax.grid(True, alpha=0.25)
    if not xy:
        ax.text(0.5, 0.5, "no recipe here fits\nwith a measured speed", transform=ax.transAxes, ha="center",
                va="center", fontsize=FONT_PT + 1, color="0.4")


def _line_boxes(ax, gids=("card-line", "baseline-line")) -> list:
    """Display boxes (1 px either side) of the axes' lines with these gids (the cards', the baseline's), which
    labels keep off."""
    frame = ax.get_window_extent()
    out = []
    for line in ax.lines:
        if line.get_gid() not in gids:
            continue
        (x0, y0), (x1, y1) = line.get_transform().transform(list(zip(line.get_xdata(), line.get_ydata())))
        if abs(y0 - y1) < 0.5:  # horizontal
            out.append((frame.x0, y0 - 1, frame.x1, y0 + 1))
        else:
            out.append((x0 - 1, frame.y0, x0 + 1, frame.y1))
    return out


def _layout(fig, panels: list[_Panel], title: str, bottom_in: float, renderer, key_height: float) -> None:
    """Place the title and each panel's axes: the axes' labels and ticks fill the panel's column, above
    `key_height` pixels for the keys, everything inside the figure less the inline backend's padding."""
    dpi = fig.dpi
    width, height = fig.bbox.width, fig.bbox.height
    pad = _PAD_IN * dpi
    title_text = next((t for t in fig.texts if t.get_gid() == "title"), None) or fig.text(
        0.5, 1 - pad / height, title, ha="center", va="top", fontsize=FONT_PT + 3, gid="title")
    top = height - pad - text_size(panels[0].ax, title, FONT_PT + 3, renderer)[1] - 6
    spans = [p.span for p in panels]
    bottom = bottom_in * dpi + pad + key_height + (4 if key_height else 0)
    for p, (x0, x1) in zip(panels, spans):
        p.ax.set_position(((x0 + 0.7 * dpi) / width, (bottom + 0.5 * dpi) / height, (x1 - x0 - 0.8 * dpi) / width,
                           (top - bottom - 0.8 * dpi) / height))
    for _ in range(2):  # tick labels change with the axes' size: measure again
        fig.draw_without_rendering()
        boxes = []
        for p, (x0, x1) in zip(panels, spans):
            tight, box = p.ax.get_tightbbox(renderer), p.ax.get_window_extent(renderer)
            boxes.append((box.x0 + x0 - tight.x0, box.y0 + bottom - tight.y0, box.x1 + x1 - tight.x1,
                          box.y1 + top - tight.y1))
        y0, y1 = max(b[1] for b in boxes), min(b[3] for b in boxes)
        for p, b in zip(panels, boxes):
            p.ax.set_position((b[0] / width, y0 / height, (b[2] - b[0]) / width, (y1 - y0) / height))
    title_text.set_x((spans[0][0] + spans[-1][1]) / 2 / width)


def _key_items(panel: _Panel, renderer) -> list[str]:
    """'<id>. <recipe> (notes)' of each point, '(not marked)' added where its id found no room on the plot;
    one wider than the panel's column goes on over lines of its own, indented."""
    width = panel.span[1] - panel.span[0]
    items = [lab.text + ("" if lab.placed else " (not marked)") for lab in panel.key]
    return [wrap(t, width - 25, panel.ax, renderer, FONT_PT).replace("\n", "\n    ") for t in items]


def _key_columns(panel: _Panel, renderer) -> tuple:
    """(the key's columns of items in the panel's column, the key's height in pixels with what did not fit)."""
    ax, width_px = panel.ax, panel.span[1] - panel.span[0]
    cols = columns(_key_items(panel, renderer), width_px, ax, FONT_PT, renderer, KEY_GAP_PX)
    height = text_size(ax, "\n".join(max(cols, key=len)), FONT_PT, renderer)[1] if cols else 0.0
    for extra in (_notes(panel), _misfits(panel)):
        if extra:
            height += 3 + text_size(ax, wrap(extra, width_px, ax, renderer, FONT_PT), FONT_PT, renderer)[1]
    return cols, height


def _notes(panel: _Panel) -> str:
    """What the panel's markers other than its series' own mean, where it has any: a hollow one is a speed not to
    be trusted (and why), a diamond a point that is not a step of the path; and which points were read back from
    the results store, with their date."""
    reasons = sorted({r.split(",")[0].split(":")[0] for s in panel.series for _, m in s.points if m.noisy
                      for r in m.noisy_reasons or ["its timing was unsteady"]})
    apart = any(s.apart for s in panel.series)
    spread = any(m.speed_spread is not None for s in panel.series for _, m in s.points)
    return "; ".join(([f"hollow: a speed not to be trusted ({', '.join(reasons)})"] if reasons else []) +
                     _from_store(panel) +
                     (["|-|: the speed's spread over its repeats in this run"] if spread else []) +
                     (["\u25c6 not one technique added: no arrow"] if apart else []))


def _from_store(panel: _Panel) -> list[str]:
    """Which of the panel's points were read back from the results store, not measured in this run, and when they
    were measured: ['read back from your store, not measured now: 1-4 (measured 2026-12-03 19:09 UTC to ...)']."""
    found = {int(i): measured_on(m) for s in panel.series if s.path for i, m in s.points  # this run's numbered points
             if m.cached and m.source == "measured here"}
    if not found:
        return []
    dates = sorted(set(found.values()))
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return [f"read back from your store, not measured now: {_ranges(sorted(found))} (measured {when})"]


def _ranges(ids: list[int]) -> str:
    """'1-4, 6' for [1, 2, 3, 4, 6]."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _misfits(panel: _Panel) -> str:
    names = [m for s in panel.series for m in s.misfits]
    return "does not fit: " + "; ".join(names) if names else ""


def _draw_key(fig, panel: _Panel, top: float, renderer) -> None:
    """The key's columns under the panel, from display y `top`; then what its markers mean (_notes); then, in
    red, the recipes that did not fit."""
    cols = _key_columns(panel, renderer)[0]
    width, height = fig.bbox.width, fig.bbox.height
    x0, width_px = panel.span[0], panel.span[1] - panel.span[0]
    x, lowest = x0, top
    for c in cols:
        text = fig.text(x / width, top / height, "\n".join(c), ha="left", va="top", fontsize=FONT_PT, gid="caption")
        box = text.get_window_extent(renderer)
        x, lowest = x + box.width + KEY_GAP_PX, min(lowest, box.y0)
    for extra, color in ((_notes(panel), "0.3"), (_misfits(panel), "#b22222")):
        if extra:
            text = fig.text(x0 / width, (lowest - 3) / height, wrap(extra, width_px, panel.ax, renderer, FONT_PT),
                            ha="left", va="top", fontsize=FONT_PT, color=color, gid="caption")
            lowest = text.get_window_extent(renderer).y0


def _label(panel: _Panel, renderer) -> None:
    """Each point's id beside it (numbers for this run, letters for the reference runs), keeping off every
    marker, arrow, card line and other id (the key under the panel names them); then the cards' names on their
    lines, keeping off the markers, arrows and ids. Either may lie over a dotted baseline: in its white box it
    stays legible."""
    ax = panel.ax
    markers = []
    for s in panel.series:
        if s.xy:
            markers += point_boxes(ax, [x for x, _ in s.xy], [y * panel.scale for _, y in s.xy], radius_pt=6.0)
    arrows = [b for a, b_, rad, _ in panel.segments for b in segment_boxes(ax, a, b_, rad=rad)]
    lines = _line_boxes(ax, ("card-line",))  # an id may sit on a dotted baseline (in its white box), not on a card's
    centres = [tuple(c) for c in ax.transData.transform([(lab.x, lab.y) for lab in panel.key])] if panel.key else []
    ids = place_labels(ax, panel.key, markers + arrows + lines, FONT_PT, renderer, short_only=True, markers=markers,
                       lines=arrows + lines, points=centres)[2]
    place_line_labels(ax, [(f"{name}: {gib:g} GiB", gib) for name, gib in panel.cards], markers + arrows + ids,
                      FONT_PT, renderer, shorts=[f"{gib:g} GiB" for _, gib in panel.cards])


def _split(fig, panels: list[_Panel], renderer) -> float:
    """Give each panel an equal column of the figure (its `span`); returns the keys' height in pixels."""
    pad, gap = _PAD_IN * fig.dpi, _GAP_IN * fig.dpi
    col = (fig.bbox.width - 2 * pad - gap * (len(panels) - 1)) / len(panels)
    for i, p in enumerate(panels):
        p.span = (pad + i * (col + gap), pad + i * (col + gap) + col)
    return max(_key_columns(p, renderer)[1] for p in panels)


def _panels(groups: list[tuple[str, list[Series]]], title: str, size_in=FIGURE_IN, bottom_in: float = 0.0):
    """A figure of `size_in` with one memory-against-speed panel per group (side by side, each on its own axes
    and in its own unit), the title above and each panel's key under it; `bottom_in` left empty below."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(size_in[0] - 2 * _SAVE_PAD_IN, size_in[1] - 2 * _SAVE_PAD_IN))
    renderer = fig.canvas.get_renderer()
    panels = []
    for name, series in groups:
        unit, scale = _panel_unit(series)
        ax = fig.add_axes((0.1, 0.2, 0.3, 0.5))
        panel = _Panel(ax, series, unit, scale, cards_to_draw([y for s in series for _, y in s.xy]))
        _draw_series(panel)
        _draw_axes(panel)
        panels.append(panel)
    key_height = _split(fig, panels, renderer)
    for p, (name, series) in zip(panels, groups):
        p.ax.set_title(wrap(_panel_title(series, name), p.span[1] - p.span[0] - 10, p.ax, renderer, FONT_PT + 1),
                       fontsize=FONT_PT + 1, loc="left")
    for _ in range(3):  # an id that finds no room lengthens its key's line, which may take another row
        _layout(fig, panels, title, bottom_in, renderer, key_height)
        for p in panels:
            bend_retraced(p.ax, p.segments, points=[(lab.x, lab.y) for lab in p.key])
            _label(p, renderer)
        needed = max(_key_columns(p, renderer)[1] for p in panels)
        if needed <= key_height:
            break
        key_height = needed
        for p in panels:
            for t in [t for t in p.ax.texts if t.get_gid() in ("point-label", "card-label")]:
                t.remove()
            for lab in p.key:
                lab.placed = True
    fig.draw_without_rendering()
    key_top = min(p.ax.get_tightbbox(renderer).y0 for p in panels) - 4
    for p in panels:
        _draw_key(fig, p, key_top, renderer)
    return fig


def memory_vs_speed(measurements: Sequence[Measurement], reference: Sequence[Measurement] = (),
                    title: str = "Peak memory against speed"):
    """One panel: peak memory against tokens/s of this run's recipes (joined by arrows in the order given,
    from a step to the next that adds one technique to it: path_steps) and of `reference`, on the same axes.
    technique_figure puts the two in panels of their own. Returns the axes."""
    return _panels([("Peak memory against speed", build_series(measurements, reference))], title).axes[0]


def technique_figure(mine, reference=(), title: str = "Memory against speed, every technique so far"):
    """The notebooks' closing figure: this run's path on the left, the shipped GPU reference runs on the right,
    each panel on its own axes (own unit: MiB for a CPU run of the tiny model) with dotted lines through its
    first point (its baseline); points marked by id, named in a key under their panel.

    Its size, FIGURE_IN = 9.0 x 5.2 in at the inline backend's 100 dpi, is 900 x 520 CSS px, what JupyterLab 4
    shows of one output at 1366 x 768 with its file browser open: across, 1366 - 33 (activity bar) - 256 (file
    browser) - ~120 (notebook padding, prompt column) = ~957 px >= 900; down, 768 - ~85 (browser tabs, address
    bar) - ~118 (JupyterLab's menu, tab bar, notebook toolbar, status bar) = ~565 px >= 520, with room for the
    line of code above it. Everything is drawn within 8.8 x 5.0 in: the inline backend's bbox_inches="tight"
    adds 0.1 in of padding on each side."""
    mine, reference = [m for m in mine if m is not None], list(reference)
    groups = [("Your run", build_series(mine))] if mine or not reference else []
    if reference:
        groups.append(("Reference (shipped)", build_series([], reference)))
    return _panels(groups, title)


def ladder_figure(measurements: Sequence[Measurement], reference: Sequence[Measurement] = (), path=None):
    """The `course run` figure: technique_figure's panels above the breakdown of each peak (numbered alike);
    saved to `path` if given."""
    fits = [m for m in measurements if m.fits]
    bars_in = 0.25 + 0.3 * max(1, len(fits)) + 0.9
    groups = [("Your run", build_series(measurements))] + (
        [("Reference (shipped)", build_series([], reference))] if reference else [])
    fig = _panels(groups, "Peak memory against speed", size_in=(FIGURE_IN[0], FIGURE_IN[1] + bars_in),
                  bottom_in=bars_in)
    height = fig.get_size_inches()[1]
    bars = fig.add_axes((0.25, (_PAD_IN + 0.45) / height, 0.5, (bars_in - 0.9) / height))
    memory_breakdown(fits, ax=bars)
    fit_width(fig, [bars])
    if path is not None:
        fig.savefig(path, dpi=100, bbox_inches="tight")
    return fig
