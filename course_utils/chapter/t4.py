"""What each notebook did under the T4 profile, read from the shipped records of scripts/gpu/t4_check.py,
and how long it takes on a real T4: arithmetic from those records and the T4's peak FLOP/s.

A record holds one notebook's run (one variant: the small model a GPU notebook picks, or its
USE_LLAMA_8B = True variant) on a bigger GPU under COURSE_PROFILE=t4, each measuring process limited
to the CPU cores of Colab's free tier. Its measurements are a T4's memory (the profile caps the
card) but not a T4's speed: the GPU computed them. So the time on a T4 is

    the record's wall time  -  the time its runs spent training there
                            +  for each run, the longer of that time and its FLOPs at the T4's peak

Everything but the training (process start-ups, model builds, the notebook's own cells) is the same
work on the same number of CPU cores, measured. A run's training takes a T4 at least as long as its
FLOPs need at the T4's peak, and at least as long as it took here, where the small model's steps wait
on the CPU launching kernels (the same CPU work on a T4). Both are lower bounds.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from course_utils.common import json_lines, shipped
from course_utils.estimate.limits import Flops, flops_per_token
from course_utils.machine import PROFILES
from course_utils.recipe import Recipe
from course_utils.results import Measurement
from course_utils.show.tables import wrap

RECORDS = shipped("reference", "t4", "t4-check.jsonl")
VARIANTS = {"small": "the default GPU path", "llama-8b": "USE_LLAMA_8B = True"}
NO_RECORD = {"11_more_than_one_gpu": "its runs need two GPUs (Kaggle's 2 x T4), and the T4 check runs each notebook "
                                    "on one virtual T4, where they are skipped (the check of 2026-12-03 19:03 ran its "
                                    "estimates, exercise and quiz through: scripts/gpu/logs/t4-20261203-1903); no "
                                    "record of a run was made, and none is invented"}
# Notebooks made by splitting 07 and 08 (issue 30) that the T4 check has not run yet: no record, and none is invented
# (the records of 08_beyond_the_recipe stay as shipped, under the name of the notebook they ran). The lead runs
# `python scripts/gpu/t4_check.py --notebooks 07,08,09,10` on a GPU, ships the records and empties this.
PENDING_T4: tuple[str, ...] = ()  # emptied 2026-12-03: the check at 15:03 (scripts/gpu/logs/t4-20261203-1503) ran them
# Variants a notebook has no record of, and why (the check did not run them; no record is invented or borrowed)
NOT_CHECKED = {("10_toward_the_limit", "llama-8b"): "it has no USE_LLAMA_8B variant (it trains nothing: it reads the shipped runs)",
               ("09_beyond_the_recipe", "llama-8b"): "the check of 2026-12-03 19:12 measured 6 of its 7 runs (all fit), then "
                                                     "the device call's deadline stopped it at 535 s, building the 7th "
                                                     "(scripts/gpu/logs/t4-20261203-1903): it needs a check of two calls; "
                                                     "the record of 08_beyond_the_recipe ran the same recipes"}
NOT_YET = "not yet checked under the T4 profile (a notebook new since the last T4 check; no record yet)"
# Records made before issue 30's split (dated before SPLIT_DATE) of a notebook it renamed or cut, and where their
# lessons went: the README's table notes them (kept as shipped); a record made after the split needs no note
SPLIT_DATE = "2026-12-03"
SPLIT_FROM = {"08_beyond_the_recipe": "the notebook before issue 30's split, now 09_beyond_the_recipe and 10_toward_the_limit",
              "07_complete_recipe": "checked before issue 30's split, when the notebook also trained, reloaded and merged "
                                    "the adapter (now notebook 08_after_training)"}

# Shipped records whose runs are known to be wrong (notebook, variant, date): kept as what the check saw, marked
# in the README's table, left out where the course draws conclusions from the runs (scripts/gpu/logs/ says more).
DEFECTS = {
    ("07_complete_recipe", "llama-8b", "2026-12-01T19:32:50+00:00"):
        "its 4-bit rungs were 'does not fit': the notebook's kernel kept part of the card after training "
        "(their errors say how much; fixed since: that training runs in a process of its own, and the kernel "
        "gives back the block cuBLAS workspaces held after the script's training; re-checked on 2 cores on "
        "2026-12-02: the kept adapter trained and merged in processes of their own and every ladder rung was "
        "measured, then the call ended while the source recipe was being built, scripts/gpu/logs/t4-20261202-0215; on 8 "
        "cores at 04:44 it stopped in the same cell, so the notebook needs more than one 600 s device call there, "
        "scripts/gpu/logs/t4-20261202-0444)",
    ("06_sequence_length_and_batch", "llama-8b", "2026-12-01T19:32:50+00:00"):
        "each measuring process was allowed less of the card than the rest of the check had left it (its notes "
        "say how much): the kernel had built the random-weight 8B folder on the GPU and kept 4.51 GiB (fixed since; "
        "re-checked on 2 cores on 2026-12-02: every cell before the quiz ran, each measuring process allowed the "
        "card less only CUDA contexts and the profile's headroom, every sweep as on 2026-12-01 23:03; the quiz "
        "cell failed only for lack of ipywidgets on the GPU machine, scripts/gpu/logs/t4-20261202-0215)",
}


def _key(rec: dict) -> tuple[str, str, str]:
    """How DEFECTS and OVER_LIMIT name a record: (notebook, variant, date)."""
    return rec["notebook"], rec["variant"], rec["date"]


def defect(rec: dict) -> str:
    """Why the record's runs are known to be wrong, or ''."""
    return DEFECTS.get(_key(rec), "")


# Newest records whose default GPU path took longer than T4_LIMIT_S, and what the notebook cut since (not yet
# re-checked): (notebook, variant, date) -> the change. tests/test_t4check.py accepts an over-limit record only
# here, and an entry only while its record is the newest and over the limit: the next check settles it.
OVER_LIMIT: dict = {}  # none: notebook 07's default path ran within T4_LIMIT_S in the check of 2026-12-03 15:03


def over_limit(rec: dict) -> str:
    """What changed since a record over T4_LIMIT_S (OVER_LIMIT), or ''."""
    return OVER_LIMIT.get(_key(rec), "").format(limit=T4_LIMIT_S // 60)


T4_LIMIT_S = 600  # each notebook's default GPU path should finish within 10 minutes on a T4
T4_PEAK_FLOPS = PROFILES["t4"].peak_flops


class T4CheckError(LookupError):
    """No shipped T4-check record for what was asked; the message says how to make one."""


def records(path: Path = RECORDS, usable=None) -> list[dict]:
    """Every shipped record, the newest for each notebook and variant (of those `usable` accepts)."""
    latest: dict[tuple[str, str], dict] = {}
    for rec in _parsed(path.read_text()) if path.exists() else ():
        if usable is not None and not usable(rec):
            continue
        key = (rec["notebook"], rec["variant"])
        if key not in latest or rec["date"] >= latest[key]["date"]:
            latest[key] = rec
    newest = sorted(latest.values(), key=lambda r: (r["variant"] != "small", r["notebook"]))
    return copy.deepcopy(newest)  # copies: the parsed lines are kept for the next call (as quiz_bank does)


@functools.lru_cache(maxsize=4)
def _parsed(text: str) -> list[dict]:
    """The records of a file's text, parsed once per text (facts.py reads them for every T4 figure it renders)."""
    return json_lines(text)


def record_for(notebook: str, variant: str = "small", path: Path = RECORDS, usable=None) -> dict:
    """The newest record of one notebook ('01_gradient_checkpointing' or '01') and variant (that
    `usable(record)` accepts, when given)."""
    if notebook in NO_RECORD:
        raise T4CheckError(f"no T4-check record for notebook {notebook!r}: {NO_RECORD[notebook]}.")
    if notebook in PENDING_T4:
        raise T4CheckError(f"notebook {notebook!r}: {NOT_YET}; make one on a CUDA GPU with: python "
                           f"scripts/gpu/t4_check.py --out {path} --notebooks {notebook[:2]} --variants {variant}")
    if (notebook, variant) in NOT_CHECKED:
        raise T4CheckError(f"no T4-check record for notebook {notebook!r} ({variant}): {NOT_CHECKED[notebook, variant]}")
    for rec in records(path, usable):  # a name matches itself only; a bare number ('07') any record so numbered
        if rec["variant"] == variant and (rec["notebook"] == notebook or rec["notebook"][:2] == notebook):
            return rec
    raise T4CheckError(f"no T4-check record for notebook {notebook!r} ({variant}) in {path}; make one on a CUDA GPU "
                       f"with: python scripts/gpu/t4_check.py --out {path} --notebooks {notebook[:2]} --variants {variant}")


def run_name(m: Measurement) -> str:
    """A run's label, with checkpointing named where a sweep's label ('max_seq_length=64') leaves it out."""
    return m.label + (", ckpt" if "=" in m.label and m.recipe.get("gradient_checkpointing") else "")


def runs(rec: dict) -> list[Measurement]:
    """The record's measurements, each with the record's environment (the T4 profile on its GPU)."""
    return [Measurement.from_dict({**m, "env": rec["env"], "source": f"T4 check {rec['date'][:10]}"})
            for m in rec.get("runs", [])]


def trained_tokens(recipe: Recipe) -> int:
    """Tokens one run trains: every step's micro-batches, every sequence full (packed data)."""
    return recipe.steps * recipe.micro_batch * recipe.grad_accum * recipe.max_seq_length


# ---------------------------------------------------------------------------------------------
# the time on a T4
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunTime:
    label: str
    precision: str
    tokens: int
    flops: Flops | None  # None: the run did not fit, so it trained nothing
    flops_s: float  # its FLOPs at the T4's peak for its precision
    trained_s: float  # what it spent training on the profiled GPU (build excluded)
    overhead_s: float  # its process start-up and model build, measured

    @property
    def t4_s(self) -> float:
        """Its training on a T4, at least: the longer of its FLOPs at the peak and its time here."""
        return max(self.flops_s, self.trained_s)


@dataclass(frozen=True)
class TimeBudget:
    notebook: str
    variant: str
    wall_s: float  # the whole notebook under the profile, measured
    runs: tuple[RunTime, ...]
    gpu: str
    cores: int | None
    date: str
    ran_through: bool = True
    first_failure: str = ""

    @property
    def t4_s(self) -> float:
        """The notebook on a T4: its measured wall time with the runs' training moved to the T4's peak."""
        return self.wall_s - sum(r.trained_s for r in self.runs) + sum(r.t4_s for r in self.runs)

    def lines(self) -> list[str]:
        cores = f", {self.cores} CPU cores per run as on Colab" if self.cores else ""
        out = [f"{VARIANTS[self.variant]}: {len(self.runs)} runs (T4 check, {self.gpu}, {self.date[:10]}{cores})"]
        if not self.ran_through:
            out.append(f"  it did not run to the end: {self.first_failure.splitlines()[0][:80] if self.first_failure else '?'}")
        out.append(f"  {'recipe':32} {'tokens':>7} {'GFLOP/tok':>9} {'TFLOP':>6} {'T4 peak':>12} {'here':>7} {'start+build':>11}")
        for r in self.runs:
            if r.flops is None:
                out.append(f"  {r.label[:32]:32} {'does not fit: nothing trained':>44} {r.overhead_s:9.1f} s")
                continue
            peak = f"{r.flops_s:5.1f} s {r.precision}"
            out.append(f"  {r.label[:32]:32} {r.tokens:7,} {r.flops.per_token / 1e9:9.2f} {r.tokens * r.flops.per_token / 1e12:6.1f} "
                       f"{peak:>12} {r.trained_s:5.1f} s {r.overhead_s:9.1f} s")
        trained = sum(r.trained_s for r in self.runs)
        out.append(f"  wall time {self.wall_s:.0f} s - {trained:.0f} s training here + {sum(r.t4_s for r in self.runs):.0f} s "
                   f"(each run's longer time) = {self.t4_s:.0f} s: at least {_minutes(self.t4_s)} on a T4")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _peak_key(precision: str) -> str:
    return "fp16" if precision in ("fp16", "bf16") else "fp32"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def all_measured_in_it(rec: dict) -> bool:
    """True when every run of the record was measured during that check, none read back from a store
    an earlier check had filled (its wall time then covers all of them)."""
    return all(m.get("date", "") >= rec["date"] for m in rec.get("runs", []))  # a notebook that measures nothing: none


def time_budget(notebook: str, variant: str = "small", path: Path = RECORDS) -> TimeBudget:
    """The arithmetic of how long one notebook (one variant) takes on a T4, from its newest shipped
    record whose runs were all measured in that check."""
    rec = record_for(notebook, variant, path, all_measured_in_it)
    out = []
    for m in runs(rec):
        recipe = m.recipe_obj
        overhead = m.startup_s + m.build_s
        if not m.fits:
            out.append(RunTime(run_name(m), m.precision, 0, None, 0.0, 0.0, m.startup_s + m.duration_s))
            continue
        f = flops_per_token(recipe)
        tokens = trained_tokens(recipe)
        out.append(RunTime(run_name(m), m.precision, tokens, f, tokens * f.per_token / T4_PEAK_FLOPS[_peak_key(m.precision)],
                           max(0.0, m.duration_s - m.build_s), overhead))
    return TimeBudget(rec["notebook"], variant, rec["wall_s"], tuple(out), rec["env"]["device"], rec.get("cores_per_run"),
                      rec["date"], rec["ran_through"], rec.get("first_failure", ""))


def how_long_on_a_t4(notebook: str) -> str:
    """Both variants' arithmetic, for the cell where a notebook introduces its run (or why there is none)."""
    if notebook in NO_RECORD:
        return wrap(f"On a free T4: not checked. Notebook {notebook} has no T4-check record: {NO_RECORD[notebook]}.")
    if notebook in PENDING_T4:
        return wrap(f"On a free T4: {NOT_YET}.")
    parts = [f"On a free T4. T4 peak: the run's FLOPs at {T4_PEAK_FLOPS['fp16'] / 1e12:.0f} TFLOP/s (fp16) or "
             f"{T4_PEAK_FLOPS['fp32'] / 1e12:.1f} (fp32), the T4's datasheet peaks;",
             "here: its training on the profiled GPU, waiting on the same 2 CPU cores. A T4 needs at least the longer."]
    for variant in VARIANTS:
        try:
            parts.append(str(time_budget(notebook, variant)))
        except T4CheckError as exc:
            parts.append(f"{VARIANTS[variant]}: {exc}")
    return wrap("\n".join(parts))  # at most 100 characters a line


# ---------------------------------------------------------------------------------------------
# the figures beside the H200 reference
# ---------------------------------------------------------------------------------------------
def profile_table(notebook: str, variant: str = "small", path: Path = RECORDS) -> str:
    """The record's memory figures as a table, labelled for what they are (or that there is none yet)."""
    if notebook in PENDING_T4:
        return wrap(f"Notebook {notebook}: {NOT_YET}.")
    rec = record_for(notebook, variant, path)
    ms = runs(rec)
    model = ", ".join(rec.get("models", [])) or "-"
    lines = [f"{rec['env']['device']} ({model}, {rec['date'][:10]}): memory as on a T4, speed not a T4's",
             f"  card peak {rec['card_peak_gib']:.2f} GiB of {rec['env']['total_memory_gib']:.2f} "
             f"(every process of the notebook, CUDA contexts included); "
             f"{'ran through' if rec['ran_through'] else 'did not run through: ' + rec['first_failure'][:80]}",
             f"  {'recipe':34} {'precision':9} {'allocated GiB':>13} {'reserved GiB':>12}"]
    for m in ms:
        if m.fits:
            lines.append(f"  {run_name(m)[:34]:34} {m.precision:9} {(m.cuda_max_allocated or 0) / 2**30:13.2f} "
                         f"{(m.cuda_max_reserved or 0) / 2**30:12.2f}")
        else:
            lines.append(f"  {run_name(m)[:34]:34} {m.precision:9} {'does not fit':>13}")
    return wrap("\n".join(lines))  # at most 100 characters a line


def strip_env(measurement: dict) -> dict:
    """A stored measurement without its environment (the record holds it once)."""
    return {k: v for k, v in measurement.items() if k not in ("env",)}


def markdown_table(path: Path = RECORDS) -> str:
    """The README's table of the shipped check: per notebook and variant, ran through, wall time,
    the time on a T4 by the arithmetic above, and the peak of the whole card."""
    newest = {(r["notebook"], r["variant"]): r for r in records(path)}
    envs = {json.dumps({k: r["env"].get(k) for k in ("device", "driver", "cuda", "versions")}, sort_keys=True)
            for r in newest.values()}
    where = []
    for env in map(json.loads, sorted(envs)):
        v = env["versions"]
        where.append(f"{env['device']} (driver {env['driver']}, CUDA {env['cuda']}; "
                     + ", ".join(f"{k} {v[k]}" for k in ("torch", "transformers", "trl", "peft", "bitsandbytes") if k in v)
                     + ")")
    when = []
    for v in VARIANTS:  # each variant's check times: they can come from different checks (and code)
        stamps = sorted(r["date"][:16].replace("T", " ") for (_, var), r in newest.items() if var == v)
        if stamps:
            span = stamps[0] if stamps[0] == stamps[-1] else f"{stamps[0]} to {stamps[-1][11:]}" \
                if stamps[0][:10] == stamps[-1][:10] else f"{stamps[0]} to {stamps[-1]}"
            when.append(f"{VARIANTS[v]} {span} UTC")
    head = ["Checked on " + "; ".join(where) + ": " + "; ".join(when) + ".", "", "| notebook | " + " | ".join(f"{VARIANTS[v]}: ran through, wall s, T4 s at least, card peak GiB"
                                          for v in VARIANTS) + " |",
            "|---|" + "---|" * len(VARIANTS)]
    rows, notes = [], []
    for nb in sorted({n for n, _ in newest} | set(PENDING_T4)):
        cells = []
        if nb in SPLIT_FROM and all(r["date"] < SPLIT_DATE for (n, _), r in newest.items() if n == nb):
            notes.append(f"{len(notes) + 1}. {nb}: {SPLIT_FROM[nb]}.")
            nb = f"{nb} (note {len(notes)})"
        for v in VARIANTS:
            rec = newest.get((nb.split(" ")[0], v))
            if rec is None:
                why = NOT_CHECKED.get((nb.split(" ")[0], v))
                notes += [f"{len(notes) + 1}. {nb.split(' ')[0]}, {VARIANTS[v]}: {why}."] if why else []
                cells.append("not yet checked" if nb in PENDING_T4 else f"not checked{f' (note {len(notes)})' if why else ''}")
                continue
            try:
                t4 = f"{time_budget(rec['notebook'], v, path).t4_s:.0f}"
            except T4CheckError:
                t4 = "-"
            why = defect(rec) or over_limit(rec)
            mark = f" (note {len(notes) + 1})" if why else ""
            notes += [f"{len(notes) + 1}. {rec['notebook']}, {VARIANTS[v]}: ran through, but {why}."] if mark else []
            cells.append(f"{'yes' if rec['ran_through'] else 'no'}{mark}, {rec['wall_s']:.0f}, {t4}, "
                         f"{rec['card_peak_gib']:.2f}")
        rows.append(f"| {nb} | " + " | ".join(cells) + " |")
    return "\n".join(head + rows + ([""] + notes if notes else []))


def run_of(notebook: str, label: str, variant: str = "small"):
    """A Measurement of the shipped T4 check: `notebook` (its number, '07', or name), the run's label (the facts'
    t4(...), and the troubleshooting guide's logged errors)."""
    if "_" not in notebook:
        names = sorted({r["notebook"] for r in records() if r["notebook"].startswith(notebook)})
        if len(names) != 1:
            raise ValueError(f"no single notebook numbered {notebook!r}")
        notebook = names[0]
    for m in runs(record_for(notebook, variant)):
        if m.label == label:
            return m
    raise ValueError(f"the T4 check of {notebook} ({variant}) has no run labelled {label!r}")

