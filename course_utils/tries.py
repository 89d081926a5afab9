"""Issue 16's tries: changes to one optimizer step, each measured on a GPU beside the recipe it changes, in the
same lease (scripts/try_step_changes.py), shipped in reference/beyond/tries/<model>.jsonl. An experiment, not
one of notebook 08's recipes: a change joins the recipes only when it is faster, or leaner, than the recipe it
changes by more than that recipe moves between runs, and keeps its training.

Each line is one variant's run (RESULT line of the script): `run` (the lease it was measured in; the script's
--run-id), `variant`, `status` (ok, failed, timeout), the CUDA allocated and reserved peaks, tokens/s (median of
the timed steps), the losses, what torch.compile did (`compile`: frames, graphs, graph breaks and their reasons,
recompiles), the recipe, the GPU and library versions, the date and the command.

    from course_utils import tries
    tries.table()                       # every variant against its baseline in the same lease (a Table)
    tries.tried("16x1 offload, dropout 0").speed_ratio
    tries.profiled("+ Liger kernels")["gpu_busy"]   # where that step's time went, under torch.profiler
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from .common import json_lines, shipped

# the recipe each variant changes, by its batching (the variant's name starts with it)
BASELINES = {"1x16": "1x16 Liger", "16x1": "16x1 offload"}


@functools.lru_cache(maxsize=None)
def _shipped_lines(name: str, made_by: str) -> tuple:
    """The lines of reference/beyond/tries/<name>, read once."""
    path = shipped("reference", "beyond", "tries", name)
    if not path.exists():
        raise FileNotFoundError(f"nothing shipped at {path}; scripts/{made_by} measures it")
    return tuple(json_lines(path.read_text()))


def records(model: str = "llama-3.1-8b") -> tuple:
    """The shipped tries of `model`, in the order they ran (each a dict, as try_step_changes.py wrote it)."""
    return _shipped_lines(f"{model}.jsonl", "try_step_changes.py")


@dataclass(frozen=True)
class Tried:
    """One variant's run against its baseline (the recipe it changes, measured in the same lease)."""

    run: str
    variant: str
    status: str
    allocated_gib: float | None
    tokens_per_s: float | None
    baseline: str | None  # None: the lease has no finished run of it (then no ratios)
    memory_ratio: float | None  # allocated / the baseline's, in the same run
    speed_ratio: float | None  # tokens/s / the baseline's, in the same run
    same_training: bool | None  # same LoRA dropout as the baseline (and the peer); None: the record has no recipe
    what: str  # what torch.compile did, or why the run failed
    date: str | None
    count: int = 1  # the variant's runs in this lease (scripts/try_step_changes.py --rounds): medians of them


def _what(d: dict) -> str:
    """A variant's outcome in a few words: its compile counts, or its error's first sentence."""
    if d["status"] != "ok":
        found = re.findall(r"(?:Error|Exception): ([^\n]+)", d.get("error", ""))
        said = found[-1].removeprefix("Error: ").split(". ")[0] if found else d.get("error", "")[-120:]
        return f"{d['status']}: {said}"
    c = d.get("compile")
    if not c:
        return ""
    graphs = _count(c["graphs"], "graph")
    if c["graph_breaks"]:
        reason = c["break_reasons"][0] if c["break_reasons"] else ""
        called = re.search(r"function `<function (\w+)", reason)
        why = f" at {called.group(1)}(), which torch.compile may not enter" if called else ""
        return f"{graphs}, {_count(c['graph_breaks'], 'graph break')}{why}"
    return f"{graphs}, no graph break, {_count(c['recompiles'], 'recompile')}"


def _count(n: int, thing: str) -> str:
    return f"{'no' if n == 0 else n} {thing}{'' if n == 1 else 's'}"


def lease(run: str) -> str:
    """A run id's time of day, "tries-20261202-0434" -> "04:34" (the table's short name for the lease)."""
    found = re.search(r"-(\d{2})(\d{2})$", run)
    return f"{found.group(1)}:{found.group(2)}" if found else run


def tried(variant: str, run: str | None = None, model: str = "llama-3.1-8b") -> Tried:
    """A variant's runs in its latest lease (or in lease `run`) against its baseline's in that lease: the median
    tokens/s and allocated peak of each, when a lease ran them more than once (--rounds)."""
    mine = [d for d in records(model) if d["variant"] == variant and (run is None or d["run"] == run)]
    if not mine:
        raise KeyError(f"no shipped try {variant!r}{f' in {run}' if run else ''}; there are: "
                       f"{sorted({d['variant'] for d in records(model)})}")
    d = mine[-1]
    same = [x for x in mine if x["run"] == d["run"] and x["status"] == "ok"] or [d]
    name = BASELINES.get(variant.split()[0])
    if name is None:
        raise KeyError(f"try {variant!r} names no batching with a baseline ({sorted(BASELINES)})")
    bases = [b for b in records(model) if b["variant"] == name and b["run"] == d["run"] and b["status"] == "ok"]
    ok = any(x["status"] == "ok" for x in same)
    d = same[-1]
    speed, gib = (_median(same, k) if ok else None for k in ("tokens_per_s", "allocated_gib"))
    base_speed, base_gib = (_median(bases, k) for k in ("tokens_per_s", "allocated_gib"))
    what = _what(d) if bases else "; ".join(filter(None, [_what(d), f"no finished {name} in this lease"]))
    dropout = d["recipe"]["lora_dropout"] if "recipe" in d and bases else None
    same_training = None if dropout is None else dropout == bases[-1]["recipe"]["lora_dropout"]
    return Tried(d["run"], variant, d["status"], gib, speed, name if bases else None, _ratio(gib, base_gib),
                 _ratio(speed, base_speed), same_training, what, d.get("date"), len(same))


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value and base else None


def _median(lines: list, key: str) -> float | None:
    import statistics

    values = [x[key] for x in lines if x.get(key) is not None]
    return statistics.median(values) if values else None


def rows(model: str = "llama-3.1-8b") -> list[Tried]:
    """Every shipped try (baselines included) against its baseline, once per lease, in the order they first ran."""
    seen = dict.fromkeys((d["variant"], d["run"]) for d in records(model))
    return [tried(variant, run, model) for variant, run in seen]


def table(model: str = "llama-3.1-8b"):
    """rows() as a Table: jupyter shows HTML, print() text."""
    from .tables import Column, Table

    columns = [Column("variant", wrap=True), Column("lease"), Column("allocated", "GiB", ".2f"),
               Column("tokens/s", fmt=",.0f"), Column("x memory", fmt=".2f"), Column("x speed", fmt=".2f"),
               Column("same training", align="left"), Column("what happened", wrap=True)]
    body = [[r.variant, lease(r.run), r.allocated_gib, r.tokens_per_s, r.memory_ratio, r.speed_ratio,
             {True: "yes", False: "no (dropout 0)", None: "-"}[r.same_training], r.what or "-"] for r in rows(model)]
    first = records(model)[0]
    env = first.get("env") or {}
    title = (f"Changes to one step on the {env.get('device', 'GPU')} ({first.get('date', '')[:10]}, torch "
             f"{env.get('versions', {}).get('torch', '?')}), each against {' or '.join(BASELINES.values())} "
             "measured in the same lease (its start, UTC)")
    return Table(columns, body, title=title)


def profiled(label: str, model: str = "llama-3.1-8b") -> dict:
    """Where one optimizer step's time went under torch.profiler (scripts/profile_step.py on the H200, 2026-12-01;
    measurements/profile-20261201/): step_s, kernel_s (the GPU's kernels, summed), gpu_busy (their share of the
    step) and by_kind (seconds by kind of kernel). The profiler slows the host, most at 1x16 (many small ops): read
    the shares, not the speed. Shipped without that day's FLOPs arithmetic, which course_utils.limits replaces."""
    shipped_profiles = _shipped_lines(f"profile-{model}.jsonl", "profile_step.py")
    found = [d for d in shipped_profiles if d["label"] == label]
    if not found:
        raise KeyError(f"no shipped profile of {label!r}; there are: {[d['label'] for d in shipped_profiles]}")
    return found[-1]
