"""The chapter's other figures: where a peak's bytes went (horizontal bars by category), memory against one
knob (notebook 06's curves) and the loss per optimizer step (notebooks 09 and 10). Same type sizes and width
rules as course_utils.show.plots, whose memory-against-speed figure puts the bars under its panels."""

from __future__ import annotations

from typing import Sequence

from course_utils.common import GiB, MiB
from course_utils.results import Measurement
from course_utils.show.placement import fit_height, fit_width, new_figure

FIG_WIDTH_IN = 9.0  # at the inline backend's 100 dpi: 900 px, under the ~950 px a notebook's output gets
FONT_PT = 9  # the smallest text in any figure


def peak_gib(m: Measurement) -> float:
    """The peak to plot, in GiB: CUDA's max allocated where we have it, else the tensor-level peak."""
    return m.peak_gib



def where(m: Measurement) -> str:
    """'<model> on <device>': which run a panel or a key shows."""
    return f"{m.recipe.get('model', '?')} on {m.env.get('device', '?')}"


CATEGORY_COLORS = {
    "parameters": "#4C72B0",
    "gradients": "#DD8452",
    "optimizer": "#55A868",
    "activations": "#C44E52",
    "temporaries": "#8172B3",
    "other": "#937860",
}


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
    titles = titles or (f"Your run: {where(groups[0][0])}" if groups[0] else "Your run",
                        f"Reference: {where(reference[0])}" if reference else "")
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
