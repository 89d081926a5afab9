"""How a speed is said: with the spread it is known to (repeats in this run, or its timed steps), and a change
between two speeds only when it lies outside both (issue 30). Taught in notebooks 00-05 (their measuring cells
compare rungs through show.report.describe_change); used by the results table and the closings of 01 and 05."""

from __future__ import annotations

from course_utils.results import Measurement

# Only a fallback, for two speeds of which one or both were timed once (shipped reference runs, `course run`):
# speeds of one run each move this much between runs of one recipe on one machine (CPU: identical recipes in the
# committed notebooks differ by 15-26%; H200: a host-bound 1 x 16 step moved 1.04-1.13x from one process to the
# next, notebook 09), so speed_words calls a smaller change of such speeds no effect, and says it is one run each.
# Speeds timed again in the same run (Measurement.speeds, measure.time_again) are judged by their own spread.
SPEED_SPREAD = 0.30


def speed_text(m: Measurement) -> str:
    """A speed with how far it is known: '412 ± 30 tokens/s' (± half the range of its repeats in this run, or of
    its timed steps when wider), or '412 tokens/s (timed once)'."""
    if not m.tokens_per_s:
        return "no speed"
    spread = m.speed_spread
    if spread is None:
        return f"{m.tokens_per_s:,.0f} tokens/s (timed once)"
    return f"{m.tokens_per_s:,.0f} ± {spread * m.tokens_per_s:,.0f} tokens/s"


def speed_change(before: Measurement, after: Measurement) -> float | None:
    """after's speed against before's (-0.22 for 22% slower) when the difference is outside what was measured
    of both: with repeats in their run, their ranges (± speed_spread) do not overlap; timed once, the change is
    beyond SPEED_SPREAD (and beyond each run's own step spread). None: no difference measurable here, and always
    when either speed cannot be trusted (Measurement.noisy: one timed step, a busy or shared machine)."""
    if before.noisy or after.noisy:
        return None
    change = after.tokens_per_s / before.tokens_per_s - 1
    a, b = before.speed_spread, after.speed_spread
    if a is not None and b is not None:
        gap = abs(after.tokens_per_s - before.tokens_per_s)
        return change if gap > a * before.tokens_per_s + b * after.tokens_per_s else None
    return change if abs(change) > _once_spread(before, after) else None


def _once_spread(*ms: Measurement) -> float:
    """The fallback spread for speeds timed once: SPEED_SPREAD, or a run's own timed steps' spread when larger."""
    return max([SPEED_SPREAD] + [m.timing["spread"] for m in ms if m.timing.get("spread")])


NO_DIFFERENCE = "no speed difference measurable here"


def speed_words(before: Measurement, after: Measurement) -> str:
    """The speed change as a learner may read it, with the spread it is judged by: 'speed 412 ± 30 -> 321 ± 12
    tokens/s (-22%)' when the difference is outside both speeds' measured spread (speed_change), else 'speed
    412 ± 30 -> 400 ± 25 tokens/s: no speed difference measurable here'. Speeds timed once are judged by the
    fallback SPEED_SPREAD, and the words say so. A speed that cannot be trusted (Measurement.noisy) is compared
    with nothing: the words say why."""
    untrusted = [f"{m.label}: {m.noisy_reasons[0]}" for m in (before, after) if m.noisy]
    if untrusted:
        return (f"speed {before.tokens_per_s:,.0f} -> {after.tokens_per_s:,.0f} tokens/s: no speed difference stated "
                f"(~ not to be trusted: {'; '.join(untrusted)})")
    change = speed_change(before, after)
    if before.speed_spread is not None and after.speed_spread is not None:
        span = (f"speed {before.tokens_per_s:,.0f} ± {before.speed_spread * before.tokens_per_s:,.0f} -> "
                f"{after.tokens_per_s:,.0f} ± {after.speed_spread * after.tokens_per_s:,.0f} tokens/s")
        if change is None:
            return f"{span}: {NO_DIFFERENCE} (within the spread of repeats in this run)"
        return f"{span} ({100 * change:+.0f}%, beyond the spread of repeats in this run)"
    spread = _once_spread(before, after)
    span = f"speed {before.tokens_per_s:,.0f} -> {after.tokens_per_s:,.0f} tokens/s"
    if change is None:
        return f"{span}: {NO_DIFFERENCE} (timed once each; runs of one recipe differ by up to ±{100 * spread:.0f}%)"
    return (f"{span} ({100 * change:+.0f}%; timed once each, beyond the ±{100 * spread:.0f}% runs of one recipe "
            "differ by)")
