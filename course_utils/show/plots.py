"""Plots: memory against speed (every technique so far), and where the bytes went.

One figure the chapter comes back to: peak memory (GiB, a log scale when the points span more than
LOG_RATIO) against training speed, the learner's recipes joined by arrows in the order they were added
(only a recipe that adds one technique to the arrow's start is a step of that path: a full fine-tune or
the source recipe is a point of its own), the shipped GPU reference runs scattered beside them (another
marker and colour), the Pareto front of each series ringed, and the cards learners have drawn as lines.
Figures are FIG_WIDTH_IN wide, which JupyterLab shows at 100% in a 1366-pixel window with its file browser
open, and no text is below FONT_PT.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from string import ascii_uppercase
from typing import Sequence

from course_utils.show.path import bend_retraced, one_technique, path_steps  # noqa: F401 (one_technique: plots' API too)
from course_utils.common import GiB, MiB
from course_utils.machine import PROFILES
from course_utils.results import Measurement
from course_utils.show.placement import (Label, columns, fit_height, fit_width, grow_below, new_figure,
                                         place_labels, place_line_labels, point_boxes, segment_boxes, wrap)

FIG_WIDTH_IN = 9.0  # at the inline backend's 100 dpi: 900 px, under the ~950 px a notebook's output gets
FONT_PT = 9  # the smallest text in any figure
AXES_HEIGHT_IN = 4.2  # the memory-against-speed plotting area
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

CATEGORY_COLORS = {
    "parameters": "#4C72B0",
    "gradients": "#DD8452",
    "optimizer": "#55A868",
    "activations": "#C44E52",
    "temporaries": "#8172B3",
    "other": "#937860",
}


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


def peak_gib(m: Measurement) -> float:
    """The peak to plot, in GiB: CUDA's max allocated where we have it, else the tensor-level peak."""
    return m.peak_gib


def letters(i: int) -> str:
    """0 -> 'A', 25 -> 'Z', 26 -> 'AA': the ids of reference points."""
    return ascii_uppercase[i] if i < 26 else letters(i // 26 - 1) + ascii_uppercase[i % 26]


def _where(m: Measurement) -> str:
    """'<model> on <device>' for a legend entry."""
    return f"{m.recipe.get('model', '?')} on {m.env.get('device', '?')}"


def build_series(measurements: Sequence[Measurement], reference: Sequence[Measurement] = ()) -> list[Series]:
    """This run as one numbered path (numbered among the recipes that fit, as the breakdown numbers them; its
    points that do not add one technique to the path in `apart`), then the reference runs, one lettered
    series per model and GPU, in the order given."""
    out = []
    mine = [m for m in measurements if m is not None]
    if mine:
        where = sorted({_where(m) for m in mine}, key=[_where(m) for m in mine].index)
        out.append(Series("this run: " + "; ".join(where), *MINE, path=True))
        fits = [m for m in mine if m.fits]
        out[0].points = [(str(i), m) for i, m in enumerate(fits, 1) if m.tokens_per_s]
        out[0].misfits = [m.label for m in mine if not m.fits]
        steps = path_steps([m for _, m in out[0].points])
        out[0].apart = {i for (i, _), step in zip(out[0].points, steps) if not step}
    groups: dict[str, Series] = {}
    for m in reference:
        key = _where(m)
        if key not in groups:
            marker, color = REFERENCE[len(groups) % len(REFERENCE)]
            groups[key] = Series(f"reference (shipped): {key}", marker, color, path=False)
        if not m.fits:
            groups[key].misfits.append(m.label)
    n = 0
    for m in (m for m in reference if m.fits):
        groups[_where(m)].points.append((letters(n), m))
        n += 1
    for s in groups.values():
        s.points = [(i, m) for i, m in s.points if m.tokens_per_s]
    return out + list(groups.values())


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (speed, memory) points no other point beats: none is at least as fast with at
    most as much memory and better in one of the two."""
    def beaten(a, b) -> bool:
        return b[0] >= a[0] and b[1] <= a[1] and (b[0] > a[0] or b[1] < a[1])

    return [i for i, p in enumerate(points) if not any(beaten(p, q) for q in points)]


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
    """Tick text: 0.05, 0.5, 5, 50, 5,000."""
    return f"{v:,.0f}" if v >= 10 else f"{v:.3g}"


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


def _draw_series(ax, series: list[Series]) -> list:
    """Markers, path arrows and Pareto rings; returns the arrow segments. This run's points are drawn over the
    reference runs' (a learner's point on top of a shipped one stays in sight); arrows join only its steps."""
    segments, ringed, noisy_said = [], False, False
    for s in series:
        xy = s.xy
        if not xy:
            continue
        z = 4.5 if s.path else 4
        on = [p for (i, _), p in zip(s.points, xy) if i not in s.apart]
        off = [p for (i, _), p in zip(s.points, xy) if i in s.apart]
        if on:
            ax.scatter(*zip(*on), marker=s.marker, s=MARKER_PT2, zorder=z, label=s.name, gid="points",
                       facecolors=s.color if s.path else "white", edgecolors=s.color, linewidths=1.4)
        if off:  # the first point is always a step: `on` is never empty
            ax.scatter(*zip(*off), marker=APART, s=MARKER_PT2 * 0.8, zorder=z, gid="points", facecolors=s.color,
                       edgecolors=s.color, linewidths=1.4, label="this run, not a step of the path (not one "
                       "technique added)")
        if s.path:
            for a, b in zip(on, on[1:]):
                arrow = ax.annotate("", xy=b, xytext=a, gid="path-arrow", zorder=3, arrowprops=dict(
                    arrowstyle="-|>", color=s.color, lw=1.2, alpha=0.8, shrinkA=4.5, shrinkB=5.5, mutation_scale=10))
                segments.append([a, b, 0.0, arrow])  # the bend (arc3's rad) is set once the scales are known
        noisy = [(m.tokens_per_s, peak_gib(m)) for _, m in s.points if m.noisy]
        if noisy:  # a speed from a busy machine: shown, and marked as one
            ax.scatter(*zip(*noisy), s=MARKER_PT2 * 2.2, facecolors="none", edgecolors="#b22222", linestyles=":",
                       linewidths=1.3, zorder=5, gid="noisy", label=None if noisy_said else
                       "noisy speed: the machine was busy (measure again to trust it)")
            noisy_said = True
        front = [xy[i] for i in pareto_front(xy)]
        several = sum(1 for t in series if t.xy) > 1
        ax.scatter(*zip(*front), s=MARKER_PT2 * 3.4, facecolors="none", edgecolors="0.2", linewidths=1.0,
                   zorder=3, gid="pareto", label=None if ringed else
                   f"Pareto front{' of each series' if several else ''}: none both leaner and faster")
        ringed = True
    return segments


def _obstacles(ax, series: list[Series], segments) -> tuple[list, list]:
    """Display boxes labels must avoid: every marker (with its ring), and every arrow; (markers, arrows)."""
    markers, arrows = [], []
    for s in series:
        if s.xy:
            xs, ys = zip(*s.xy)
            markers += point_boxes(ax, xs, ys, radius_pt=6.0)
    for a, b, rad, _ in segments:
        arrows += segment_boxes(ax, a, b, rad=rad)
    return markers, arrows


def _legend_above(ax, renderer):
    """The legend in a row (or rows) just above the axes, as wide as the axes at most; the title above it."""
    legend = None
    pairs = sorted(zip(*ax.get_legend_handles_labels()), key=lambda p: p[1].startswith("Pareto"))  # series first
    handles, names = [h for h, _ in pairs], [n for _, n in pairs]
    for ncol in range(min(3, len(names)), 0, -1):
        legend = ax.legend(handles, names, loc="lower left", bbox_to_anchor=(0, 1.01), ncol=ncol, frameon=False,
                           fontsize=FONT_PT, borderaxespad=0.2, handletextpad=0.3, columnspacing=1.2)
        if legend.get_window_extent(renderer).width <= ax.get_window_extent(renderer).width:
            break
    return legend


def _caption(ax, series: list[Series], fell_back: list[Label], renderer) -> None:
    """Under the x-axis label: the ids of the points whose names found no room, then what did not fit."""
    items = [f"{lab.short}. {lab.text.split('. ', 1)[1]}" + ("" if lab.placed else " (no room to mark it)")
             for lab in fell_back]
    fig_right = ax.figure.bbox.x1 - 8
    width = max(ax.get_window_extent(renderer).width, fig_right - ax.get_window_extent(renderer).x0)
    anchor, x_pt = ax.xaxis.label, 0.0
    col0 = None
    for col in columns(items, width, ax, FONT_PT, renderer):
        text = ax.annotate("\n".join(col), xy=(0, 0), xycoords=("axes fraction", ax.xaxis.label),
                           xytext=(x_pt, -5), textcoords="offset points", va="top", ha="left",
                           fontsize=FONT_PT, gid="caption", annotation_clip=False)
        col0 = col0 or text
        x_pt += (text.get_window_extent(renderer).width + 14) * 72 / ax.figure.dpi
    anchor = col0 or anchor
    misfits = [m for s in series for m in s.misfits]
    if misfits:
        ax.annotate(wrap("does not fit: " + "; ".join(misfits), width, ax, renderer), xy=(0, 0),
                    xycoords=("axes fraction", anchor),
                    xytext=(0, -4), textcoords="offset points", va="top", ha="left", fontsize=FONT_PT,
                    color="#b22222", gid="caption", annotation_clip=False)


def memory_vs_speed(
    measurements: Sequence[Measurement],
    reference: Sequence[Measurement] = (),
    ax=None,
    title: str = "Peak memory against speed",
    numbers_only: bool = False,
):
    """Peak memory (GiB) against tokens/s: this run's recipes joined by arrows in the order given, each
    arrow from a step to the next that adds one technique to it (path_steps; the others, such as a full
    fine-tune or the source recipe, are points of their own, another marker), reference runs scattered
    beside them, each series' Pareto front ringed, learner cards as lines.

    Each point is labelled '<id>. <recipe>' where there is room, else with its id (numbers for this
    run, letters for reference runs) listed under the axis; `numbers_only` always uses the ids. When any
    of this run's names finds no room, all of its points show their numbers and the names are listed.
    Recipes that did not fit are listed, not plotted. Without `ax` the figure is FIG_WIDTH_IN wide;
    with one, labels are placed for the axes' current size (lay the figure out first).
    """
    own = ax is None
    ax = ax or new_figure(FIG_WIDTH_IN, AXES_HEIGHT_IN)
    renderer = ax.figure.canvas.get_renderer()
    series = build_series(measurements, reference)
    segments = _draw_series(ax, series)
    xy = [p for s in series for p in s.xy]
    cards = cards_to_draw([y for _, y in xy])
    _axes(ax, xy, cards)
    if own:
        fit_width(ax.figure, [ax])
    bend_retraced(ax, segments, points=xy)
    legend = _legend_above(ax, renderer) if xy else None
    above = legend.get_window_extent(renderer).y1 - ax.get_window_extent(renderer).y1 if legend else 0
    ax.set_title(title, fontsize=FONT_PT + 3, pad=max(0, above) * 72 / ax.figure.dpi + 5)
    _label(ax, series, segments, cards, renderer, numbers_only)
    if own:
        fit_height(ax.figure)
    return ax


def _axes(ax, xy, cards) -> None:
    """The cards' lines, both scales (log where the range needs it), axis labels and grid."""
    for name, gib in cards:
        ax.axhline(gib, color="0.45", ls=(0, (5, 3)), lw=0.9, zorder=1, gid="card-line")
    yscale = set_scale(ax.yaxis, [y for _, y in xy] + [g for _, g in cards] or [1.0])
    set_scale(ax.xaxis, [x for x, _ in xy] or [1.0])
    ax.set_xlabel("training speed (tokens/s, after warm-up)", fontsize=FONT_PT + 1)
    ax.set_ylabel("peak memory (GiB" + (", log scale)" if yscale == "log" else ")"), fontsize=FONT_PT + 1)
    ax.tick_params(labelsize=FONT_PT)
    ax.grid(True, alpha=0.25)
    if not xy:
        ax.text(0.5, 0.5, "no recipe here fits with a measured speed", transform=ax.transAxes, ha="center",
                fontsize=FONT_PT + 1, color="0.4")


def _label(ax, series, segments, cards, renderer, numbers_only: bool) -> None:
    """The cards' names on their lines, then each point's name (or id) beside it, then the caption. This run's
    points are named first, nearest their points; where any of its names finds no room, every point of this
    run is marked by its number and its names are listed under the axes in one numbered list (a mix of names
    and numbers on a crowded plot reads as if the numbers were other points')."""
    markers, arrows = _obstacles(ax, series, segments)
    taken = markers + arrows
    taken += place_line_labels(ax, [(f"{name}: {gib:g} GiB", gib) for name, gib in cards], taken, FONT_PT, renderer)
    centres = [tuple(c) for s in series if s.xy for c in ax.transData.transform(s.xy)]
    fell_back = []
    for s in series:
        labels = [Label(x, y, f"{i}. {m.label}", i) for (i, m), (x, y) in zip(s.points, s.xy)]
        placed = place_labels(ax, labels, taken, FONT_PT, renderer, short_only=numbers_only, markers=markers,
                              lines=arrows, points=centres)
        if s.path and placed[1] and not numbers_only:
            for annotation in placed[0]:
                annotation.remove()
            for label in labels:
                label.placed = True
            placed = place_labels(ax, labels, taken, FONT_PT, renderer, short_only=True, markers=markers,
                                  lines=arrows, points=centres)
        taken += placed[2]
        fell_back += placed[1]
    _caption(ax, series, fell_back, renderer)


def technique_figure(mine, reference=(), title: str = "Memory against speed, every technique so far"):
    """The notebooks' closing figure: this run's path and the shipped GPU reference runs on one plot."""
    return memory_vs_speed(list(mine), list(reference), title=title).figure


def ladder_figure(measurements: Sequence[Measurement], reference: Sequence[Measurement] = (), path=None):
    """The `course run` figure: memory against speed above the breakdown of each peak (both numbered
    alike); saved to `path` if given."""
    fits = [m for m in measurements if m.fits]
    top = memory_vs_speed(measurements, reference, title="Peak memory against speed")
    fig = top.figure
    bar_height = 0.25 + 0.3 * max(1, len(fits))
    grow_below(fig, bar_height + 1.5)
    fig.draw_without_rendering()
    height, dpi = fig.get_size_inches()[1], fig.dpi
    above = top.get_tightbbox(fig.canvas.get_renderer()).y0 / dpi - 0.5  # under the caption, room for a title
    pos = top.get_position()
    bars = fig.add_axes((pos.x0, (above - bar_height) / height, pos.width, bar_height / height))
    memory_breakdown(fits, ax=bars)
    fit_width(fig, [bars])
    fit_height(fig)
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def _breakdown_unit(measurements: Sequence[Measurement]) -> tuple[str, float]:
    """GiB for the bars, or MiB when every peak is under 1 GiB (a CPU run's 0.06 GiB reads as 60 MiB)."""
    peak = max((sum(m.peak_by_category.values()) for m in measurements), default=0)
    return ("GiB", GiB) if peak >= GiB else ("MiB", MiB)


def memory_breakdown(measurements: Sequence[Measurement], ax=None, title: str = "Where the peak's bytes went",
                     legend: bool = True):
    """Stacked horizontal bars: the peak of each recipe split by category, the legend right of the bars."""
    own = ax is None
    ax = ax or new_figure(FIG_WIDTH_IN, 0.25 + 0.3 * max(1, len(measurements)))
    unit, size = _breakdown_unit(measurements)
    names = [f"{i}. {m.label}" for i, m in enumerate(measurements, 1)]
    left = [0.0] * len(measurements)
    for cat, color in CATEGORY_COLORS.items():
        widths = [m.peak_by_category.get(cat, 0) / size for m in measurements]
        ax.barh(names, widths, left=left, color=color, label=cat, height=0.7)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlim(0, max(left + [0.0]) * 1.06 or 1.0)  # room after the longest bar: it does not touch the frame
    ax.invert_yaxis()
    ax.set_xlabel(f"{unit} at the peak (tensor-level tracking)", fontsize=FONT_PT + 1)
    ax.set_title(title, fontsize=FONT_PT + 2)
    ax.tick_params(labelsize=FONT_PT)
    ax.grid(True, axis="x", alpha=0.25)
    if legend:
        ax.legend(fontsize=FONT_PT, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0)
    if own:
        fit_width(ax.figure, [ax])
        fit_height(ax.figure)
    return ax


def breakdown_figure(mine: Sequence[Measurement], reference: Sequence[Measurement] = (),
                     titles: tuple[str, str] | None = None):
    """This run's breakdown above the reference runs' (one legend, right of the top bars)."""
    import matplotlib.pyplot as plt

    groups = [list(mine)] + ([list(reference)] if reference else [])
    titles = titles or (f"Your run: {_where(groups[0][0])}" if groups[0] else "Your run",
                        f"Reference: {_where(reference[0])}" if reference else "")
    fig, axes = plt.subplots(len(groups), 1, layout="constrained", squeeze=False, figsize=(
        FIG_WIDTH_IN, sum(0.9 + 0.3 * max(1, len(g)) for g in groups)),
        height_ratios=[max(1, len(g)) for g in groups])
    for i, (group, ax) in enumerate(zip(groups, axes[:, 0])):
        memory_breakdown(group, ax=ax, title=titles[i], legend=i == 0)
    return fig


def memory_curves(series: dict, knob: str, ax=None, title: str | None = None, legend: bool = True):
    """Peak memory (solid) and activations (dashed) against one knob, a line per series
    (e.g. {"no checkpointing": [...], "checkpointing": [...]}), from sweep() measurements. Both axes are
    linear, so growth in proportion to the knob draws a straight line; ticks sit at the values swept."""
    own = ax is None
    ax = ax or new_figure(FIG_WIDTH_IN * 0.6, 3.2)
    knobs = set()
    for i, (name, ms) in enumerate(series.items()):
        fits = [m for m in ms if m.fits]
        xs = [m.recipe[knob] for m in fits]
        knobs.update(xs)
        ax.plot(xs, [peak_gib(m) for m in fits], "o-", color=f"C{i}", label=f"{name}: peak")
        ax.plot(xs, [m.peak_by_category.get("activations", 0) / GiB for m in fits], "s--", color=f"C{i}",
                alpha=0.7, label=f"{name}: activations")
    ax.set_xticks(sorted(knobs))
    ax.set_xlim(0, max(knobs, default=1) * 1.06)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(knob.replace("_", " "), fontsize=FONT_PT + 1)
    ax.set_ylabel("GiB at the peak", fontsize=FONT_PT + 1)
    ax.tick_params(labelsize=FONT_PT)
    ax.grid(True, alpha=0.25)
    if legend:
        ax.legend(fontsize=FONT_PT, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0)
    ax.set_title(title or f"Memory against {knob.replace('_', ' ')}", fontsize=FONT_PT + 2)
    if own:
        fit_width(ax.figure, [ax])
        fit_height(ax.figure)
    return ax


def curves_figure(by_knob: dict):
    """memory_curves side by side, one panel per knob ({"max_seq_length": series, ...}), one legend below."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(by_knob), figsize=(FIG_WIDTH_IN, 3.8), layout="constrained", squeeze=False)
    for ax, (knob, series) in zip(axes[0], by_knob.items()):
        memory_curves(series, knob, ax=ax, legend=False)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=2, fontsize=FONT_PT, frameon=False)
    return fig


def loss_curves(measurements: Sequence[Measurement], ax=None, title: str = "Training loss per optimizer step"):
    """Each run's loss per optimizer step, one line per recipe (runs that saw the same data overlap);
    the legend under the axes, where no line can be."""
    own = ax is None
    ax = ax or new_figure(FIG_WIDTH_IN * 0.6, 3.2)
    styles = ["-", "--", ":", "-."]
    for i, m in enumerate(m for m in measurements if m.losses):
        steps = range(1, len(m.losses) + 1)
        ax.plot(steps, m.losses, styles[i % len(styles)], color=f"C{i}", marker="o", markersize=3, label=m.label)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("optimizer step", fontsize=FONT_PT + 1)
    ax.set_ylabel("training loss", fontsize=FONT_PT + 1)
    ax.set_title(title, fontsize=FONT_PT + 2)
    ax.tick_params(labelsize=FONT_PT)
    ax.grid(True, alpha=0.25)
    if ax.lines:
        ax.legend(fontsize=FONT_PT, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0)
    else:
        ax.text(0.5, 0.5, "no losses recorded", transform=ax.transAxes, ha="center", fontsize=FONT_PT + 1, color="0.4")
    if own:
        fit_width(ax.figure, [ax])
        fit_height(ax.figure)
    return ax


def loss_figure(mine: Sequence[Measurement], reference: Sequence[Measurement] = (), titles=("Your run", "Reference")):
    """loss_curves of this run above the reference runs', each legend right of its lines."""
    import matplotlib.pyplot as plt

    groups = [list(mine)] + ([list(reference)] if reference else [])
    fig, axes = plt.subplots(len(groups), 1, figsize=(FIG_WIDTH_IN, 3.0 * len(groups)), layout="constrained",
                             squeeze=False)
    for group, ax, title in zip(groups, axes[:, 0], titles):
        loss_curves(group, ax=ax, title=title)
    return fig
