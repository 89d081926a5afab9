"""The path of "adding one technique" on the memory-against-speed figure (plots.py): which of this run's
points are its steps, and how an arrow that runs back along an earlier one is bent.

A step adds one technique to the step before it: one of STEPS changed and nothing else. A point that
is not one (a full fine-tune, the source recipe, a planner's pick) is drawn on its own, and no arrow ends there.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from course_utils.recipe import TECHNIQUES, Recipe
from course_utils.results import Measurement

# What one step of the path may change: the Recipe fields of one technique (recipe.TECHNIQUES), or the
# processes training together (notebook 11's DDP). A point that changes more than one of them, or anything else
# (the model, LoRA for a full fine-tune, the steps, the learning rate), does not add one technique: not a step.
STEPS = tuple(t.fields for t in TECHNIQUES if t.where != "setup") + (("gpus", "strategy"),)
_SETUP = tuple(f.name for f in dataclasses.fields(Recipe) if f.name != "label") + ("gpus", "strategy")


def _setup(m: Measurement) -> dict:
    """What a measurement ran: its recipe's fields (precision as resolved: 'auto' is fp32 on a CPU) and its
    processes."""
    r = m.recipe_obj
    out = {name: getattr(r, name) for name in _SETUP[:-2]}
    out.update(precision=m.precision or r.precision, gpus=m.gpus, strategy=m.strategy)
    return out


def one_technique(before: Measurement, after: Measurement) -> bool:
    """True when `after` differs from `before` in exactly one technique (STEPS) and in nothing else."""
    a, b = _setup(before), _setup(after)
    changed = {name for name in _SETUP if a[name] != b[name]}
    groups = [g for g in STEPS if changed & set(g)]
    return len(groups) == 1 and changed <= set(groups[0])


def path_steps(ms: Sequence[Measurement]) -> list[bool]:
    """Which of these points (in the order given) are steps of the path: the first, and each that adds one
    technique to the last step before it; the others are points of their own, which arrows do not reach."""
    out, last = [], None
    for m in ms:
        step = last is None or one_technique(last, m)
        out.append(step)
        last = m if step else last
    return out


def bend_retraced(ax, segments, near_px: float = 7.0, overlap_px: float = 10.0, points=(),
                  marker_px: float = 9.0) -> None:
    """Curve each path arrow that runs along an earlier one (a step back the way the path came, as
    3 -> 4 -> 5 when 5 undoes 4's speed): drawn straight, the two read as one double-headed arrow. Also
    each arrow that runs over the marker of another point in `points` (data coordinates; its own ends
    excepted): drawn straight, 2 -> 3 over a full fine-tune's diamond reads as a path through it. The
    bend goes away from the marker it avoids, else towards the middle of the axes, at least ~10 pixels deep."""
    pts = [ax.transData.transform([a, b]) for a, b, _, _ in segments]
    marks = [ax.transData.transform(xy) for xy in points]
    centre = ax.transAxes.transform((0.5, 0.5))
    for i, (p, q) in enumerate(pts):
        over = [m for m in marks if _passes_over(p, q, m, marker_px)]
        if not (over or any(_runs_along(p, q, r, t, near_px, overlap_px) for r, t in pts[:i])):
            continue
        d = q - p
        length = float((d ** 2).sum() ** 0.5) or 1.0
        rad = min(0.5, max(0.2, 24.0 / length))
        mid = (p + q) / 2
        control = mid + rad * d[::-1] * (1, -1)  # matplotlib's arc3: (x + rad dy, y - rad dx)
        mirror = 2 * mid - control
        if over:  # the side away from the marker nearest the middle of the arrow
            m = min(over, key=lambda x: float(((x - mid) ** 2).sum()))
            if ((control - m) ** 2).sum() < ((mirror - m) ** 2).sum():
                rad = -rad
        elif ((control - centre) ** 2).sum() > ((mirror - centre) ** 2).sum():
            rad = -rad
        segments[i][2] = rad
        segments[i][3].arrow_patch.set_connectionstyle(f"arc3,rad={rad:.3f}")


def _passes_over(p, q, m, marker_px: float) -> bool:
    """True when display segment p-q passes within `marker_px` of point m, away from both of its ends."""
    d = q - p
    length = float((d ** 2).sum() ** 0.5)
    if length < 1:
        return False
    u = d / length
    along = float(((m - p) * u).sum())
    off = abs(float((m - p)[0] * u[1] - (m - p)[1] * u[0]))
    return 2 * marker_px < along < length - 2 * marker_px and off <= marker_px


def _runs_along(p, q, r, t, near_px: float, overlap_px: float) -> bool:
    """True when display segment p-q lies within `near_px` of segment r-t's line and shares more than
    `overlap_px` of its length."""
    d = t - r
    length = float((d ** 2).sum() ** 0.5)
    if length < 1:
        return False
    u = d / length
    off = [abs(float((x - r)[0] * u[1] - (x - r)[1] * u[0])) for x in (p, q)]
    along = sorted(float(((x - r) * u).sum()) for x in (p, q))
    return max(off) <= near_px and min(along[1], length) - max(along[0], 0.0) > overlap_px
