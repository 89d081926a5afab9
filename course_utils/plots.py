"""Plots: memory against speed (every technique so far), and where the bytes went."""

from __future__ import annotations

from typing import Sequence

from .results import MiB, Measurement

CATEGORY_COLORS = {
    "parameters": "#4C72B0",
    "gradients": "#DD8452",
    "optimizer": "#55A868",
    "activations": "#C44E52",
    "temporaries": "#8172B3",
    "other": "#937860",
}


def _peak_mib(m: Measurement) -> float:
    """The peak to plot: CUDA's max allocated where we have it, else the tensor-level peak."""
    return (m.cuda_max_allocated or m.peak_bytes) / MiB


def memory_vs_speed(
    measurements: Sequence[Measurement],
    reference: Sequence[Measurement] = (),
    ax=None,
    title: str = "Peak memory against speed",
    numbers_only: bool = False,
):
    """Scatter of peak memory (y) against tokens/s (x), one numbered point per recipe, in order.

    The learner's points are joined in the order they were added; shipped reference points are
    drawn hollow, labelled with their hardware. Recipes that did not fit are listed, not plotted.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 5))
    groups = [(list(measurements), "o", True)]
    if reference:
        groups.append((list(reference), "s", False))
    for group, marker, filled in groups:
        # numbered among the recipes that fit, as in the breakdown; plotted where speed is known
        numbered = [(i, m) for i, m in enumerate((m for m in group if m.fits), start=1) if m.tokens_per_s]
        if not numbered:
            continue
        xs = [m.tokens_per_s for _, m in numbered]
        ys = [_peak_mib(m) for _, m in numbered]
        device = numbered[0][1].env.get("device", "?")
        label = ("this run" if filled else "reference") + f": {device}"
        ax.plot(xs, ys, "-", color="0.75", zorder=1)
        ax.scatter(xs, ys, marker=marker, s=60, zorder=2, label=label,
                   facecolors=None if filled else "none", edgecolors="C0" if filled else "C1")
        for (i, m), x, y in zip(numbered, xs, ys):
            text = str(i) if numbers_only else f"{i}. {m.label}"
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("training speed (tokens/s, after warm-up)")
    ax.set_ylabel("peak memory (MiB)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.margins(x=0.35, y=0.12)  # room for the labels
    ax.set_ylim(bottom=0)  # memory from zero, so a saving looks as big as it is
    ax.set_xlim(left=0)
    ax.legend(loc="lower right", fontsize=8)
    misfits = [m.label for group, _, _ in groups for m in group if not m.fits]
    if misfits:
        ax.text(0.01, 0.01, "does not fit: " + "; ".join(misfits), transform=ax.transAxes, fontsize=7, color="C3")
    return ax


def memory_breakdown(measurements: Sequence[Measurement], ax=None, title: str = "Where the peak's bytes went"):
    """Stacked horizontal bars: the peak of each recipe split by category."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(measurements)))
    names = [f"{i}. {m.label}" for i, m in enumerate(measurements, 1)]
    left = [0.0] * len(measurements)
    for cat, color in CATEGORY_COLORS.items():
        widths = [m.peak_by_category.get(cat, 0) / MiB for m in measurements]
        ax.barh(names, widths, left=left, color=color, label=cat)
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel("MiB at the peak (tensor-level tracking)")
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=3, loc="lower right")
    return ax


def ladder_figure(measurements: Sequence[Measurement], reference: Sequence[Measurement] = (), path=None):
    """The `course run` figure: memory against speed beside the breakdown; saved to `path` if given."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [1.1, 1]})
    memory_vs_speed(measurements, reference, ax=left, numbers_only=True)  # names are on the bars
    memory_breakdown([m for m in measurements if m.fits], ax=right)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def memory_curves(series: dict, knob: str, ax=None, title: str | None = None):
    """Peak memory (solid) and activations (dashed) against one knob, a line per series
    (e.g. {"no checkpointing": [...], "checkpointing": [...]}), from sweep() measurements."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (name, ms) in enumerate(series.items()):
        fits = [m for m in ms if m.fits]
        xs = [m.recipe[knob] for m in fits]
        ax.plot(xs, [_peak_mib(m) for m in fits], "o-", color=f"C{i}", label=f"{name}: peak")
        ax.plot(xs, [m.mib("activations") for m in fits], "s--", color=f"C{i}", alpha=0.7, label=f"{name}: activations")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(knob.replace("_", " "))
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or f"Memory against {knob.replace('_', ' ')}")
    return ax


def loss_curves(measurements: Sequence[Measurement], ax=None, title: str = "Training loss per optimizer step"):
    """Each run's loss per optimizer step, one line per recipe (runs that saw the same data overlap)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4.2))
    styles = ["-", "--", ":", "-."]
    for i, m in enumerate(m for m in measurements if m.losses):
        steps = range(1, len(m.losses) + 1)
        ax.plot(steps, m.losses, styles[i % len(styles)], color=f"C{i}", marker="o", markersize=3, label=m.label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return ax
