"""Notebook 09 (notebooks/09_beyond_the_recipe.ipynb, "Micro-batch 1: the host's work"): what the host does per micro-batch at 1 x 16, counted by scripts/gpu/count_launches.py, and each change tried on it measured before and after in one run.

Issue 31's count runs ship in reference/beyond/tries/counts-<model>.jsonl, one line per process: its variant (ours,
a change on ours, or Unsloth), the operators, launches and waits of its profiled micro-batches, its timed tokens/s,
its losses, the GPU and the versions, the date and the command. Each variant of a run ran in fresh processes,
interleaved with the others, on a GPU with nothing else on it unless the line says what ran `beside` it.

    from course_utils.chapter import host_work
    host_work.changes_table()              # every change tried, before and with it, in the run that measured it
    host_work.host_table("counts-20261207-norm")   # one run: each variant, Unsloth among them
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from course_utils.chapter.toward_the_limit import _shipped_lines
from course_utils.show.tables import Column, Table

# count_launches.py's variants, in the order a table shows them, with the names it shows ("+ reentrant": on fused LoRA)
HOST_VARIANTS = {"ours": "ours", "ours-lean": "+ lean host", "ours-fused": "+ fused LoRA",
                 "ours-fused-lean": "+ fused LoRA + lean host", "ours-fused-reentrant-ops": "old dequant",
                 "ours-fused-reentrant": "+ reentrant", "ours-fused-reentrant-norm": "+ F.rms_norm",
                 "ours-fused-reentrant-rope": "+ compiled RoPE",
                 "ours-fused-reentrant-norm-rope": "+ F.rms_norm + compiled RoPE",
                 "ours-fused-compiled": "+ fused LoRA, layers compiled",
                 "ours-fused-reentrant-compiled": "+ layers compiled",
                 "ours-fused-reentrant-compiled-inside": "+ compiled inside ckpt",
                 "ours-fused-reentrant-compiled-inside-noguards": "+ compiled inside, no guards",
                 "ours-fused-reentrant-compiled-inside-graphs": "+ compiled inside, CUDA graphs",
                 "ours-fused-reentrant-latescale": "+ reentrant, scaled late", "fast-fused": "16 x 1, fused LoRA",
                 "fast-fused-latescale": "16 x 1, fused LoRA, scaled late",
                 "fast-fused-compiled-inside": "+ compiled inside ckpt",
                 "fast-fused-pinned": "+ pinned layer inputs", "fast-fused-reentrant-pinned": "+ reentrant, pinned",
                 "unsloth": "Unsloth", "unsloth-16x1": "Unsloth"}


@dataclass(frozen=True)
class HostCount:
    """One variant of one count run (scripts/gpu/count_launches.py), over its processes: counts per micro-batch from the
    profiled window of its first process (the same in every process of a variant, to a few events), times and tokens/s
    as the median over processes, with the lowest and highest process."""

    run: str
    variant: str
    label: str
    processes: int
    aten_ops: float  # operator calls the host dispatched (torch.profiler's aten:: events)
    launches: float  # kernel launch calls (runtime and driver)
    waits: float  # the host stopped until the GPU was done
    waits_ms: float  # the host's time blocked in them
    device_ms: float  # the GPU's kernels, summed
    micro_batch_ms: float  # the timed steps' median wall time over grad_accum
    layer_host_ms: float  # the host's time inside one decoder layer's forward
    tokens_per_s: float
    tokens_per_s_low: float
    tokens_per_s_high: float
    allocated_gib: float
    date: str
    env: dict
    setting: str  # micro-batch x accumulation, "1 x 16"
    tokens: int  # tokens per micro-batch
    beside: str = ""  # what else ran on the GPU meanwhile, where the run's lines say

    @property
    def name(self) -> str:
        return HOST_VARIANTS.get(self.variant, self.variant)

    @property
    def spread(self) -> str:
        """The lowest and the highest process's tokens/s ("1 run" where there was one process)."""
        return f"{self.tokens_per_s_low:,.0f}-{self.tokens_per_s_high:,.0f}" if self.processes > 1 else "1 run"


def count_runs(model: str = "llama-3.1-8b") -> list[str]:
    """The run ids of the shipped count file, in the order they ran."""
    return list(dict.fromkeys(d["run"] for d in _shipped_lines(f"counts-{model}.jsonl", "gpu/count_launches.py")))


def host_counts(run: str | None = None, model: str = "llama-3.1-8b") -> dict[str, HostCount]:
    """The variants of count run `run` (where None: the latest with ours in it), by name, in HOST_VARIANTS' order (a
    process counts as the variant its line says it "ran_as", where it says so)."""
    lines = _shipped_lines(f"counts-{model}.jsonl", "gpu/count_launches.py")
    run = run or [d["run"] for d in lines if d["variant"] == "ours"][-1]
    ok = [dict(d, variant=d.get("ran_as", d["variant"])) for d in lines if d["run"] == run and d.get("status") == "ok"]
    if not ok:
        raise KeyError(f"no finished count run {run!r}; there are: {count_runs(model)}")
    found = {}
    for variant in sorted({d["variant"] for d in ok}, key=lambda v: list(HOST_VARIANTS).index(v)):
        mine = [d for d in ok if d["variant"] == variant]
        first, speeds = mine[0], [d["timing"]["tokens_per_s"] for d in mine]
        c, r = first["counts"], first["recipe"]
        found[variant] = HostCount(
            run, variant, first["label"], len(mine), c["aten_ops"], c["launch_calls"], c["waits"], c["waits_ms"],
            c["device_ms"], statistics.median(d["timing"]["micro_batch_ms"] for d in mine),
            statistics.median(d["timing"]["fwd_host_ms_per_layer"] for d in mine), statistics.median(speeds),
            min(speeds), max(speeds), first["allocated_gib"], first["date"], first["env"],
            f"{r['micro_batch']} x {r['grad_accum']}", r["micro_batch"] * r["max_seq_length"], first.get("beside", ""))
    return found


def host_table(run: str | None = None, model: str = "llama-3.1-8b") -> Table:
    """host_counts(run) as a Table, each variant against ours of the same run (at the run's setting, 1 x 16 or
    16 x 1): per micro-batch, what the host dispatched and waited for, what the GPU worked, and what came of it."""
    counts = host_counts(run, model)
    ours, first = counts.get("ours"), next(iter(counts.values()))
    body = []
    for h in counts.values():
        body.append([h.name, h.aten_ops, h.launches, h.waits, h.device_ms, h.micro_batch_ms, h.layer_host_ms,
                     h.tokens_per_s, h.spread, h.tokens_per_s / ours.tokens_per_s if ours else None, h.allocated_gib])
    v = first.env.get("versions", {})
    title = (f"Per micro-batch of {first.tokens:,} tokens at {first.setting} "
             f"({'ours: ' + repr(ours.label) if ours else 'without ours'}), "
             f"{first.env.get('device', 'GPU')}, run {first.run} ({first.date[:10]}, torch {v.get('torch', '?')}): "
             "each variant in fresh processes, interleaved; tokens/s the median of its processes, range their lowest "
             "and highest; ops: operators the host dispatched")
    groups: dict[str, list[str]] = {}  # what else used the GPU meanwhile: {what: the variants beside it}
    for h in counts.values():
        groups.setdefault(h.beside, []).append(h.name)
    title += "".join(f"; {' and '.join(names)} ran beside {beside}" for beside, names in groups.items() if beside)
    title += f", {' and '.join(groups[''])} alone" if len(groups) > 1 and "" in groups else ""
    columns = [Column("variant", wrap=True), Column("operators", fmt=",.0f", short="ops"),
               Column("launches", fmt=",.0f"), Column("waits", fmt=".0f"), Column("GPU", "ms", ".0f"),
               Column("wall", "ms", ".0f"), Column("layer", "host ms", ".1f"), Column("tokens/s", fmt=",.0f"),
               Column("range"), Column("x ours", fmt=".2f"), Column("GiB", fmt=".2f")]
    return Table(columns, body, title=title)


# Each change tried on the host's work, in the order tried: (the change, the count run that measured it, the variant
# before it, the variant with it). Lean host, fused LoRA, reentrant checkpointing and the compiled layers inside the
# checkpoint (in place of Liger) are Recipe knobs, the ctypes dequantize and the early LoRA scaling are fused LoRA's own
# path, F.rms_norm, the compiled RoPE, the layers compiled around their checkpoint, the pinned layer inputs and the
# guards skipped only count_launches.py's -norm, -rope, -compiled, -pinned and -noguards variants (README.md says more).
# The layers compiled around their checkpoint recomputed nothing (their GiB says so).
CHANGES = (
    ("lean host", "counts-20261203", "ours", "ours-lean"),
    ("fused LoRA", "counts-20261207-repeats", "ours", "ours-fused"),
    ("reentrant ckpt", "counts-20261207-reentrant", "ours-fused", "ours-fused-reentrant"),
    ("ctypes dequantize", "counts-20261207-dequant", "ours-fused-reentrant-ops", "ours-fused-reentrant"),
    ("F.rms_norm", "counts-20261207-norm", "ours-fused-reentrant", "ours-fused-reentrant-norm"),
    ("compiled RoPE", "counts-20261207-rope", "ours-fused-reentrant-norm", "ours-fused-reentrant-norm-rope"),
    ("layers compiled", "counts-20261207-compiled", "ours-fused-reentrant", "ours-fused-reentrant-compiled"),
    ("pinned layer inputs", "counts-20261207-offload", "fast-fused", "fast-fused-pinned"),
    ("compiled layers for Liger", "counts-20261207-inside", "ours-fused-reentrant",
     "ours-fused-reentrant-compiled-inside"),
    ("no guards", "counts-20261207-inside", "ours-fused-reentrant-compiled-inside",
     "ours-fused-reentrant-compiled-inside-noguards"),
    ("LoRA scaled early", "counts-20261207-inside16", "fast-fused-latescale", "fast-fused"),
    ("compiled layers for Liger", "counts-20261207-inside16", "fast-fused", "fast-fused-compiled-inside"),
)


@dataclass(frozen=True)
class Change:
    """One change tried: the counts per micro-batch before and with it, and Unsloth's, all of one run."""

    change: str
    run: str
    before: HostCount
    after: HostCount
    unsloth: HostCount | None  # None: the run had no Unsloth process

    @property
    def speedup(self) -> float:
        """Median tokens/s with the change over without it, in its run."""
        return self.after.tokens_per_s / self.before.tokens_per_s


def changes(model: str = "llama-3.1-8b") -> list[Change]:
    """CHANGES, each from its run."""
    out = []
    for change, run, before, after in CHANGES:
        counts = host_counts(run, model)
        peer = next((h for v, h in counts.items() if v.startswith("unsloth")), None)
        out.append(Change(change, run, counts[before], counts[after], peer))
    return out


def changes_table(model: str = "llama-3.1-8b", setting: str | None = None) -> Table:
    """changes() as a Table, up to three rows a change, all from its run: without it, with it (and its factor), and
    Unsloth where the run had it (what remains): per micro-batch (512 tokens at 1 x 16, or the setting the row names),
    what the host dispatched and waited for, what the GPU worked, and what came of it (tokens/s and the allocated
    peak; the wall time per micro-batch is host_table's). `setting` ("1 x 16"): only the changes measured there."""
    body, found = [], [c for c in changes(model) if setting in (None, c.after.setting)]
    for c, last in zip(found, [None, *found]):
        name = c.change + ("" if c.after.setting == "1 x 16" else f" at {c.after.setting}")
        rows = [(name, "without", c.before, None), (c.run.removeprefix("counts-"), "with", c.after, c.speedup)]
        rows += [("", "Unsloth", c.unsloth, None)] if c.unsloth else []
        if last and last.run == c.run:  # the run of the change above: its rows say what this one starts from
            rows = [(name, "with", c.after, c.speedup)] if last.after == c.before else rows[:2]
        for first, what, h, factor in rows:
            body.append([first, what, h.aten_ops, h.launches, h.waits, h.device_ms, h.tokens_per_s, h.spread, factor,
                         h.allocated_gib])
    devices = " and ".join(sorted({c.after.env.get("device", "GPU") for c in found}))
    other = sorted({f"{c.after.tokens:,} at {c.after.setting}" for c in found} - {"512 at 1 x 16"})
    title = ("Each change tried on the host's work per micro-batch of 512 tokens at 1 x 16"
             f"{''.join(f' ({o} where the row says)' for o in other)}, in the order tried: without it, with it "
             f"and Unsloth, in the run named (below a change of the same run, only the rows it adds); "
             f"count_launches.py on an {devices}, each variant in fresh processes, interleaved; tokens/s: median, "
             "range: lowest-highest process; ops: operators dispatched; x: with over without; GiB: allocated peak")
    columns = [Column("change, run", wrap=True), Column(" ", short=" "), Column("operators", fmt=",.0f", short="ops"),
               Column("launches", fmt=",.0f"), Column("waits", fmt=".0f"), Column("GPU", "ms", ".0f"),
               Column("tokens/s", fmt=",.0f"), Column("range"), Column("x", fmt=".2f"), Column("GiB", fmt=".2f")]
    return Table(columns, body, title=title)
