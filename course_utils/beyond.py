"""Beyond the source recipe: a leaner and a faster QLoRA recipe, one measured change at a time.

The source chapter's complete script is the baseline. Every change here keeps what is trained the
same (the same LoRA on the same frozen 4-bit model, the same data, the same tokens per optimizer
step) and changes only where bytes live, which kernels run, and how the tokens are batched:

  no fp32 upcast   peft's prepare_model_for_kbit_training casts every weight that is not 4-bit
                   (embeddings, lm_head, norms) to fp32. For Llama-3.1-8B that is 1.96 GiB more,
                   and the fp32 embedding output makes the whole residual stream fp32.
  embeddings on CPU  the input embedding table (1 GiB in bf16) is frozen, and a step reads only
                   micro_batch x sequence rows of it: it can stay in CPU memory.
  Liger kernels    fused RMSNorm, SwiGLU and RoPE from Liger (Triton, CUDA only). trl keeps its own
                   fused, chunked loss, which already never materializes the 128k-wide logits.
  micro-batch      at micro-batch 1 an 8B step is launch-bound: the GPU waits for Python. More
                   sequences per micro-batch, fewer accumulation steps, same tokens per step.

The GPU figures come from scripts/beyond_recipe.py, shipped in course_utils/reference/beyond/. Beside them, a
peer: Unsloth, measured in the same run by scripts/beyond_recipe.py --peers unsloth (scripts/peer_unsloth.py, in an
environment of its own) on the same model, data, tokens per step and timing rule, shipped apart from ours in
reference/beyond/peers/.

Toward the limit (issue 16): each run's tokens/s against its compute limit (its FLOPs per token at the GPU's
datasheet peak) and its allocated peak against the memory floor of its frozen weights (course_utils.limits;
toward_the_limit, limit_table).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

from .common import shipped
from .recipe import Recipe, source_chapter_recipe

from .hardware import GiB
from .tables import Column, Table

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


def changes(model: str = "llama-3.1-8b", steps: int = 5) -> list[Recipe]:
    """The lean path: the source recipe, then one change at a time (each keeps the ones before)."""
    return path_from(source(model, steps))[:4]


def lean(model: str = "llama-3.1-8b", steps: int = 5) -> Recipe:
    """Same effective batch (16), sequence, LoRA and optimizer as the source; fewer bytes, more tokens/s."""
    return path_from(source(model, steps))[4]


def fast(model: str = "llama-3.1-8b", steps: int = 5) -> Recipe:
    """Same tokens per optimizer step (16 x 512) in one micro-batch, within a 16 GiB card."""
    return path_from(source(model, steps))[5]


def fast_low_memory(model: str = "llama-3.1-8b", steps: int = 5) -> Recipe:
    """The fast recipe with the embeddings and, through trl, the saved activations in CPU memory."""
    return path_from(source(model, steps))[6]


# ---------------------------------------------------------------------------------------------
# the same changes on this machine (notebook 08)
# ---------------------------------------------------------------------------------------------
def path_here(model: str) -> list[Recipe]:
    """Notebook 08's recipes on this machine: the source recipe, each change, the lean and the fast recipe,
    and the fast one with activations on CPU too.

    On a GPU without bf16 (a T4, or the T4 profile) every recipe trains in fp16 instead of bf16.
    On a CPU (the embedded tiny model) the source recipe is scaled down: 1 x 8 x 128 tokens, 4 steps (1
    warm-up, 1 tracked, 2 timed), learning rate 1e-3, in bf16 where the CPU has it (else fp32, where there is no upcast to remove).
    Lean is 2 x 4 and fast 8 x 1 there: the same tokens per optimizer step.
    """
    from .hardware import bf16_supported, device_type

    if device_type() == "cpu":
        return path_from(source_chapter_recipe(model).with_(
            grad_accum=8, max_seq_length=128, steps=4, warmup_steps=1, learning_rate=1e-3,
            precision="bf16" if bf16_supported() else "fp32", label="source recipe (1x8)"))
    src = source(model)
    if not bf16_supported():  # a T4: the same changes in fp16, where each of them can run
        src = src.with_(precision="fp16", label=src.label)
    return path_from(src)


def why_not_here(recipe: Recipe) -> str | None:
    """Why this machine cannot run `recipe` (a CUDA-only change, a tied embedding table), or None."""
    from .build import check_hardware
    from .estimate import model_shapes
    from .hardware import HardwareError

    try:
        check_hardware(recipe)
    except HardwareError as error:
        return str(error)
    if recipe.offload_embeddings and model_shapes(recipe.model).tied:
        return "this model ties its input and output embeddings, and the output layer needs the table on the GPU"
    return None


def run_path(model: str, *, store=None, progress: bool = True) -> tuple[list, dict[int, str]]:
    """Measure path_here(model): (a measurement per recipe, None where skipped; {position: why skipped}).
    A change this machine cannot make is skipped, and the recipes after it are measured without it."""
    from . import measure

    recipes, skip = path_runnable(model)
    results = measure.measure_all(recipes, store=store, progress=progress, isolate=None, skip=skip,
                                  desc="beyond the recipe")
    return [o.measurement for o in results], results.skipped


def path_runnable(model: str) -> tuple[list[Recipe], dict[int, str]]:
    """path_here(model) as it runs here, and {position: why} for the changes this machine cannot make
    (why_not_here); the recipes after such a change have its knob turned off."""
    recipes, skip, dropped = [], {}, {}
    for i, recipe in enumerate(path_here(model)):
        recipe = recipe.with_(**dropped, label=recipe.label)
        why = why_not_here(recipe)
        if why is not None:
            skip[i] = why
            for knob in ("liger_kernels", "offload_activations", "offload_embeddings"):
                if getattr(recipe, knob) and why_not_here(recipe.with_(**{knob: False})) != why:
                    dropped[knob] = False
        recipes.append(recipe)
    return recipes, skip


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
    """Each run's per-step losses against the source recipe's among `runs` (the first labelled "source"): the
    largest and the mean gap, the first step more than LOSSES_APART apart ("-": none), and how far each fell."""
    src = next((m for m in runs if m.label.startswith("source") and len(m.losses) > 2), None)
    table = []
    for m in runs:
        if src is None or m is src or len(m.losses) <= 2:
            continue
        a = loss_agreement(src, m)
        table.append([m.label, a["steps"], a["max_gap"], a["mean_gap"], a["apart_from"] or "-", a["fall_b"]])
    return Table([Column("against the source recipe's losses", short="recipe", wrap=True), Column("steps", fmt="d"),
                  Column("largest gap", short="largest\ngap", fmt=".4f"),
                  Column("mean gap", short="mean\ngap", fmt=".4f"),
                  Column(f"apart (> {LOSSES_APART}) from step", short="apart\nfrom", align="right"),
                  Column("loss fell by", short="fell\nby", fmt=".3f")], table,
                 title=f"the source recipe's loss fell by {src.losses[0] - src.losses[-1]:.3f}" if src else "")


# ---------------------------------------------------------------------------------------------
# shipped data: the GPU runs and the peers' figures
# ---------------------------------------------------------------------------------------------
def reference(model: str = "llama-3.1-8b", run: str = "") -> list:
    """The shipped GPU runs of scripts/beyond_recipe.py for `model` (empty when none ship): run="" is the
    20-step side-by-side run (source, lean, fast), run="explore" the one-change-at-a-time run, and
    run="plan-check" scripts/check_plan.py's run of the planner's picks, run="whole-steps" the source and the fast
    recipe again after build() kept to whole optimizer steps (beyond/checks/, 8 steps), run="peer-run" our recipes
    measured beside the peer in one run (they ship with the peer's runs, beyond/peers/ours-<model>.jsonl: apart
    from the runs the estimator and the planner are checked on, which they repeat)."""
    from .results import shipped_results

    if run == "peer-run":
        return shipped_results("beyond/peers", f"ours-{model}.jsonl")
    if run in CHECKS:
        return shipped_results("beyond/checks", f"{run}-{model}.jsonl")
    return shipped_results("beyond", f"{run}-{model}.jsonl" if run else f"{model}.jsonl")


# runs that check one thing again, kept in beyond/checks/: apart from the runs the estimator's accuracy counts
CHECKS = ("whole-steps",)


def shipped_runs(model: str = "llama-3.1-8b", run: str = "") -> list:
    """reference(model, run), and in run "peer-run" the peer's runs of that run too."""
    return reference(model, run) + (peer_reference(model) if run == "peer-run" else [])


def by_label(measurements: list) -> dict:
    """{label: measurement}."""
    return {m.label: m for m in measurements}


def peer_table(ours: dict, peer: str = "unsloth") -> Table:
    """Our runs beside a peer's, as a Table: `ours` maps the peer's batching ("1x16", "16x1") to our measurements
    to set beside it. Allocated peak and tokens/s, and who is ahead on each."""
    p = peers()[peer]
    rows = []
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
    The runs measured by scripts/peer_unsloth.py (reference/beyond/peers/<model>.jsonl) when they ship, else the
    figures quoted in reference/beyond/peers.json."""
    measured = peer_reference(model)
    if measured:
        return {name: peer_summary([m for m in measured if peer_name(m) == name])
                for name in dict.fromkeys(peer_name(m) for m in measured)}
    path = shipped("reference", "beyond", "peers.json")
    return json.loads(path.read_text()) if path.is_file() else {}


# ---------------------------------------------------------------------------------------------
# the peer in the benchmark: Unsloth, measured by scripts/peer_unsloth.py in its own environment
# ---------------------------------------------------------------------------------------------
PEERS = ("unsloth",)  # the stacks scripts/beyond_recipe.py --peers can run (scripts/peer_<name>.py)
PEER_BATCHES = ((16, 1), (1, 16))  # the peer's settings: all 16 x 512 tokens in one micro-batch; the chapter's 1 x 16
# issue 16's targets: at each of the peer's settings, a recipe of ours at that batching, measured in the same run
PEER_MAX_MEMORY_RATIO = 0.85
PEER_MIN_SPEEDUP = 1.05


def batching(m) -> str:
    """A measurement's (or a recipe's) batching: "micro_batch x grad_accum", e.g. "16x1"."""
    if isinstance(m, Recipe):
        return f"{m.micro_batch}x{m.grad_accum}"
    return f"{m.recipe['micro_batch']}x{m.recipe['grad_accum']}"


def peer_recipe(model: str, micro_batch: int, grad_accum: int, steps: int, label: str = "") -> Recipe:
    """What the peer trains, as a Recipe: the source recipe's model, LoRA, data, sequence and learning rate,
    one warm-up step, adamw_8bit, the frozen weights kept in bf16 (no peft upcast), at this batching."""
    return source(model, steps).with_(optimizer="adamw_8bit", prepare_kbit=False, micro_batch=micro_batch,
                                      grad_accum=grad_accum, label=label)


def peer_name(m) -> str | None:
    """The peer that measured `m` ("unsloth": its package is among the run's versions), or None for a run of ours.
    A peer's run keeps its recipe's key; its environment's key (the versions, the peer's among them) is never ours."""
    versions = m.env.get("versions", {}) if isinstance(m.env, dict) else {}
    return next((name for name in PEERS if name in versions), None)


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


def peer_run_report(model: str = "llama-3.1-8b") -> str:
    """Issue 16's benchmark table from the shipped peer run (our recipes and the peer's, one run): where and how
    it was measured, the table with ratios to the source recipe and to the peer, and the peer targets."""
    from .notebook import describe_reference

    ours, theirs = reference(model, "peer-run"), peer_reference(model)
    if not ours or not theirs:
        return f"no peer run of {model} ships (scripts/beyond_recipe.py --set peer --peers unsloth makes one)"
    name = peer_name(theirs[0])
    v = theirs[0].env.get("versions", {})
    peer_line = (f"{name} {v.get(name)} in a site directory of its own: transformers {v.get('transformers')}, "
                 f"trl {v.get('trl')}, datasets {v.get('datasets')}")
    return (describe_reference(ours) + "\n" + peer_line + "\n\n```\n" + format_rows(rows(ours, peers=theirs))
            + "\n\n" + "\n".join(peer_check_lines(ours, theirs)) + "\n\n" + str(loss_table(ours + theirs)) + "\n```")


def peer_reference(model: str = "llama-3.1-8b") -> list:
    """The shipped runs of the peers for `model` (reference/beyond/peers/<model>.jsonl; empty when none ship).
    A folder of its own: these are not the course's runs, which the estimator and the planner are checked on."""
    from .results import shipped_results

    return shipped_results("beyond/peers", f"{model}.jsonl")


def peer_summary(runs: list) -> dict:
    """One peer's measured runs in the shape of peers.json, with their provenance."""
    first, name = runs[0], peer_name(runs[0])
    return dict(
        version=f"{name} {first.env.get('versions', {}).get(name, '?')}", hardware=first.env.get("device", "?"),
        model=f"{first.recipe['model']} (random weights with its published shape)",
        settings=", ".join(x for x in first.recipe_obj.describe().split(", ") if x != batching(first)),
        source=f"{first.source}: measured by scripts/peer_unsloth.py in its own environment",
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
    from .limits import against

    return [against(m, peak_flops) for m in measurements if _timed_on_gpu(m)]


def toward(label: str, run: str = "", model: str = "llama-3.1-8b", peak: float | None = None):
    """A shipped run (reference(model, run); with run="peer-run" the peer's runs too, by their labels) against its
    compute limit at `peak` FLOP/s (else its GPU's datasheet peak) and its memory floor: a limits.Against
    (.fraction, .floor_gib, ...)."""
    found = by_label(shipped_runs(model, run))
    if label not in found:
        raise KeyError(f"no {run or 'side-by-side'} run of notebook 08 labelled {label!r}; there are: {sorted(found)}")
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
    from .limits import datasheet_peak, flops_per_token, measured_peak, memory_floor
    from .tables import wrap

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
            rate = measured_peak(device, first.precision or "bf16")
            measured = (f"scripts/peak_matmul.py measured {rate.tflops:,.1f} TFLOP/s on an {device} ({rate.size}-cube "
                        f"{rate.dtype} matmul, {rate.date[:10]}), which allows {rate.flops_per_s / f.total:,.0f} "
                        "tokens/s")
        except KeyError:
            measured = "scripts/peak_matmul.py measures one"
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
