"""Notebook 10 (notebooks/10_toward_the_limit.ipynb, quizzes/10_toward_the_limit.yaml): Toward the limit: the peer run (Unsloth measured in the same run as our recipes),
how far a measured step is from what the GPU allows, and the tries below.

Issue 16's tries: changes to one optimizer step, each measured on a GPU beside the recipe it changes, in the
same lease (scripts/gpu/try_step_changes.py), shipped in reference/beyond/tries/<model>.jsonl. An experiment, not
one of notebook 09's recipes: a change joins the recipes only when it is faster, or leaner, than the recipe it
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
import json
import re
from dataclasses import dataclass

from course_utils.chapter.shipped_runs import (batching, by_label, describe_reference, format_rows, loss_table,
                                               peer_reference, reference, rows as ratio_rows, source)
from course_utils.common import PEERS, GiB, json_lines, peer_name, shipped
from course_utils.estimate import limits
from course_utils.estimate.limits import against, datasheet_peak, flops_per_token, memory_floor
from course_utils.recipe import Recipe
from course_utils.show.tables import Column, Table, wrap

def shipped_runs(model: str = "llama-3.1-8b", run: str = "") -> list:
    """reference(model, run), and in run "peer-run" the peer's runs of that run too."""
    return reference(model, run) + (peer_reference(model) if run == "peer-run" else [])


def peer_table(ours: dict, peer: str = "unsloth") -> Table:
    """Our runs beside a peer's, as a Table: `ours` maps the peer's batching ("1x16", "16x1") to our measurements
    to set beside it. Allocated peak and tokens/s, and who is ahead on each."""
    p, rows = peers()[peer], []
    for run in p["runs"]:
        rows.append([f"{p['version']}, {run['batch']}", run["peak_allocated_gib"], run["tokens_per_s"], ""])
        for m in ours.get(run["batch"], []):
            gib = m.cuda_max_allocated / GiB
            mem = "less memory" if gib < run["peak_allocated_gib"] else "more memory"
            speed = "faster" if m.tokens_per_s > run["tokens_per_s"] else "slower"
            rows.append([f"  {m.label}", gib, m.tokens_per_s, f"{mem} ({gib / run['peak_allocated_gib'] - 1:+.0%}), "
                         f"{speed} ({m.tokens_per_s / run['tokens_per_s'] - 1:+.0%})"])
    return Table([Column("run", short=" ", wrap=True), Column("allocated", "GiB", ".2f"),
                  Column("tokens/s", fmt=",.0f"), Column("against the peer", short=" ")], rows)


def peer_comparison(ours: dict, peer: str = "unsloth") -> str:
    """peer_table as text (at most 100 characters a line)."""
    return str(peer_table(ours, peer))


def peers(model: str = "llama-3.1-8b") -> dict:
    """Figures for other stacks (Unsloth), with where they come from: {name: {version, hardware, model, settings,
    source, date, command, runs: [{batch, micro_batch, grad_accum, peak_allocated_gib, tokens_per_s, ...}]}}.
    The runs measured by scripts/gpu/peer_unsloth.py (reference/beyond/peers/<model>.jsonl) when they ship, else the
    figures quoted in reference/beyond/peers.json."""
    measured = peer_reference(model)
    if measured:
        return {name: peer_summary([m for m in measured if peer_name(m) == name])
                for name in dict.fromkeys(peer_name(m) for m in measured)}
    path = shipped("reference", "beyond", "peers.json")
    return json.loads(path.read_text()) if path.is_file() else {}


# ---------------------------------------------------------------------------------------------
# the peer in the benchmark: Unsloth, measured by scripts/gpu/peer_unsloth.py in its own environment
# ---------------------------------------------------------------------------------------------
PEER_BATCHES = ((16, 1), (1, 16))  # the peer's settings: all 16 x 512 tokens in one micro-batch; the chapter's 1 x 16
# issue 16's targets: at each of the peer's settings, a recipe of ours at that batching, measured in the same run
PEER_MAX_MEMORY_RATIO = 0.85
PEER_MIN_SPEEDUP = 1.05


def peer_recipe(model: str, micro_batch: int, grad_accum: int, steps: int, label: str = "") -> Recipe:
    """What the peer trains, as a Recipe: the source recipe's model, LoRA, data, sequence and learning rate,
    one warm-up step, adamw_8bit, the frozen weights kept in bf16 (no peft upcast), at this batching."""
    return source(model, steps).with_(optimizer="adamw_8bit", prepare_kbit=False, micro_batch=micro_batch,
                                      grad_accum=grad_accum, label=label)


def latest_peer_runs(measurements: list, name: str, model: str, steps: int, run_id: str | None = None) -> list:
    """The latest run of peer `name` at each of PEER_BATCHES among `measurements` (of run `run_id` if given)."""
    out = []
    for mb, ga in PEER_BATCHES:
        key = peer_recipe(model, mb, ga, steps).key
        hits = [m for m in measurements if m.recipe_key == key and peer_name(m) == name
                and (run_id is None or m.run_id == run_id)]
        out += hits[-1:]
    return out


def peer_checks(ours: list, peer_runs: list) -> list[tuple[str, list[str], bool]]:
    """(target, what each recipe of ours at that batching measured, met?) at each of the peer's settings: allocating
    <= PEER_MAX_MEMORY_RATIO x the peer's peak at >= PEER_MIN_SPEEDUP x its tokens/s, met when any recipe meets
    both; the recipe that meets more of the two targets first, then the one that misses the farther one by less."""
    out = []
    for p in peer_runs:
        if not (p.fits and p.cuda_max_allocated and p.tokens_per_s):
            continue
        target = (f"{batching(p)}: allocated <= {PEER_MAX_MEMORY_RATIO:.2f} x and tokens/s >= "
                  f"{PEER_MIN_SPEEDUP:.2f} x {p.label}")
        same = [m for m in ours if _timed_on_gpu(m) and batching(m) == batching(p)]
        if not same:
            out.append((target, [f"no recipe of ours at {batching(p)} in this run"], False))
            continue

        def ratios(m):
            return m.cuda_max_allocated / p.cuda_max_allocated, m.tokens_per_s / p.tokens_per_s

        def standing(m):  # (targets met, the factor by which the farther one is missed: >= 1 when both are met)
            mem, speed = ratios(m)
            return ((mem <= PEER_MAX_MEMORY_RATIO) + (speed >= PEER_MIN_SPEEDUP),
                    min(PEER_MAX_MEMORY_RATIO / mem, speed / PEER_MIN_SPEEDUP))

        ranked = sorted(same, key=standing, reverse=True)
        out.append((target, [f"{m.label}: {ratios(m)[0]:.2f} x memory, {ratios(m)[1]:.2f} x speed" for m in ranked],
                    standing(ranked[0])[0] == 2))
    return out


def peer_check_lines(ours: list, peer_runs: list) -> list[str]:
    """The peer targets as lines: MET or MISSED and the target, then each recipe of ours at that batching, indented."""
    out = []
    for target, parts, ok in peer_checks(ours, peer_runs):
        out.append(f"{'MET   ' if ok else 'MISSED'}  {target}")
        out += [f"        {part}" for part in parts]
    return out


def peer_run_report(model: str = "llama-3.1-8b", run: str = "peer-run") -> str:
    """The benchmark table of a shipped peer run (our recipes and the peer's, one run): where and how it was
    measured, the table with ratios to its first recipe and to the peer, and the peer targets. run: "peer-run"
    (issue 16's, beyond/peers/) or a check run with the peer inside (issue 31's "peer1", beyond/checks/)."""

    both = shipped_runs(model, run)
    ours, theirs = [m for m in both if not peer_name(m)], [m for m in both if peer_name(m)]
    if not ours or not theirs:
        return f"no peer run of {model} ships (scripts/gpu/beyond_recipe.py --set peer --peers unsloth makes one)"
    name = peer_name(theirs[0])
    v = theirs[0].env.get("versions", {})
    peer_line = (f"{name} {v.get(name)} in a site directory of its own: transformers {v.get('transformers')}, "
                 f"trl {v.get('trl')}, datasets {v.get('datasets')}")
    return (describe_reference(ours) + "\n" + peer_line + "\n\n```\n"
            + format_rows(ratio_rows(ours, peers=theirs))
            + "\n\n" + "\n".join(peer_check_lines(ours, theirs)) + "\n\n" + str(loss_table(ours + theirs)) + "\n```")


def peer_summary(runs: list) -> dict:
    """One peer's measured runs in the shape of peers.json, with their provenance."""
    first, name = runs[0], peer_name(runs[0])
    return dict(
        version=f"{name} {first.env.get('versions', {}).get(name, '?')}", hardware=first.env.get("device", "?"),
        model=f"{first.recipe['model']} (random weights with its published shape)",
        settings=", ".join(x for x in first.recipe_obj.describe().split(", ") if x != batching(first)),
        source=f"{first.source}: measured by scripts/gpu/peer_unsloth.py in its own environment",
        date=first.date, command=first.command, measured=True,
        runs=[dict(batch=batching(m), micro_batch=m.recipe["micro_batch"], grad_accum=m.recipe["grad_accum"],
                   peak_allocated_gib=round(m.cuda_max_allocated / GiB, 2),
                   peak_reserved_gib=round((m.cuda_max_reserved or 0) / GiB, 2),
                   tokens_per_s=round(m.tokens_per_s), losses=m.losses, label=m.label)
              for m in runs if _timed_on_gpu(m)],
    )


# ---------------------------------------------------------------------------------------------
# toward the limit (issue 16): each run against its compute limit and its memory floor (course_utils.limits)
# ---------------------------------------------------------------------------------------------
STRETCH_LIMIT_FRACTION = 0.75  # the stretch goal: 75% of the checkpointed limit at 16x1 ...
STRETCH_MAX_GIB = 7.0  # ... within 7 GiB allocated


def _timed_on_gpu(m) -> bool:
    """A run that can stand against the limit and the floor: it fit, and has a CUDA allocated peak and a speed."""
    return bool(m.fits and m.cuda_max_allocated and m.tokens_per_s)


def limit_rows(measurements: list, peak_flops: float | None = None) -> list:
    """limits.Against for each run that fits (at `peak_flops`, else its GPU's datasheet peak)."""
    return [against(m, peak_flops) for m in measurements if _timed_on_gpu(m)]


def toward(label: str, run: str = "", model: str = "llama-3.1-8b", peak: float | None = None):
    """A shipped run (reference(model, run); with run="peer-run" the peer's runs too, by their labels) against its
    compute limit at `peak` FLOP/s (else its GPU's datasheet peak) and its memory floor: a limits.Against
    (.fraction, .floor_gib, ...)."""
    found = by_label(shipped_runs(model, run))
    if label not in found:
        raise KeyError(f"no {run or 'side-by-side'} run of notebook 09 labelled {label!r}; there are: {sorted(found)}")
    rows = limit_rows([found[label]], peak)
    if not rows:
        raise ValueError(f"the {run or 'side-by-side'} run {label!r} has no allocated peak and speed to set against "
                         "the limit (it did not fit, or was not timed)")
    return rows[0]


def limit_table(table: list) -> Table:
    """limit_rows as a Table: tokens/s against the compute limit, allocated against the memory floor."""
    columns = [Column("recipe", wrap=True), Column("tokens/s", fmt=",.0f"), Column("GFLOP", "/token", ".2f"),
               Column("limit", "tokens/s", ",.0f"), Column("of limit", fmt=".1%"), Column("allocated", "GiB", ".2f"),
               Column("floor", "GiB", ".2f"), Column("x floor", fmt=".2f")]
    return Table(columns, [[r.label, r.tokens_per_s, r.gflop_per_token, r.limit_tokens_per_s, r.fraction,
                            r.allocated_gib, r.floor_gib, r.over_floor] for r in table])


def toward_the_limit(measurements: list, peak_flops: float | None = None, table: bool = True) -> str:
    """The FLOPs-per-token arithmetic and the memory floor of the first run's recipe, the peak they are read at, and
    (with `table`) every run against both (at most 100 characters a line). A notebook shows the runs as a Table
    instead (table=False, then display(limit_table(limit_rows(...))): HTML in Jupyter)."""

    ok = [m for m in measurements if _timed_on_gpu(m)]
    if not ok:
        return "no run that fits"
    first = ok[0]
    f = flops_per_token(first.recipe_obj)
    device = first.env.get("device", "?")
    peak = peak_flops if peak_flops is not None else datasheet_peak(device, first.precision or "bf16")
    out = f.lines()
    if peak:
        precision = first.precision or "bf16"
        where = "as given" if peak_flops is not None else f"the {device} datasheet's dense {precision} peak"
        try:
            rate = limits.measured_peak(device, first.precision or "bf16")
            measured = (f"scripts/gpu/peak_matmul.py measured {rate.tflops:,.1f} TFLOP/s on an {device} ({rate.size}-cube "
                        f"{rate.dtype} matmul, {rate.date[:10]}), which allows {rate.flops_per_s / f.total:,.0f} "
                        "tokens/s")
        except KeyError:
            measured = "scripts/gpu/peak_matmul.py measures one"
        out.append(wrap(f"compute limit: {peak / 1e12:,.0f} TFLOP/s ({where}) / {f.total / 1e9:.2f} GFLOP per token "
                        f"= {peak / f.total:,.0f} tokens/s. A real matmul runs below a datasheet's peak: {measured}; "
                        "and the step has work that is not matmuls."))
    else:
        out.append(f"compute limit: no datasheet peak for {device} here (give one with peak_flops)")
    with_table = memory_floor(first.recipe_obj.with_(offload_embeddings=False))
    without = memory_floor(first.recipe_obj.with_(offload_embeddings=True))
    out.append("memory floor: the weights on the GPU (the input embeddings unless kept in CPU memory)")
    out += with_table.lines()
    if without.total != with_table.total:
        out.append(f"  {'without the input embeddings':<38}{without.total / GiB:6.2f} GiB")
    if table:
        out += ["", str(limit_table(limit_rows(ok, peak_flops)))]
    return "\n".join(out)

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
    count: int = 1  # the variant's runs in this lease (scripts/gpu/try_step_changes.py --rounds): medians of them


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
    # before the probe's eager stance (child.py, 2026-12-07) the tracked step's dispatch mode made torch.compile skip
    # the compiled code for good: the timed steps ran eagerly
    eager = ", timed eagerly" if c["graphs"] and (d.get("date") or "")[:10] <= "2026-12-07" else ""
    return f"{graphs}, no graph break, {_count(c['recompiles'], 'recompile')}{eager}"


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
    """Where one optimizer step's time went under torch.profiler (scripts/gpu/profile_step.py on the H200, 2026-12-01;
    scripts/gpu/logs/profile-20261201/): step_s, kernel_s (the GPU's kernels, summed), gpu_busy (their share of the
    step) and by_kind (seconds by kind of kernel). The profiler slows the host, most at 1x16 (many small ops): read
    the shares, not the speed. Shipped without that day's FLOPs arithmetic, which course_utils.limits replaces."""
    shipped_profiles = _shipped_lines(f"profile-{model}.jsonl", "profile_step.py")
    found = [d for d in shipped_profiles if d["label"] == label]
    if not found:
        raise KeyError(f"no shipped profile of {label!r}; there are: {[d['label'] for d in shipped_profiles]}")
    return found[-1]


def peer_repeats(model: str = "llama-3.1-8b", runs: tuple[str, ...] = ("peer1", "peer2")) -> Table:
    """The spread between runs with the peer inside (issue 31's "peer1" and "peer2", beyond/checks/): each recipe's
    tokens/s in each run and its ratio to the peer at its batching in that run ("-": that run has no such process)."""
    per = {run: shipped_runs(model, run) for run in runs}
    body = []
    for label in dict.fromkeys(m.label for ms in per.values() for m in ms):
        row = [label]
        for ms in per.values():
            m = next((x for x in ms if x.label == label and _timed_on_gpu(x)), None)
            peer = next((p for p in ms if peer_name(p) and m and batching(p) == batching(m) and _timed_on_gpu(p)), None)
            row += [m.tokens_per_s if m else None, m.tokens_per_s / peer.tokens_per_s if m and peer else None]
        body.append(row)
    ids = [next((m.run_id for m in ms), run) for run, ms in per.items()]
    columns = [Column("recipe", wrap=True)] + [c for i in ids for c in (
        Column(f"tokens/s, {i}", short=f"tokens/s\n({i.rsplit('-', 1)[0]})", fmt=",.0f"),
        Column(f"x peer, {i}", short=f"x peer\n({i.rsplit('-', 1)[0]})", fmt=".2f"))]
    return Table(columns, body, title=f"the same command run {len(runs)} times: " + ", ".join(ids)
                 + "; x peer: against the peer at the same batching in the same run")
