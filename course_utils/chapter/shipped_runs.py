"""The shipped GPU runs that notebooks 04, 09 and 10 and the pinned facts (course_utils.chapter.facts) read, below
their rooms: notebook 09's runs of scripts/gpu/beyond_recipe.py and the peer's (course_utils/reference/beyond/), its
targets, the side-by-side table and how two runs' losses agree (beyond_the_recipe.py re-exports them), notebook
04's TF32 run (course_utils/reference/tf32/; mixed_precision.py re-exports it), and the provenance of reference
points every notebook prints (describe_reference; every_notebook.py re-exports it).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from types import SimpleNamespace

from course_utils.common import GiB, shipped
from course_utils.recipe import Recipe, source_chapter_recipe
from course_utils.results import shipped_results
from course_utils.show.tables import Column, Table, wrap_parts

# the targets, as ratios against the source recipe measured in the same run
LEAN_MAX_RATIO = 0.70
LEAN_MAX_GIB = 5.7
FAST_MAX_GIB = 16.0
FAST_MIN_SPEEDUP = 8.0


def source(model: str = "llama-3.1-8b", steps: int = 5) -> Recipe:
    """The source chapter's recipe (QLoRA 1x16, checkpointing, paged 8-bit AdamW, bf16, sequence 512)."""
    return source_chapter_recipe(model).with_(steps=steps, warmup_steps=1, label="source recipe (1x16)")


def path_from(src: Recipe) -> list[Recipe]:
    """From a source recipe: each change added to the one before, then the lean recipe (a quarter of the
    effective batch per micro-batch), the fast recipe (all of it in one micro-batch) and the fast recipe
    with embeddings and activations on CPU. Every recipe keeps the source's tokens per optimizer step."""
    out = [src]
    for label, change in (("+ no fp32 upcast", {"prepare_kbit": False}),
                          ("+ embeddings on CPU", {"offload_embeddings": True}),
                          ("+ Liger kernels", {"liger_kernels": True})):
        out.append(out[-1].with_(**change, label=label))
    effective = src.effective_batch
    mb = max(1, effective // 4)
    out.append(out[-1].with_(micro_batch=mb, grad_accum=effective // mb, label=f"lean recipe ({mb}x{effective // mb})"))
    fast_r = src.with_(prepare_kbit=False, liger_kernels=True, micro_batch=effective, grad_accum=1,
                       label=f"fast recipe ({effective}x1)")
    out.append(fast_r)
    out.append(fast_r.with_(offload_embeddings=True, offload_activations=True,
                            label=f"fast, embeddings + activations on CPU ({effective}x1)"))
    return out



# ---------------------------------------------------------------------------------------------
# the side-by-side table
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One recipe beside the source recipe of the same run."""

    label: str
    allocated_gib: float
    reserved_gib: float
    tokens_per_s: float
    memory_ratio: float  # allocated / the source's allocated
    speed_ratio: float  # tokens/s / the source's tokens/s
    peer_memory_ratio: float | None = None  # allocated / the peer's allocated at the same batching
    peer_speed_ratio: float | None = None  # tokens/s / the peer's tokens/s at the same batching


def rows(measurements: list, source_label: str | None = None, peers: list = ()) -> list[Row]:
    """Rows with ratios against the source recipe among `measurements` (the first one by default), then the
    peer's runs; with `peers`, every row also gets ratios against the peer's run at its batching (if any)."""
    ok = [m for m in list(measurements) + list(peers) if m.fits and m.cuda_max_allocated]
    if not ok:
        return []
    base = next((m for m in ok if m.label == source_label), ok[0])
    at = {batching(p): p for p in peers if p.fits and p.cuda_max_allocated and p.tokens_per_s}
    out = []
    for m in ok:
        p = at.get(batching(m))
        out.append(Row(m.label, m.cuda_max_allocated / GiB, (m.cuda_max_reserved or 0) / GiB, m.tokens_per_s or 0.0,
                       m.cuda_max_allocated / base.cuda_max_allocated,
                       (m.tokens_per_s or 0.0) / base.tokens_per_s if base.tokens_per_s else 0.0,
                       m.cuda_max_allocated / p.cuda_max_allocated if p else None,
                       (m.tokens_per_s or 0.0) / p.tokens_per_s if p else None))
    return out


def rows_table(table: list[Row]) -> Table:
    """The side-by-side table as a Table (course_utils.tables), with two columns of ratios to the peer when any
    row has them."""
    peer = any(r.peer_memory_ratio is not None for r in table)
    columns = [Column("recipe", wrap=True), Column("allocated", "GiB", ".2f"), Column("reserved", "GiB", ".2f"),
               Column("tokens/s", fmt=".0f"), Column("memory", "x src", ".2f"), Column("speed", "x src", ".2f")]
    columns += [Column("memory", "x peer", ".2f"), Column("speed", "x peer", ".2f")] if peer else []
    rows = [[r.label, r.allocated_gib, r.reserved_gib, r.tokens_per_s, r.memory_ratio, r.speed_ratio]
            + ([r.peer_memory_ratio, r.peer_speed_ratio] if peer else []) for r in table]
    return Table(columns, rows)


def format_rows(table: list[Row]) -> str:
    """rows_table as text (at most 100 characters a line)."""
    return str(rows_table(table))


def target_checks(src, lean_m, fast_m) -> list[tuple[str, str, bool]]:
    """(target, what was measured, met?) for the issue's lean and fast targets."""
    out = []
    if src is None or not src.fits:
        return out
    s_alloc, s_speed = src.cuda_max_allocated / GiB, src.tokens_per_s
    if lean_m is not None and lean_m.fits:
        a = lean_m.cuda_max_allocated / GiB
        out.append((f"lean: allocated <= {LEAN_MAX_RATIO:.2f} x source", f"{a / s_alloc:.3f} x", a / s_alloc <= LEAN_MAX_RATIO))
        out.append((f"lean: allocated <= {LEAN_MAX_GIB} GiB", f"{a:.2f} GiB", a <= LEAN_MAX_GIB))
        out.append(("lean: tokens/s >= source", f"{lean_m.tokens_per_s:.0f} vs {s_speed:.0f}",
                    lean_m.tokens_per_s >= s_speed))
    if fast_m is not None and fast_m.fits:
        a = fast_m.cuda_max_allocated / GiB
        out.append((f"fast: allocated <= {FAST_MAX_GIB:.0f} GiB", f"{a:.2f} GiB", a <= FAST_MAX_GIB))
        out.append((f"fast: tokens/s >= {FAST_MIN_SPEEDUP:.0f} x source", f"{fast_m.tokens_per_s / s_speed:.2f} x",
                    fast_m.tokens_per_s >= FAST_MIN_SPEEDUP * s_speed))
    return out


LOSSES_APART = 0.01  # a per-step loss gap above this: the two runs no longer train the same (bf16 noise is ~0.005)


def loss_agreement(a, b) -> dict:
    """How closely two runs' per-step losses agree: the largest and the mean gap, how far each fell, and the first
    step (from 1) whose gap exceeds LOSSES_APART (None: none does)."""
    n = min(len(a.losses), len(b.losses))
    gaps = [abs(x - y) for x, y in zip(a.losses[:n], b.losses[:n])]
    apart = next((i + 1 for i, g in enumerate(gaps) if g > LOSSES_APART), None)
    return dict(steps=n, max_gap=max(gaps) if gaps else float("nan"), apart_from=apart,
                mean_gap=statistics.fmean(gaps) if gaps else float("nan"),
                fall_a=a.losses[0] - a.losses[n - 1] if n else float("nan"),
                fall_b=b.losses[0] - b.losses[n - 1] if n else float("nan"))


def loss_table(runs: list) -> Table:
    """Each run's per-step losses against the source recipe's among `runs` (the first labelled "source", else the
    first run): the largest and the mean gap, the first step more than LOSSES_APART apart ("-": none), and how far
    each fell."""
    long = [m for m in runs if len(m.losses) > 2]
    src = next((m for m in long if m.label.startswith("source")), long[0] if long else None)
    table = []
    for m in runs:
        if src is None or m is src or len(m.losses) <= 2:
            continue
        a = loss_agreement(src, m)
        table.append([m.label, a["steps"], a["max_gap"], a["mean_gap"], a["apart_from"] or "-", a["fall_b"]])
    return Table([Column("against the source (else the first) recipe's losses", short="recipe", wrap=True), Column("steps", fmt="d"),
                  Column("largest gap", short="largest\ngap", fmt=".4f"),
                  Column("mean gap", short="mean\ngap", fmt=".4f"),
                  Column(f"apart (> {LOSSES_APART}) from step", short="apart\nfrom", align="right"),
                  Column("loss fell by", short="fell\nby", fmt=".3f")], table,
                 title=f"the {'source' if src.label.startswith('source') else f'first ({src.label})'} recipe's loss "
                       f"fell by {src.losses[0] - src.losses[-1]:.3f}" if src else "")


# ---------------------------------------------------------------------------------------------
# shipped data: the GPU runs and the peers' figures
# ---------------------------------------------------------------------------------------------
def reference(model: str = "llama-3.1-8b", run: str = "") -> list:
    """The shipped GPU runs of scripts/gpu/beyond_recipe.py for `model` (empty when none ship): run="" is the
    20-step side-by-side run (source, lean, fast), run="explore" the one-change-at-a-time run, and
    run="plan-check" scripts/gpu/check_plan.py's run of the planner's picks, run="whole-steps" the source and the fast
    recipe again after build() kept to whole optimizer steps (beyond/checks/, 8 steps; CHECKS names the others
    there), run="peer-run" our recipes measured beside the peer in one run (they ship with the peer's runs,
    beyond/peers/ours-<model>.jsonl: apart from the runs the estimator and the planner are checked on, which they
    repeat)."""

    if run == "peer-run":
        return shipped_results("beyond/peers", f"ours-{model}.jsonl")
    if run in CHECKS:
        return shipped_results("beyond/checks", f"{run}-{model}.jsonl")
    return shipped_results("beyond", f"{run}-{model}.jsonl" if run else f"{model}.jsonl")


# runs that check one thing again, kept in beyond/checks/: apart from the runs the estimator's accuracy counts.
# Issue 31's fused LoRA (scripts/gpu/logs/fused-20261207/, an H100): "fused" the 16 x 1 recipe without and with it,
# "fused-peer" with it beside Unsloth (the peer's line in the same file), "fused-t4" the 1 x 16 one under the T4 profile;
# their repeats with nothing else on the GPU (scripts/gpu/logs/repeats-20261207/, an H100): "fused-peer1" and
# "fused-peer2" two runs of the 16 x 1 recipe without and with it beside Unsloth, "reentrant-t4" the 1 x 16 recipe,
# + fused LoRA and + reentrant checkpointing under the T4 profile; "picks" two runs of the planner's 16 and 8 GiB picks,
# + fused LoRA, + reentrant checkpointing (scripts/gpu/logs/repeats-20261207/run2/), and "plan-check-fused" check_plan.py's
# run of the picks that fused LoRA's measured factor brought, each beside the same pick without it and the source recipe
# (an H100: the planner takes its pairs' ratios, never its speeds, plan.tuning_factor); "peer1" and "peer2" issue 31's peer
# run twice (beyond_recipe.py --set fused --peers unsloth, scripts/gpu/logs/repeats-20261207/run3/; peer2 stopped before
# Unsloth's 1 x 16 process when the device time ran out); "direct-t4" reentrant-t4's recipes again with fused LoRA's
# direct dequantize in fp16 (run4/: the same run id as the morning's, the file tells them apart); "compiled-peer"
# Recipe(compile_layers=True) at both settings beside the same with and without Liger, and Unsloth (beyond_recipe.py --set
# compiled --peers unsloth, run7/), "compiled-t4" its 1 x 16 pair under the T4 profile in fp16
CHECKS = ("whole-steps", "fused", "fused-peer", "fused-t4", "fused-peer1", "fused-peer2", "reentrant-t4", "picks",
          "plan-check-fused", "peer1", "peer2", "direct-t4", "compiled-peer", "compiled-t4")


def by_label(measurements: list) -> dict:
    """{label: measurement}."""
    return {m.label: m for m in measurements}


def batching(m) -> str:
    """A measurement's (or a recipe's) batching: "micro_batch x grad_accum", e.g. "16x1"."""
    if isinstance(m, Recipe):
        return f"{m.micro_batch}x{m.grad_accum}"
    return f"{m.recipe['micro_batch']}x{m.recipe['grad_accum']}"


def peer_reference(model: str = "llama-3.1-8b") -> list:
    """The shipped runs of the peers for `model` (reference/beyond/peers/<model>.jsonl; empty when none ship).
    A folder of its own: these are not the course's runs, which the estimator and the planner are checked on."""

    return shipped_results("beyond/peers", f"{model}.jsonl")


def tf32_reference() -> list:
    """Notebook 04: the shipped TF32 run (course_utils/reference/tf32, scripts/gpu/reference_runs.py --set
    tf32-llama-3.1-8b): LoRA on the Llama-3.1-8B architecture in fp32, fp32 with TF32 matmuls, and bf16,
    measured in one run on one GPU, so their speeds can be compared."""

    return shipped_results("tf32", "llama-3.1-8b.jsonl")


def _by_kind(runs: list) -> dict:
    """{'fp32' | 'tf32' | 'bf16': Measurement} of the TF32 runs."""
    return {("tf32" if m.recipe.get("tf32") else m.precision): m for m in runs}


def tf32_run(kind: str):
    """Notebook 04 and its quiz: the shipped TF32 run's 'fp32', 'tf32' or 'bf16' Measurement."""
    by = _by_kind(tf32_reference())
    if kind not in by:
        raise KeyError(f"no TF32 reference run {kind!r}; there are: {sorted(by)}")
    return by[kind]


def describe_reference(ms, prefix: str = "") -> str:
    """The provenance of reference points: GPU, driver, versions, and each measurement run shown (its id, date
    and command): ratios between points are only meaningful within one run. `prefix` starts the first line
    ("reference: "); lines are at most 100 characters, broken between its parts."""

    if not ms:
        return prefix + "no reference points"
    env = ms[0].env
    v = env["versions"]
    runs: dict[str, list] = {}
    for m in ms:
        runs.setdefault(m.run_id or f"{m.date[:10]}, {m.command}", []).append(m)
    shown = [f"run {key} ({group[0].date[:10]}, `{_base_command(group[0].command)}`)" if group[0].run_id
             else f"`{key}`" for key, group in runs.items()]
    versions = [f"torch {v['torch']}", f"transformers {v['transformers']}", f"peft {v['peft']}", f"trl {v['trl']}",
                f"bitsandbytes {v['bitsandbytes']}"] + ([f"liger-kernel {v['liger-kernel']}"] if "liger-kernel" in v else [])
    env_parts = [f"{env['device']} (driver {env.get('driver')}, CUDA {env.get('cuda')})"] + versions
    pieces = [p + "," for p in env_parts[:-1]] + [env_parts[-1] + ";"] + [p + ";" for p in shown[:-1]] + shown[-1:]
    return wrap_parts(pieces, " ", first=prefix)


def _base_command(command: str) -> str:
    """A reference run's command without the parts that split one run over several calls (--first, --only)."""
    import re

    return re.sub(r" --(?:first \S+|only '[^']*'|only \S+)", "", command).replace("/root/out/", "$OUT/")


def offline_examples() -> int:
    """How many instruction records the course ships for offline use."""
    from course_utils.data import _read_shipped

    return len(_read_shipped())


def own_check(notebook: str):
    """A script cell trained on a GPU beside the course's measurement of its recipe (scripts/gpu/own_script_check.py,
    course_utils/reference/own_script/): .script_gib and .course_gib (max allocated), .ratio, .model."""
    folder = shipped("reference", "own_script")
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line) if line.strip() else {}
            if r.get("notebook", "").startswith(notebook):
                return SimpleNamespace(script_gib=r["script"]["max_allocated_gib"], ratio=r["ratio"], model=r["model"],
                                       course_gib=r["course"]["max_allocated_gib"], device=r["device"])
    raise ValueError(f"no shipped own-script check of notebook {notebook} in {folder}")
