"""Measurements as a learner reads them: the results table of a ladder, what one technique changed
(`describe_change`), and which of a notebook's figures were not measured here.
"""

from __future__ import annotations

from typing import Any

from course_utils.common import CATEGORIES, GiB, MiB
from course_utils.recipe import RUNG_NAMES
from course_utils.results import Measurement, from_store_note, measured_on
from course_utils.show.speeds import speed_words
from course_utils.show.tables import Column, Flagged, Note, Table, wrap

def _joined(*paragraphs: str) -> str:
    """The paragraphs, each wrapped at 100 characters, one under the other."""
    return "\n".join(wrap(p) for p in paragraphs)


def summary_row(m: Measurement) -> dict[str, Any]:
    """The table row of a measurement: MiB per category, tokens/s, final loss."""
    row: dict[str, Any] = {"recipe": m.label}
    if not m.fits:
        row["status"] = "does not fit"
    for cat in CATEGORIES[:5]:  # every category but 'other'
        row[cat] = m.mib(cat)
    row["peak"] = m.mib("peak")
    row["tokens/s"] = m.tokens_per_s
    row["final loss"] = m.final_loss
    return row


_CATEGORY_COLUMNS = (("parameters", "params"), ("gradients", "grads"), ("optimizer", "optim"),
                     ("activations", "activ"), ("temporaries", "temps"), ("peak", "peak"))
NOISY_MARK = "~"
REPEATED_NOTE = ("tokens/s ± x: the median of this run's interleaved timings of the recipe, ± half their range "
                 "(or half its timed steps' spread, when wider); speeds whose ranges overlap show no measurable "
                 "difference.")


def results_table(measurements: list[Measurement], skipped: dict[str, str] | None = None,
                  order: list[str] | tuple[str, ...] = RUNG_NAMES) -> Table:
    """The measurements as a Table (course_utils.tables): recipe, memory per category at the peak, the peak,
    CUDA's allocated and reserved peaks (when measured), tokens/s, final loss. In MiB, or in GiB when a figure
    reaches 10,000 MiB. A run that did not fit gives its reason instead of numbers. A tokens/s from a noisy run
    (Measurement.noisy) is marked.

    `skipped` is {recipe name: why}, as run_ladder returns it (`rungs.skipped`): each is a row that says it was
    skipped and why, no numbers, placed by `order` (the names in order; the ladder's rungs by default) among the
    measured rows; a name `order` does not have comes last."""
    cuda = any(m.cuda_max_allocated for m in measurements)
    biggest = max([m.peak_bytes for m in measurements] + [m.cuda_max_reserved or 0 for m in measurements] + [0])
    unit, scale, fmt = ("GiB", GiB, ".2f") if biggest >= 10_000 * MiB else ("MiB", MiB, ".1f")
    columns = [Column("recipe", wrap=True)] + [Column(name, unit, fmt, short=short) for name, short in _CATEGORY_COLUMNS]
    if cuda:
        columns += [Column("CUDA allocated", unit, fmt, short="cuda\nalloc"),
                    Column("CUDA reserved", unit, fmt, short="cuda\nrsrvd")]
    columns += [Column("tokens/s", fmt=".0f"), Column("final loss", fmt=".3f", short="loss\n(final)")]
    place = {name: i for i, name in enumerate(order)}
    waiting = sorted((skipped or {}).items(), key=lambda item: place.get(item[0], len(place)))
    rows, noisy, repeated = [], [], False
    for m in measurements:
        while waiting and m.label in place and place.get(waiting[0][0], len(place)) < place[m.label]:
            name, why = waiting.pop(0)
            rows.append([name, Note(f"skipped: {why}")])
        if not m.fits:
            rows.append([m.label, Note(f"does not fit: {m.error}")])
            continue
        row = [m.label] + [m.peak_by_category.get(c, 0) / scale for c, _ in _CATEGORY_COLUMNS[:-1]]
        row.append(m.peak_bytes / scale)
        if cuda:
            row += [(m.cuda_max_allocated or 0) / scale, (m.cuda_max_reserved or 0) / scale]
        speed, spread = m.tokens_per_s or None, getattr(m, "speed_spread", None)
        mark = f" ± {spread * speed:,.0f}" if speed and spread is not None else ""
        repeated = repeated or bool(mark)
        if speed and getattr(m, "noisy", False):
            mark = mark + NOISY_MARK
            noisy.append(m)
        rows.append(row + [Flagged(speed, mark) if mark else speed, m.final_loss])
    rows += [[name, Note(f"skipped: {why}")] for name, why in waiting]
    notes = [noisy_note(noisy)] if noisy else []
    notes += [REPEATED_NOTE] if repeated else []
    stored = from_store_note(list(measurements))
    return Table(columns, rows, notes=notes + ([stored] if stored else []))


def noisy_note(noisy: list[Measurement]) -> str:
    """The table's note on its speeds marked NOISY_MARK: each one's recipe and why its speed cannot be trusted."""
    why = "; ".join(f"{m.label} ({', '.join(m.noisy_reasons) or 'its timing was unsteady'})" for m in noisy)
    return (f"{NOISY_MARK}: a speed not to be trusted, and not reused from your results store: {why}. Measure it "
            "again (course run --force) before comparing it.")


def dated(text: str, *measurements: Measurement) -> str:
    """A closing's sentence on this run's figures, followed by which of them were read back from the results store
    and when they were measured (from_store_note), when any were."""
    stored = from_store_note(list(measurements))
    return wrap(f"{text} {stored}") if stored else text


def read_back_line(m: Measurement) -> str:
    """The line that says a measurement was read back from the results store instead of measured now, and when it
    was measured (what measure() prints for it while the ladder or a notebook runs)."""
    return wrap(f"{m.label}: read back from your store, measured {measured_on(m)}")


def format_table(measurements: list[Measurement], skipped: dict[str, str] | None = None) -> str:
    """results_table as plain text (at most 100 characters a line): what `course run` and scripts print."""
    return str(results_table(measurements, skipped))


def not_measured(*measurements: Measurement) -> str | None:
    """Why a comparison of these measurements cannot be made here: the first one that did not fit (its
    label, device and reason), or None when every one of them ran."""
    for m in measurements:
        if not m.fits:
            return wrap(f"{m.label} does not fit on {m.env.get('device', 'this device')} "
                        f"({m.error or 'out of memory'}), so there is nothing to compare it with here.")
    return None


def describe_change(before: Measurement, after: Measurement) -> str:
    """How the peak and speed moved from one rung to the next, and the category that moved most (one line,
    wrapped at 100 characters)."""
    if not (before.fits and after.fits):
        return f"{after.label}: " + ("does not fit" if not after.fits else "previous rung did not fit")
    cats = CATEGORIES
    deltas = {c: (after.peak_by_category.get(c, 0) - before.peak_by_category.get(c, 0)) / MiB for c in cats}
    biggest = max(deltas, key=lambda c: abs(deltas[c]))
    peak = (after.peak_bytes - before.peak_bytes) / MiB
    pct = 100 * peak / (before.peak_bytes / MiB) if before.peak_bytes else 0.0
    speed = f", {speed_words(before, after)}" if before.tokens_per_s and after.tokens_per_s else ""
    return wrap(f"{after.label}: peak {peak:+.1f} MiB ({pct:+.0f}%){speed}; "
                f"largest change in {biggest} ({deltas[biggest]:+.1f} MiB)")
