"""Measurements and the results store: append-only JSON lines, written atomically, keyed by recipe
and environment, so a repeated measurement is found instead of re-run.

Every line is validated when it is read (types and value ranges, the recipe included): a bad line is
skipped with a warning naming file, line and field, never an error in a later run. Whether the store
can be written is checked up front (`ResultStore.check_writable`), before anything is measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import math
import os
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from course_utils.common import GiB, LockTimeout, MiB, __version__, course_home, file_lock, lock_path, shipped
from course_utils.guards import loss_problem
from course_utils.machine import Machine, machine
from course_utils.models import tiny_fingerprint
from course_utils.recipe import Recipe

# Bump when measure/memtrack change what a stored number means: older stored results stop matching.
MEASUREMENT_METHOD = 3


@dataclass(frozen=True)
class Environment(Machine):
    """Where a measurement ran: the machine with the course's own versions, enough to say whether two
    results are comparable."""

    @property
    def key(self) -> str:
        """Results measured with the same key are comparable (device and library versions)."""
        blob = json.dumps([self.device, self.versions], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def course_versions() -> dict[str, str]:
    """The course's part of an environment's versions: what makes stored results stop matching when the
    course's own measuring, or the tiny model it trains, changes."""
    return {"course_utils": __version__, "measurement_method": str(MEASUREMENT_METHOD), "tiny_model": tiny_fingerprint()}


def environment() -> Environment:
    """Read the current environment."""
    here = machine()
    return Environment(**{**asdict(here), "versions": {**here.versions, **course_versions()}})


def environment_record() -> dict:
    """The current environment as every shipped record stores it (a Measurement's `env`; the scripts' lines)."""
    return asdict(environment())

SCHEMA_VERSION = 1
STATUSES = ("ok", "does_not_fit")
NOISY_SPREAD = 0.5  # (slowest - fastest) / median of the timed steps' tokens/s above this: a noisy speed
NOISY_CPU_SHARE = 0.5  # CPU time / (wall time x threads) of the timed steps below this: a busy machine
RESOLVED_PRECISIONS = ("", "fp32", "bf16", "fp16")  # "" when a run stopped before it resolved one
STRATEGIES = ("", "ddp", "fsdp", "fsdp_offload")  # how a run used several processes (distributed.py); "" for one


class ResultLineError(ValueError):
    """A stored measurement has a missing field, a wrong type or a value out of range; the message names it."""


class NotAResult(ResultLineError):
    """A measurement whose run trained nothing (its loss collapsed, exploded or stopped moving): never stored."""


class StoreError(OSError):
    """The results store cannot be read or written where it is; the message names the path and the fix."""


@dataclass
class Measurement:
    """What one training run measured, and where and how it ran."""

    recipe: dict  # Recipe.to_dict()
    recipe_key: str
    env: dict  # provenance.Environment as a dict
    env_key: str  # provenance.Environment.key: results with the same one are comparable
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
    timing: dict = field(default_factory=dict)  # how steady the timed steps were: see Measurement.noisy
    gpus: int = 1  # processes that trained together (one per GPU; on a CPU, gloo processes): distributed.py
    strategy: str = ""  # "" for one process, else "ddp", "fsdp" or "fsdp_offload" (see STRATEGIES)
    per_rank: list = field(default_factory=list)  # one dict per rank (peaks, tokens, tokens/s); [] for one process
    speeds: list = field(default_factory=list)  # tokens/s of each timing of this recipe in one run, interleaved with
    # the recipes it is compared with (measure.time_again); tokens_per_s is then their median. [] when timed once
    cached: bool = field(default=False, compare=False)

    @property
    def noisy(self) -> bool:
        """True when tokens/s cannot be trusted (noisy_reasons): marked in tables and figures, never reused."""
        return bool(self.noisy_reasons)

    @property
    def noisy_reasons(self) -> list[str]:
        """Why tokens/s cannot be trusted, in a learner's words ([] if it can be, or predates timing): one timed step,
        another measurement beside it (guards), a step spread over NOISY_SPREAD, a CPU share under NOISY_CPU_SHARE."""
        t, spread, share = self.timing, self.timing.get("spread") or 0.0, self.timing.get("cpu_share")
        return ((["timed on one step only"] if t.get("timed_steps") == 1 else [])
                + (["another measurement ran on this machine at the same time"] if t.get("others", 0) > 0 else [])
                + ([f"its timed steps differed a lot, by {spread:.0%} of their median"] if spread > NOISY_SPREAD else [])
                + ([f"the machine was busy: this run got {share:.0%} of its CPU cores"]
                   if share is not None and share < NOISY_CPU_SHARE else []))

    @property
    def speed_spread(self) -> float | None:
        """How far this speed is known: half the range of its repeated timings (Measurement.speeds) or half the
        spread of its own timed steps, whichever is larger, as a share of tokens_per_s. None when it was
        timed once (no repeats in its run): then nothing measured says how far it would move."""
        if len(self.speeds) < 2 or not self.tokens_per_s:
            return None
        repeats = (max(self.speeds) - min(self.speeds)) / 2 / self.tokens_per_s
        return max(repeats, self.timing.get("spread", 0.0) / 2)

    @property
    def fits(self) -> bool:
        """False when the run ran out of memory (a real or a simulated budget)."""
        return self.status == "ok"

    @property
    def recipe_obj(self) -> Recipe:
        """The Recipe this measurement ran. Built once while self.recipe holds the same values (a Recipe is
        frozen; the planner asks for it tens of thousands of times)."""
        seen = self.__dict__.get("_recipe_seen")
        if seen is None or seen[0] != self.recipe:
            snapshot = {k: list(v) if isinstance(v, list) else v for k, v in self.recipe.items()}
            seen = self.__dict__["_recipe_seen"] = (snapshot, Recipe.from_dict(self.recipe))
        return seen[1]

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

    @property
    def peak_gib(self) -> float:
        """The peak to show, in GiB: CUDA's max allocated on a GPU run, else the tensor-level peak."""
        return (self.cuda_max_allocated or self.peak_bytes) / GiB

    def to_json(self) -> str:
        """One JSON line (without the 'cached' flag)."""
        d = dataclasses.asdict(self)
        d.pop("cached")
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        """Rebuild from a stored dict and validate it (ResultLineError names the first bad field); unknown
        keys (from newer versions) are ignored, and losses stored as null read as no losses."""
        if not isinstance(d, dict):
            raise ResultLineError(f"a measurement is a JSON object of fields, got {_short(d)}")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {"recipe", "recipe_key", "env", "env_key", "status"} - set(d)
        if missing:
            raise ResultLineError(f"missing field(s) {sorted(missing)}")
        kept = {k: v for k, v in d.items() if k in names}
        if kept.get("losses", []) is None:
            kept["losses"] = []
        m = cls(**kept)
        m.validate()
        return m

    def validate(self) -> None:
        """Raise ResultLineError naming the first field whose type or value cannot be a real measurement."""
        _check_recipe(self.recipe, self.recipe_key)
        for names, ok, what in _RULES:
            for name in names:
                value = getattr(self, name)
                if not ok(value):
                    raise ResultLineError(f"field {name!r} {what}, got {_short(value)}")


def _short(value: Any) -> str:
    """repr, cut to one short line for a warning."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_count(v: Any) -> bool:
    """A whole number, 0 or more (bytes, parameters); True and False are not numbers here."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_finite(v: Any) -> bool:
    """A finite int or float (no bool, nan or inf)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# (fields, test of one value, what a good value is): every field but the recipe, which _check_recipe reads
_RULES: tuple[tuple[tuple[str, ...], Any, str], ...] = (
    (("recipe_key", "env_key"), lambda v: isinstance(v, str) and v != "", "must be non-empty text"),
    (("error", "date", "command", "source", "run_id"), lambda v: isinstance(v, str), "must be text"),
    (("status",), lambda v: isinstance(v, str) and v in STATUSES, f"must be one of {STATUSES}"),
    (("precision",), lambda v: isinstance(v, str) and v in RESOLVED_PRECISIONS,
     f"must be one of {RESOLVED_PRECISIONS}"),
    (("env",), lambda v: isinstance(v, dict), "must be a JSON object"),
    (("peak_bytes", "model_bytes", "trainable_params"), _is_count, "must be a whole number, 0 or more"),
    (("cuda_max_allocated", "cuda_max_reserved"), lambda v: v is None or _is_count(v),
     "must be null or a whole number of bytes, 0 or more"),
    (("peak_by_category",), lambda v: isinstance(v, dict) and all(isinstance(k, str) and _is_count(b)
                                                                  for k, b in v.items()),
     "must map category names to whole numbers of bytes, 0 or more"),
    (("tokens_per_s",), lambda v: v is None or (_is_finite(v) and v > 0), "must be null or a finite number above 0"),
    (("losses",), lambda v: isinstance(v, list) and all(_is_finite(x) for x in v), "must be a list of finite numbers"),
    (("duration_s", "startup_s", "build_s"), lambda v: _is_finite(v) and v >= 0,
     "must be a finite number of seconds, 0 or more"),
    (("notes",), lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "must be a list of text"),
    (("schema",), lambda v: _is_count(v) and v >= 1, "must be a whole number, 1 or more"),
    (("cached",), lambda v: isinstance(v, bool), "must be true or false"),
    (("timing",), lambda v: isinstance(v, dict) and all(isinstance(k, str) and _is_finite(x) and x >= 0
                                                        for k, x in v.items()),
     "must map names to finite numbers, 0 or more"),
    (("gpus",), lambda v: _is_count(v) and v >= 1, "must be a whole number, 1 or more"),
    (("speeds",), lambda v: isinstance(v, list) and all(_is_finite(x) and x > 0 for x in v),
     "must be a list of finite numbers above 0 (tokens/s)"),
    (("strategy",), lambda v: isinstance(v, str) and v in STRATEGIES, f"must be one of {STRATEGIES}"),
    (("per_rank",), lambda v: isinstance(v, list) and all(isinstance(r, dict) and all(
        isinstance(k, str) and (x is None or isinstance(x, str) or (_is_finite(x) and x >= 0)) for k, x in r.items())
        for r in v), "must be a list of objects mapping names to text, null or finite numbers, 0 or more"),
)


def _check_recipe(recipe: Any, key: Any) -> None:
    """The stored recipe is one Recipe accepts (Recipe.validate's ranges, booleans where the knob is one),
    and the stored key is its key: otherwise `find` would return this line for another recipe."""
    if not isinstance(recipe, dict):
        raise ResultLineError(f"field 'recipe' must be a JSON object of recipe fields, got {_short(recipe)}")
    try:
        r = Recipe.from_dict(recipe)
    except (ValueError, TypeError) as exc:  # RecipeError is a ValueError
        raise ResultLineError(f"field 'recipe' is not a valid recipe: {exc}") from None
    for f in dataclasses.fields(Recipe):
        if isinstance(f.default, bool) and not isinstance(getattr(r, f.name), bool):
            raise ResultLineError(f"field 'recipe' has {f.name}={_short(getattr(r, f.name))}; it must be true or false")
    if not _is_finite(r.lora_alpha) or r.lora_alpha <= 0:
        raise ResultLineError(f"field 'recipe' has lora_alpha={_short(r.lora_alpha)}; it must be a number above 0")
    if key != r.key:
        raise ResultLineError(f"field 'recipe_key' {_short(key)} is not the key of the stored recipe ({r.key!r}): "
                              "the line was edited by hand or damaged")


def _locked(path: Path) -> contextlib.AbstractContextManager[None]:
    """Hold an exclusive lock beside the store while we rewrite it (common.file_lock, the package's one)."""
    return file_lock(lock_path(path))


class ResultStore:
    """Append-only JSON lines file of Measurements."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"ResultStore({str(self.path)!r})"

    def load(self) -> list[Measurement]:
        """Every valid measurement; a bad line (not JSON, or a field of the wrong type or range) is skipped
        with a warning naming file, line and field. StoreError when the store is a folder or unreadable."""
        self._check_shape()
        if not self.path.exists():
            return []
        out = []
        try:
            with open(self.path, "rb") as fh:
                for lineno, raw in enumerate(fh, start=1):
                    m = self._read_line(lineno, raw)
                    if m is not None:
                        out.append(m)
        except OSError as exc:
            raise StoreError(self._explain(exc, "read")) from None
        return out

    def _read_line(self, lineno: int, raw: bytes) -> Measurement | None:
        """One line's measurement; None (with a warning) for a blank or bad line."""
        if not raw.strip():
            return None
        try:
            return Measurement.from_dict(json.loads(raw.decode("utf-8")))
        except (ValueError, TypeError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            warnings.warn(
                f"{self.path}:{lineno}: skipped a bad result line ({type(exc).__name__}: {exc}); the other results "
                "are kept. Delete or fix that line, or re-measure its recipe with force=True (course run --force).",
                stacklevel=3,
            )
            return None

    def find(self, recipe: Recipe, env_key: str, gpus: int = 1, strategy: str = "") -> Measurement | None:
        """The latest measurement of this recipe in this environment, if any (on `gpus` processes with that
        strategy: a one-process run is never answered with a distributed one, nor the other way round)."""
        hits = [m for m in self.load() if m.recipe_key == recipe.key and m.env_key == env_key
                and m.gpus == gpus and m.strategy == strategy]
        return hits[-1] if hits else None

    def add(self, measurement: Measurement) -> None:
        """Append one measurement atomically: the file is whole before and after, never half-written.

        An invalid measurement is refused (ResultLineError) rather than stored. When the store cannot be
        written, StoreError names the path and the fix, and the line is saved to a temporary file it names.
        """
        measurement.validate()
        problem = loss_problem(measurement.losses) if measurement.status == "ok" else None
        if problem:  # a run that trained nothing is not a result (the child refuses it first: measure.check_sane)
            raise NotAResult(f"{measurement.label!r} was not stored: {problem}. Lower the learning rate "
                             f"(now {measurement.recipe.get('learning_rate')}) and measure it again.")
        line = measurement.to_json().encode() + b"\n"
        try:
            self._check_shape()
            with _locked(self.path):
                self._append(line)
        except StoreError as exc:
            raise StoreError(f"{exc}{_rescue(line, self.path)}") from None
        except LockTimeout as exc:  # another process kept the store's lock past the deadline
            raise StoreError(f"cannot write the results store now: {exc}.{_rescue(line, self.path)}") from None
        except OSError as exc:
            raise StoreError(self._explain(exc, "write") + _rescue(line, self.path)) from exc

    def _append(self, line: bytes) -> None:
        """Rewrite the store with `line` at its end, through a temporary file and an atomic rename."""
        old = self.path.read_bytes() if self.path.exists() else b""
        if old and not old.endswith(b"\n"):
            old += b"\n"
        fd, tmp = tempfile.mkstemp(prefix=".results-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(old + line)
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

    def check_writable(self) -> None:
        """Raise StoreError, naming the path and the fix, unless `add` can work here: the store is a file (or
        not there yet) in a folder that exists or can be made, where its lock file and a temporary file can
        be created, and an existing store can be read. Run it before measuring, so no result is lost."""
        self._check_shape()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(lock_path(self.path), "a"):
                pass
            fd, tmp = tempfile.mkstemp(prefix=".results-check-", dir=self.path.parent)
            os.close(fd)
            os.unlink(tmp)
            if self.path.exists():
                with open(self.path, "rb"):
                    pass
        except OSError as exc:
            raise StoreError(self._explain(exc, "write")) from None

    def _check_shape(self) -> None:
        """StoreError when the store is a folder, or a folder on its path is a file (COURSE_HOME set to a file)."""
        if self.path.is_dir():
            raise StoreError(f"the results store {self.path} is a folder, and a store is a file: pass a file path "
                             f"such as {self.path / 'results.jsonl'} (course run --store FILE).")
        folder = next((p for p in self.path.parents if p.exists()), None)
        if folder is not None and not folder.is_dir():
            raise StoreError(f"cannot keep results at {self.path}: {folder} is a file, not a folder. Point "
                             "COURSE_HOME (or --store) at a folder you can write, or move that file away.")

    def _explain(self, exc: OSError, action: str) -> str:
        """One line on why the store cannot be read or written, naming the path that failed and what to do."""
        where = exc.filename or self.path
        fix = "free some disk space there, or " if exc.errno == errno.ENOSPC else ""
        return (f"cannot {action} the results store {self.path} ({where}: {exc.strerror or exc}). To fix it, "
                f"{fix}set COURSE_HOME to a folder you can write, or pass --store with a file in one "
                "(ResultStore(path) in Python).")


def _rescue(line: bytes, store: Path) -> str:
    """Save a line the store refused to a temporary file; the sentence that says where (or that it failed)."""
    try:
        fd, where = tempfile.mkstemp(prefix="course-unsaved-", suffix=".jsonl")
        with os.fdopen(fd, "wb") as fh:
            fh.write(line)
    except OSError:
        return " The measurement could not be saved elsewhere either; measure it again once the store is fixed."
    return f" The measurement is saved in {where}: once the store works, append it with: cat {where} >> {store}"


def default_store() -> ResultStore:
    """The learner's store: $COURSE_HOME/results.jsonl."""
    return ResultStore(course_home() / "results.jsonl")


# shipped folders under reference/ that hold other records than measurements (each with its own test)
NOT_RESULTS_STORES = ("t4", "tries", "checkpointing", "own_script")


def shipped_results(folder: str = "", name: str | None = None) -> list[Measurement]:
    """Measurements shipped in course_utils/reference/<folder> (every .jsonl file, or the one named), each
    marked with the file it came from."""
    where = shipped("reference", folder)
    out: list[Measurement] = []
    if not where.is_dir():
        return out
    for item in sorted(where.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".jsonl") and (name is None or item.name == name):
            for m in ResultStore(item).load():
                m.source = f"reference: {folder + '/' if folder else ''}{item.name}"
                out.append(m)
    return out


def reference_results(name: str | None = None) -> list[Measurement]:
    """Shipped reference measurements of the chapter's techniques (from real GPUs), each with its provenance."""
    return shipped_results("", name)


def all_reference_results() -> list[Measurement]:
    """The chapter's reference runs and those of notebook 09 (reference/beyond/), together."""
    return reference_results() + shipped_results("beyond")


def measured_on(m: Measurement) -> str:
    """When a measurement was made, as 'YYYY-MM-DD HH:MM UTC' (its stored date; 'an unknown date' without one)."""
    import datetime as _dt

    try:
        when = _dt.datetime.fromisoformat(m.date).astimezone(_dt.timezone.utc)
    except (TypeError, ValueError):
        return m.date or "an unknown date"
    return when.strftime("%Y-%m-%d %H:%M UTC")


def from_store_note(measurements: list[Measurement]) -> str | None:
    """The sentence that says which of these figures were read back from the results store rather than measured
    in this run, with the date each was measured; None when all were measured now."""
    read_back: dict[str, list[str]] = {}
    for m in measurements:
        if getattr(m, "cached", False) and m.source == "measured here":  # (a stand-in without the flag: not)
            read_back.setdefault(measured_on(m), []).append(m.label)
    if not read_back:
        return None
    parts = [f"{', '.join(labels)} (measured {when})" for when, labels in read_back.items()]
    return ("From the store, not measured in this run: " + "; ".join(parts) +
            ". force=True (course run --force) measures again.")
