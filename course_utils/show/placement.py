"""Label placement for the course's figures, without a new dependency: a small greedy search.

Each label tries offsets around its point, nearest first, and keeps the first whose text box lies
inside the axes and overlaps no box placed before it and no obstacle (markers, arrows, lines' labels).
A label without a leader line must also be nearer its own point than any other point, so that in a
cluster it cannot be read as another point's; where it would not be, it goes further out on a leader line.
A label that finds no room falls back to its short id (a number or a letter) placed the same way; the
figure then lists the id with the full name in its caption. Boxes are in display pixels, measured with
the figure's own renderer, so they are the extents matplotlib draws.

Also here: a figure's margins fitted to what is drawn around its axes (fit_width, fit_height), keeping
each axes' size in inches, so labels placed for that size stay where they were put.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Box = tuple  # (x0, y0, x1, y1) in display pixels

# (dx, dy, ha, va) unit directions, tried in this order: right, above, left, below, then the diagonals
_DIRECTIONS = ((1, 0, "left", "center"), (0, 1, "center", "bottom"), (-1, 0, "right", "center"),
               (0, -1, "center", "top"), (0.7, 0.7, "left", "bottom"), (-0.7, 0.7, "right", "bottom"),
               (-0.7, -0.7, "right", "top"), (0.7, -0.7, "left", "top"))
RINGS_PT = (9.0, 17.0, 28.0)  # distances tried, in points from the marker's centre; beyond the first a leader line
SHORT_RINGS_PT = RINGS_PT + (40.0, 55.0)  # a short id may go further out, on its leader line


def _direction(degrees: float) -> tuple:
    """A unit direction and the text alignment that keeps the text on that side of its point."""
    ux, uy = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    return (ux, uy, "left" if ux > 0.3 else "right" if ux < -0.3 else "center",
            "bottom" if uy > 0.3 else "top" if uy < -0.3 else "center")


_FAR_DIRECTIONS = tuple(_direction(d) for d in range(0, 360, 30))  # beyond RINGS_PT: every 30 degrees
LABEL_PAD_PX = 2.5
# where a horizontal line's name may go: its right end at this fraction of the axes' width (right end first,
# then leftwards), the text right-aligned there, just above the line (+2 points) or just below it
_LINE_SPOTS = tuple((fx / 20, "right", dy, va) for fx in range(20, 0, -1) for dy, va in ((2, "bottom"), (-2, "top")))


@dataclass
class Label:
    """What to write beside one point (x, y in data coordinates); `short` is the fallback id."""

    x: float
    y: float
    text: str
    short: str
    color: str = "0.1"
    placed: bool = True  # False when not even the short id found room beside the point


def overlaps(a: Box, b: Box) -> bool:
    """True when two boxes share more than an edge."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def inside(a: Box, outer: Box) -> bool:
    """True when box a lies within box `outer`."""
    return a[0] >= outer[0] and a[1] >= outer[1] and a[2] <= outer[2] and a[3] <= outer[3]


def text_size(ax, text: str, fontsize: float, renderer) -> tuple[float, float]:
    """Width and height in pixels that `text` takes at `fontsize` in this figure."""
    probe = ax.text(0, 0, text, fontsize=fontsize, transform=None)
    box = probe.get_window_extent(renderer)
    probe.remove()
    return box.width, box.height


def box_at(x: float, y: float, size: tuple[float, float], ha: str, va: str, pad: float = LABEL_PAD_PX) -> Box:
    """The box of a text of `size` anchored at display (x, y) with this alignment, grown by `pad`."""
    w, h = size
    x0 = {"left": x, "center": x - w / 2, "right": x - w}[ha]
    y0 = {"bottom": y, "center": y - h / 2, "top": y - h}[va]
    return (x0 - pad, y0 - pad, x0 + w + pad, y0 + h + pad)


def point_boxes(ax, xs, ys, radius_pt: float) -> list[Box]:
    """A square box around each marker, `radius_pt` from its centre."""
    r = radius_pt * ax.figure.dpi / 72
    pts = ax.transData.transform(list(zip(xs, ys))) if len(xs) else []
    return [(px - r, py - r, px + r, py + r) for px, py in pts]


def segment_boxes(ax, a, b, step_px: float = 6.0, half_px: float = 1.5, rad: float = 0.0) -> list[Box]:
    """Small boxes along the segment a -> b (data coordinates), so labels keep off an arrow; with `rad`,
    along the arc matplotlib's "arc3,rad=..." connection draws (a quadratic Bezier curve)."""
    (x0, y0), (x1, y1) = ax.transData.transform([a, b])
    cx, cy = (x0 + x1) / 2 + rad * (y1 - y0), (y0 + y1) / 2 - rad * (x1 - x0)
    n = max(2, int(((x1 - x0) ** 2 + (y1 - y0) ** 2) ** 0.5 * (1 + abs(rad)) / step_px))
    out = []
    for t in (i / n for i in range(n + 1)):
        x = (1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t * t * x1
        y = (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t * t * y1
        out.append((x - half_px, y - half_px, x + half_px, y + half_px))
    return out


def _candidates(ax, label: Label, text: str, fontsize: float, renderer, rings=RINGS_PT) -> list:
    """Every offset tried for `text` beside its point, nearest first: ((dx, dy in points, ha, va), box)."""
    size = text_size(ax, text, fontsize, renderer)
    px, py = ax.transData.transform((label.x, label.y))
    scale = ax.figure.dpi / 72
    return [((ux * ring, uy * ring, ha, va), box_at(px + ux * ring * scale, py + uy * ring * scale, size, ha, va))
            for ring in rings for ux, uy, ha, va in (_DIRECTIONS if ring in RINGS_PT else _FAR_DIRECTIONS)]


def _free(candidates, taken, area, origin, crossable=(), points=()):
    """The first candidate inside `area` that overlaps nothing taken, its leader line (from `origin`, the
    point in display pixels) crossing nothing either but the boxes in `crossable`, and, without a leader
    line, nearer its own point than any of `points` (every point's centre); or None."""
    ox, oy = origin
    others = [t for t in taken if abs((t[0] + t[2]) / 2 - ox) + abs((t[1] + t[3]) / 2 - oy) > 1  # not its own marker
              and t not in crossable]  # (a neighbour's marker that covers the point is still in the way)
    neighbours = [p for p in points if abs(p[0] - ox) + abs(p[1] - oy) > 0.5]

    def clear(c) -> bool:
        return (inside(c[1], area) and not any(overlaps(c[1], t) for t in taken)
                and (_leader(c[0]) or not _nearer_another(c[1], origin, neighbours))
                and not any(overlaps(b, t) for b in _leader_boxes(origin, c[1]) for t in others))

    return next((c for c in candidates if clear(c)), None)


def _leader(spot) -> bool:
    """True when a label at this offset (dx, dy in points, ...) gets a leader line to its point."""
    return (spot[0] ** 2 + spot[1] ** 2) ** 0.5 > RINGS_PT[0] + 0.5


def _distance(box: Box, point) -> float:
    """Pixels from `point` to the nearest point of `box` (0 inside it)."""
    dx = max(box[0] - point[0], 0.0, point[0] - box[2])
    dy = max(box[1] - point[1], 0.0, point[1] - box[3])
    return (dx * dx + dy * dy) ** 0.5


def _nearer_another(box: Box, origin, neighbours, margin_px: float = 4.0) -> bool:
    """True when a label's box is about as near another point as its own (within `margin_px`): read without a
    leader line, it could name either."""
    own = _distance(box, origin)
    return any(_distance(box, p) < own + margin_px for p in neighbours)


def _leader_boxes(origin, box: Box, skip_px: float = 10.0, step_px: float = 5.0) -> list[Box]:
    """Small boxes along a leader line from `origin` towards the nearest point of `box`, leaving out its
    first `skip_px` (the point's own marker)."""
    ox, oy = origin
    tx, ty = min(max(ox, box[0]), box[2]), min(max(oy, box[1]), box[3])
    length = ((tx - ox) ** 2 + (ty - oy) ** 2) ** 0.5
    n = int((length - skip_px) // step_px)
    fractions = [(skip_px + k * step_px) / length for k in range(max(0, n))]
    return [(x - 1, y - 1, x + 1, y + 1) for x, y in ((ox + (tx - ox) * f, oy + (ty - oy) * f) for f in fractions)]


def place_labels(ax, labels, obstacles, fontsize: float = 9, renderer=None, short_only: bool = False, markers=(),
                 points=(), lines=()):
    """Annotate each label at the first free spot; returns (annotations, the labels that fell back to
    their short id, the boxes of the labels placed). Placed boxes join the obstacles, so later labels avoid
    earlier ones. A name, where its leader line finds no clear way, may cross the `lines` (boxes among the
    obstacles: arrows). A short id tries further out too, then with a leader line across the `lines`, and at
    last across the `markers` (boxes among the obstacles) too; one that finds no room at all is not drawn
    (its Label is marked unplaced, and the caption says so) rather than drawn over another label. `points`:
    the centres (display pixels) of every point on the axes, which a label without a leader line must be
    further from than from its own."""
    renderer = renderer or ax.figure.canvas.get_renderer()
    taken, markers, lines = list(obstacles), set(markers), set(lines)
    area = ax.get_window_extent(renderer).padded(-2)
    area = (area.x0, area.y0, area.x1, area.y1)
    annotations, fell_back, boxes = [], [], []
    for label in labels:
        text = label.text
        origin = tuple(ax.transData.transform((label.x, label.y)))
        full = [] if short_only else _candidates(ax, label, text, fontsize, renderer)
        choice = next((c for crossable in ((), lines) if full
                       for c in [_free(full, taken, area, origin, crossable, points)] if c), None)
        if choice is None:
            text = label.short
            fell_back.append(label)
            short = _candidates(ax, label, text, fontsize, renderer, SHORT_RINGS_PT)
            # then a leader line may cross the `lines` (arrows), last the markers too (never a label): in a tight
            # cluster nothing else reaches out
            choice = next((c for crossable in ((), lines, lines | markers)
                           for c in [_free(short, taken, area, origin, crossable, points)] if c), None)
        if choice is None:
            label.placed = False
            continue
        taken.append(choice[1])
        boxes.append(choice[1])
        annotations.append(_annotate(ax, label, text, choice[0], fontsize))
    return annotations, fell_back, boxes


def _annotate(ax, label: Label, text: str, spot, fontsize: float):
    """The annotation for one placed label; a leader line when it sits beyond the first ring."""
    dx, dy, ha, va = spot
    far = _leader(spot)
    return ax.annotate(
        text, (label.x, label.y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
        fontsize=fontsize, color=label.color, gid="point-label", zorder=6,
        bbox=dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none", alpha=0.8),
        arrowprops=dict(arrowstyle="-", color="0.55", lw=0.6, shrinkA=0, shrinkB=7) if far else None)


def columns(items: list[str], width_px: float, ax, fontsize: float, renderer, gap_px: float = 14.0) -> list[list[str]]:
    """Split caption items into as many columns (filled top to bottom, each as wide as its widest item) as fit
    in `width_px`: the fewest rows."""
    if not items:
        return []
    widths = [text_size(ax, item, fontsize, renderer)[0] for item in items]
    for n in range(len(items), 0, -1):
        rows = -(-len(items) // n)
        cols = [range(i, min(i + rows, len(items))) for i in range(0, len(items), rows)]
        if n == 1 or sum(max(widths[i] for i in c) for c in cols) + gap_px * (len(cols) - 1) <= width_px:
            return [[items[i] for i in c] for c in cols]
    return [items]


def place_line_labels(ax, lines, obstacles, fontsize: float = 9, renderer=None, shorts=None) -> list[Box]:
    """Write each horizontal line's name on it: at the right end above the line, else below it, else
    further left, at the first spot inside the axes that overlaps no obstacle, no earlier name and no
    other line; where no spot is free, its short name (`shorts`, one per line) the same way; where that finds
    none either, the name is left out rather than drawn over something. Returns the boxes used. `lines`
    holds (text, y in data units)."""
    renderer = renderer or ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    scale = ax.figure.dpi / 72
    taken, placed = list(obstacles), []
    rules = [(frame.x0, ax.transData.transform((0, y))[1] - 1, frame.x1, ax.transData.transform((0, y))[1] + 1)
             for _, y in lines]  # a name keeps off the other lines
    for i, (text, y) in enumerate(lines):
        _, py = ax.transData.transform((0, y))
        avoid = taken + rules[:i] + rules[i + 1:]
        for text in [text] + ([shorts[i]] if shorts else []):
            size = text_size(ax, text, fontsize, renderer)

            def box_for(spot):
                fx, ha, dy, va = spot
                inset = {"right": -3, "left": 3, "center": 0}[ha]
                return box_at(frame.x0 + fx * frame.width + inset * scale, py + dy * scale, size, ha, va), inset

            spot = next((s for s in _LINE_SPOTS if _fits_frame(box_for(s)[0], frame)
                         and not any(overlaps(box_for(s)[0], t) for t in avoid)), None)
            if spot is not None:
                break
        if spot is None:
            continue
        box, inset = box_for(spot)
        taken.append(box)
        placed.append(box)
        ax.annotate(text, xy=(spot[0], y), xycoords=("axes fraction", "data"), xytext=(inset, spot[2]),
                    textcoords="offset points", ha=spot[1], va=spot[3], fontsize=fontsize, color="0.3",
                    gid="card-label", zorder=5,
                    bbox=dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none", alpha=0.8))
    return placed


def _fits_frame(box: Box, frame) -> bool:
    """True when the box lies within the axes' frame (less 1 pixel)."""
    return box[0] >= frame.x0 + 1 and box[1] >= frame.y0 + 1 and box[2] <= frame.x1 - 1 and box[3] <= frame.y1 - 1


def new_figure(width_in: float, axes_height_in: float):
    """A figure of this width holding one axes `axes_height_in` tall; fit_width and fit_height then set
    its margins from what is drawn around it."""
    import matplotlib.pyplot as plt

    height = axes_height_in + 3.0
    fig = plt.figure(figsize=(width_in, height))
    return fig.add_axes((0.9 / width_in, 1.5 / height, (width_in - 1.2) / width_in, axes_height_in / height))


def fit_width(fig, axes, pad_in: float = 0.08) -> None:
    """Move each axes' left and right edges so that its tick labels, axis labels and legend sit just
    inside the figure's width."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    width_px = fig.bbox.width
    pad = pad_in * fig.dpi
    for ax in axes:
        tight, box = ax.get_tightbbox(renderer), ax.get_window_extent(renderer)
        x0 = box.x0 + (pad - tight.x0)
        x1 = box.x1 - (tight.x1 - (width_px - pad))
        pos = ax.get_position()
        ax.set_position((x0 / width_px, pos.y0, (x1 - x0) / width_px, pos.height))


def fit_height(fig, pad_in: float = 0.08) -> None:
    """Make the figure exactly as tall as what is drawn (plus a pad), keeping every axes' size in inches:
    everything drawn is anchored to an axes, so nothing moves relative to anything else."""
    fig.draw_without_rendering()
    box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
    width, height = fig.get_size_inches()
    below, above = pad_in - box.y0, box.y1 + pad_in - height
    new = height + below + above
    for ax in fig.axes:
        pos = ax.get_position()
        ax.set_position((pos.x0, (pos.y0 * height + below) / new, pos.width, pos.height * height / new))
    fig.set_size_inches(width, new)


def wrap(text: str, width_px: float, ax, renderer, fontsize: float = 9) -> str:
    """`text` broken at spaces into lines no wider than `width_px` at `fontsize`."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and text_size(ax, lines[-1] + " " + word, fontsize, renderer)[0] <= width_px:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)
