"""Measurements and the results store: append-only JSON lines, written atomically, keyed by recipe
and environment, so a repeated measurement is found instead of re-run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

from .recipe import Recipe

MiB = 1024**2
SCHEMA_VERSION = 1


@dataclass
class Measurement:
    """What one training run measured, and where and how it ran."""

    recipe: dict  # Recipe.to_dict()
    recipe_key: str
    env: dict  # hardware.Environment as a dict
    env_key: str
    status: str  # "ok", or "does_not_fit" when it ran out of memory
    peak_bytes: int = 0  # tensor-level peak, steady state (after warm-up)
    peak_by_category: dict = field(default_factory=dict)  # category -> bytes at that peak
    cuda_max_allocated: int | None = None  # torch.cuda.max_memory_allocated after warm-up
    cuda_max_reserved: int | None = None  # torch.cuda.max_memory_reserved after warm-up
    tokens_per_s: float | None = None  # after warm-up, the tracked step excluded
    losses: list = field(default_factory=list)  # training loss per optimizer step
    precision: str = ""  # resolved precision
    trainable_params: int = 0
    model_bytes: int = 0  # weights, buffers and quantization state
    duration_s: float = 0.0  # this run in its process: building the model and trainer, and training
    startup_s: float = 0.0  # the measuring process's start-up before that (imports), when it had its own
    build_s: float = 0.0  # building the model, its adapters and the trainer (part of duration_s)
    notes: list = field(default_factory=list)
    error: str = ""
    date: str = ""
    command: str = ""
    schema: int = SCHEMA_VERSION
    source: str = "measured here"  # or "reference: <file>" for shipped results
    run_id: str = ""  # the measurement run it belongs to ($COURSE_RUN_ID): ratios are taken within one run
    cached: bool = field(default=False, compare=False)

    @property
    def fits(self) -> bool:
        """False when the run ran out of memory (a real or a simulated budget)."""
        return self.status == "ok"

    @property
    def recipe_obj(self) -> Recipe:
        """The Recipe this measurement ran."""
        return Recipe.from_dict(self.recipe)

    @property
    def label(self) -> str:
        """Display name of the recipe."""
        return self.recipe_obj.name

    @property
    def final_loss(self) -> float | None:
        """Loss of the last step, if any step ran."""
        return self.losses[-1] if self.losses else None

    def mib(self, category: str) -> float:
        """Peak bytes of one category (or 'peak'), in MiB."""
        value = self.peak_bytes if category == "peak" else self.peak_by_category.get(category, 0)
        return value / MiB

    def to_json(self) -> str:
        """One JSON line (without the 'cached' flag)."""
        d = dataclasses.asdict(self)
        d.pop("cached")
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        """Rebuild from a stored dict; unknown keys (from newer versions) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {"recipe", "recipe_key", "env", "env_key", "status"} - set(d)
        if missing:
            raise ValueError(f"missing field(s) {sorted(missing)}")
        return cls(**{k: v for k, v in d.items() if k in names})


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock beside the store while we rewrite it."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class ResultStore:
    """Append-only JSON lines file of Measurements."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"ResultStore({str(self.path)!r})"

    def load(self) -> list[Measurement]:
        """Every readable measurement; a corrupted line is skipped with a warning naming file and line."""
        if not self.path.exists():
            return []
        out = []
        with open(self.path, "rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                try:
                    out.append(Measurement.from_dict(json.loads(raw.decode("utf-8"))))
                except (ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
                    warnings.warn(
                        f"{self.path}:{lineno}: skipped a corrupted result line ({type(exc).__name__}: {exc}); "
                        "the other results are kept. Delete that line, or re-run its recipe with force=True.",
                        stacklevel=2,
                    )
        return out

    def find(self, recipe: Recipe, env_key: str) -> Measurement | None:
        """The latest measurement of this recipe in this environment, if any."""
        hits = [m for m in self.load() if m.recipe_key == recipe.key and m.env_key == env_key]
        return hits[-1] if hits else None

    def add(self, measurement: Measurement) -> None:
        """Append one measurement atomically: the file is whole before and after, never half-written."""
        with _locked(self.path):
            old = self.path.read_bytes() if self.path.exists() else b""
            if old and not old.endswith(b"\n"):
                old += b"\n"
            fd, tmp = tempfile.mkstemp(prefix=".results-", dir=self.path.parent)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(old + measurement.to_json().encode() + b"\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it owner-only; a store is an ordinary file
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise


def default_store() -> ResultStore:
    """The learner's store: $COURSE_HOME/results.jsonl."""
    from .models import course_home

    return ResultStore(course_home() / "results.jsonl")


def shipped_results(folder: str = "", name: str | None = None) -> list[Measurement]:
    """Measurements shipped in course_utils/reference/<folder> (every .jsonl file, or the one named), each
    marked with the file it came from."""
    where = resources.files("course_utils") / "reference"
    if folder:
        where = where / folder
    out: list[Measurement] = []
    if not where.is_dir():
        return out
    for item in sorted(where.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".jsonl") and (name is None or item.name == name):
            for m in ResultStore(Path(str(item))).load():
                m.source = f"reference: {folder + '/' if folder else ''}{item.name}"
                out.append(m)
    return out


def reference_results(name: str | None = None) -> list[Measurement]:
    """Shipped reference measurements of the chapter's techniques (from real GPUs), each with its provenance."""
    return shipped_results("", name)


def all_reference_results() -> list[Measurement]:
    """The chapter's reference runs and those of notebook 08 (reference/beyond/), together."""
    return reference_results() + shipped_results("beyond")


def summary_row(m: Measurement) -> dict[str, Any]:
    """The table row of a measurement: MiB per category, tokens/s, final loss."""
    row: dict[str, Any] = {"recipe": m.label}
    if not m.fits:
        row["status"] = "does not fit"
    for cat in ("parameters", "gradients", "optimizer", "activations", "temporaries"):
        row[cat] = m.mib(cat)
    row["peak"] = m.mib("peak")
    row["tokens/s"] = m.tokens_per_s
    row["final loss"] = m.final_loss
    return row


def format_table(measurements: list[Measurement], skipped: dict[int, str] | None = None) -> str:
    """A plain-text table: recipe, MiB per category at the peak, peak, tokens/s, final loss.

    `skipped` maps a row position to a reason; such rows print the reason instead of numbers.
    """
    cats = ("parameters", "gradients", "optimizer", "activations", "temporaries")
    cuda = any(m.cuda_max_allocated for m in measurements)
    head = ["recipe", "params", "grads", "optim", "activ", "temps", "peak"]
    head += ["cuda alloc", "cuda rsrvd"] if cuda else []
    head += ["tokens/s", "loss"]
    width = max([len("recipe")] + [len(m.label) for m in measurements]) + 2
    lines = [f"{head[0]:<{width}}" + "".join(f"{h:>11}" for h in head[1:]),
             f"{'':<{width}}" + "".join(f"{'(MiB)':>11}" for _ in head[1:-2]) + f"{'':>11}{'(final)':>11}"]
    for i, m in enumerate(measurements):
        if skipped and i in skipped:
            lines.append(f"{m.label:<{width}}  skipped: {skipped[i]}")
            continue
        if not m.fits:
            lines.append(f"{m.label:<{width}}  does not fit: {m.error}")
            continue
        cells = [f"{m.mib(c):11.1f}" for c in cats] + [f"{m.mib('peak'):11.1f}"]
        if cuda:
            cells += [f"{(m.cuda_max_allocated or 0) / MiB:11.1f}", f"{(m.cuda_max_reserved or 0) / MiB:11.1f}"]
        cells.append(f"{m.tokens_per_s:11.0f}" if m.tokens_per_s else f"{'-':>11}")
        cells.append(f"{m.final_loss:11.3f}" if m.final_loss is not None else f"{'-':>11}")
        lines.append(f"{m.label:<{width}}" + "".join(cells))
    return "\n".join(lines)


def not_measured(*measurements: Measurement) -> str | None:
    """Why a comparison of these measurements cannot be made here: the first one that did not fit (its
    label, device and reason), or None when every one of them ran."""
    for m in measurements:
        if not m.fits:
            return (f"{m.label} does not fit on {m.env.get('device', 'this device')} ({m.error or 'out of memory'}), "
                    "so there is nothing to compare it with here.")
    return None


def describe_change(before: Measurement, after: Measurement) -> str:
    """One line: how the peak and speed moved from one rung to the next, and the category that moved most."""
    if not (before.fits and after.fits):
        return f"{after.label}: " + ("does not fit" if not after.fits else "previous rung did not fit")
    cats = ("parameters", "gradients", "optimizer", "activations", "temporaries", "other")
    deltas = {c: (after.peak_by_category.get(c, 0) - before.peak_by_category.get(c, 0)) / MiB for c in cats}
    biggest = max(deltas, key=lambda c: abs(deltas[c]))
    peak = (after.peak_bytes - before.peak_bytes) / MiB
    pct = 100 * peak / (before.peak_bytes / MiB) if before.peak_bytes else 0.0
    speed = ""
    if before.tokens_per_s and after.tokens_per_s:
        speed = f", speed {100 * (after.tokens_per_s / before.tokens_per_s - 1):+.0f}%"
    return (f"{after.label}: peak {peak:+.1f} MiB ({pct:+.0f}%){speed}; "
            f"largest change in {biggest} ({deltas[biggest]:+.1f} MiB)")
