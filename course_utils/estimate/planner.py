"""The budget planner's entry: `plan(model, budget)` estimates every candidate recipe (estimate/plan.py),
marks what fits and attaches each one's speed; on several GPUs (budgets such as "2 x 15 GiB") it adds the DDP and
FSDP variants of the candidates, checked against the per-GPU budget. `Plan` shows the result as a table.

    plan("llama-3.1-8b", "2 x 15 GiB").format()

A multi-GPU candidate is one of `candidate_recipes` (plan.py) run by every GPU at its micro-batch, with the
accumulation set so that micro-batch x accumulation x GPUs is the planner's effective batch (16), under DDP or
FSDP full shard (course_utils.estimate.distributed says what each costs per GPU). It fits when its per-GPU estimate,
with the planner's margin, is within the per-GPU budget. The margin was calibrated on single-GPU runs only.

Speed on several GPUs: not modelled. No multi-GPU run has been measured yet, and scaling from one GPU would need a
factor we have not measured (communication, the all-gathers of FSDP), so no row has a speed and the plan picks
none: its rows are listed by the memory they need per GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from course_utils.common import GiB
from course_utils.estimate.distributed import STRATEGIES, estimate_distributed, run_recipe
from course_utils.estimate.peak import Estimate, estimate
from course_utils.estimate.plan import (BudgetError, EFFECTIVE_BATCH, MARGIN_FACTOR, MARGIN_GIB, PlanRow, Speed,
                                        candidate_recipes, needed_bytes, parse_budget, short_name, speed_of)
from course_utils.estimate.shapes import EstimateError
from course_utils.machine import get_hardware
from course_utils.results import all_reference_results
from course_utils.show.tables import Column, Table, common_parts, wrap

MAX_GPUS = 1024
NO_SPEED = "not modelled: no multi-GPU reference runs yet"
_STRATEGY_NAMES = {"ddp": "DDP", "fsdp": "FSDP"}


def parse_gpu_budget(text: str) -> tuple[int, int]:
    """'2 x 15 GiB', '2x24GiB', '2 x 15' (GiB), '4 × 80GB' -> (GPUs, bytes per GPU); a single budget such as
    '16GiB' -> (1, bytes), read as plan.parse_budget reads it."""

    text = str(text)
    match = re.fullmatch(r"\s*([-+\d.]*)\s*[xX×]\s*(.*?)\s*", text)  # a count (or nothing) before the x
    if match is None:
        return 1, parse_budget(text)
    count, memory = match.groups()
    form = "write the GPU count, 'x' and one GPU's memory, e.g. '2 x 15 GiB' (two GPUs of 15 GiB each)"
    if not count:
        raise BudgetError(f"Cannot read the budget {text!r}: no GPU count before the 'x'; {form}.")
    if not re.fullmatch(r"\d+", count):
        raise BudgetError(f"Cannot read the budget {text!r}: the GPU count {count!r} is not a whole number; {form}.")
    gpus = int(count)
    if not 1 <= gpus <= MAX_GPUS:
        raise BudgetError(f"The budget {text!r} has {gpus} GPUs: give from 1 to {MAX_GPUS}; {form}.")
    if not memory:
        raise BudgetError(f"Cannot read the budget {text!r}: no memory per GPU after the 'x'; {form}.")
    if re.fullmatch(r"[-+]?(\d+(\.\d*)?|\.\d+)", memory):
        memory += "GiB"  # '2 x 15': a per-GPU amount without a unit is GiB
    try:
        return gpus, parse_budget(memory)
    except BudgetError as exc:
        raise BudgetError(f"Cannot read the per-GPU memory of the budget {text!r}: {exc}") from None


def multi_gpu_candidates(model: str, gpus: int, seq: int = 512, precision: str = "bf16",
                         hardware: str = "gpu") -> list[tuple[str, object]]:
    """(strategy, recipe as the run uses it) for DDP and FSDP on `gpus` GPUs: each of the planner's candidates at
    its per-GPU micro-batch, accumulation keeping the global batch at EFFECTIVE_BATCH where it divides."""

    out, seen = [], set()
    for r in candidate_recipes(model, seq, precision=precision):
        if r.micro_batch * gpus > EFFECTIVE_BATCH and r.micro_batch > 1:
            continue  # one micro-batch per GPU is already the global batch or more
        base = r.with_(grad_accum=max(1, EFFECTIVE_BATCH // (r.micro_batch * gpus)))
        for strategy in STRATEGIES:
            if strategy == "fsdp" and base.offload_embeddings:
                continue  # FSDP cannot shard a table in CPU memory
            run = run_recipe(base, strategy, hardware)
            if (strategy, run.key) not in seen:
                seen.add((strategy, run.key))
                out.append((strategy, run))
    return out


def multi_gpu_rows(model: str, gpus: int, budget: int, seq: int, hardware: str) -> list:
    """Every multi-GPU candidate as a PlanRow: per-GPU estimate, what it needs with the margin, whether it fits."""

    hw = get_hardware(hardware)
    rows = []
    for strategy, recipe in multi_gpu_candidates(model, gpus, seq, hw.auto_precision, hardware):
        try:
            e = estimate_distributed(recipe, gpus, strategy, hardware=hw)
        except EstimateError:
            continue
        need = needed_bytes(e)
        rows.append(PlanRow(recipe, e, need, need <= budget, Speed(None, NO_SPEED, False), strategy=strategy,
                            gpus=gpus))
    return rows


def row_name(row) -> str:
    """The recipe's description without the sequence (the plan fixes it)."""

    return short_name(row.recipe)


def multi_rule(p) -> str:
    """What a multi-GPU plan assumes, one paragraph a line."""

    hw = get_hardware(p.hardware)
    return "\n".join([
        f"Budget planner: {p.model}, sequence {p.seq}, global batch {EFFECTIVE_BATCH} (micro-batch x accumulation "
        f"x GPUs), on {p.gpus} x {hw.name}.",
        f"Budget {p.gpus} x {p.budget / GiB:.2f} GiB. A recipe fits when its estimated peak per GPU x {MARGIN_FACTOR} "
        f"+ {MARGIN_GIB} GiB is within one GPU's budget (the margin is calibrated on single-GPU runs).",
        "DDP: every GPU holds the whole model plus gradient buckets; FSDP: parameters, gradients and optimizer "
        "state divided among the GPUs, plus the gathered layers (course_utils/estimate/distributed.py).",
        f"Speed: {NO_SPEED}, so nothing is picked; rows are listed by the memory they need per GPU."])


def multi_table(p, show: int | None = None) -> Table:
    """A multi-GPU plan as a Table: strategy and GPU count per row, the fitting rows by memory needed (no speed
    column: every row's speed is NO_SPEED, as the rule above the table says)."""
    columns = [Column("strategy"), Column("GPUs", fmt="d"), Column("recipe", wrap=True),
               Column("estimate per GPU", "GiB", ".2f", short="est./GPU"),
               Column("needed per GPU", "GiB", ".2f", short="needed")]
    fitting = p.fitting
    if not fitting:
        return Table(columns, [], title=multi_rule(p), notes=[multi_nothing_fits(p)])
    shown = fitting[:show]
    shared, names = common_parts([row_name(r) for r in shown])
    rows = [(_STRATEGY_NAMES[r.strategy], r.gpus, name, r.estimate.peak_gib, r.needed / GiB)
            for r, name in zip(shown, names)]
    notes = [f"... and {len(fitting) - show} more that fit (--all lists them)."] if show is not None and \
        len(fitting) > show else []
    counts = {s: sum(r.strategy == s for r in fitting) for s in STRATEGIES}
    notes.append(f"{len(fitting)} of {len(p.rows)} candidates fit ({counts['ddp']} DDP, {counts['fsdp']} FSDP); "
                 "none is picked: the speed on several GPUs is not modelled.")
    title = multi_rule(p) + (f"\nEvery recipe below: {', '.join(shared)}; the recipe column lists the rest."
                             if shared else "")
    return Table(columns, rows, title=title, notes=notes)


def multi_nothing_fits(p) -> str:
    """Why nothing fits on these GPUs and how close the smallest candidate came."""
    smallest = min(p.rows, key=lambda r: r.needed)
    lines = [f"Nothing in the {len(p.rows)} candidates fits in {p.gpus} x {p.budget / GiB:.2f} GiB.",
             f"The smallest is {_STRATEGY_NAMES[smallest.strategy]} {row_name(smallest)}: estimated "
             f"{smallest.estimate.peak_gib:.2f} GiB per GPU, needs {smallest.needed / GiB:.2f} GiB with the margin.",
             "What would go lower: more GPUs under FSDP (its sharded terms divide by the GPU count), a shorter "
             "sequence (--seq), or a smaller model."]
    return wrap("\n".join(lines))


# ---------------------------------------------------------------------------------------------
# the plan: one GPU's candidates, and on several GPUs the ones above
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """Every candidate for one model and budget; `pick` is the fastest that fits."""

    model: str
    seq: int
    budget: int  # per GPU
    hardware: str
    rows: list[PlanRow]
    gpus: int = 1

    @property
    def fitting(self) -> list[PlanRow]:
        """Rows that fit, fastest first (ties: measured first, then the one that needs less)."""
        return sorted((r for r in self.rows if r.fits),
                      key=lambda r: (r.speed.tokens_per_s is None, -round(r.speed.tokens_per_s or 0),
                                     not r.speed.measured, r.needed))

    @property
    def pick(self) -> PlanRow | None:
        """The fastest recipe that fits, or None when nothing does (or no speed is known to rank them)."""
        fitting = self.fitting
        return fitting[0] if fitting and fitting[0].speed.tokens_per_s is not None else None

    def rule(self) -> str:
        """What the plan assumes, one paragraph a line: the model and hardware, the fitting rule, where speeds
        come from."""
        if self.gpus > 1:
            return multi_rule(self)
        hw = get_hardware(self.hardware)
        lines = [f"Budget planner: {self.model}, sequence {self.seq}, effective batch {EFFECTIVE_BATCH}, on {hw.name}.",
                 f"Budget {self.budget / GiB:.2f} GiB. A recipe fits when its estimated peak x {MARGIN_FACTOR} + "
                 f"{MARGIN_GIB} GiB is within the budget (the factor covers the CUDA allocator's reserve over the "
                 "peak, the GiB cuBLAS and the CUDA context).",
                 "Speed: tokens/s of an NVIDIA H200 reference run of the recipe where one exists, else modelled: the "
                 "measured runs of the same family (4-bit, LoRA or full, checkpointing) across micro-batches, times "
                 "measured factors for a family never run; notebook 09's changes count the median ratio of pairs "
                 "measured in one run each (on an H100 too) at the nearest micro-batch (see plan.py)."]
        if hw.name != get_hardware("gpu").name:
            lines.append(f"On {hw.short} the speeds are H200 figures used only to rank the candidates: "
                         "check the pick there.")
        return "\n".join(lines)

    def table(self, show: int | None = None) -> Table:
        """The plan as a Table (course_utils.tables): the rule above it, the fitting recipes (the first `show`),
        fastest first, the pick marked *, and below it the pick, or why nothing fits. On several GPUs: plan_multi."""
        if self.gpus > 1:
            return multi_table(self, show)
        columns = [Column("pick", short=" "), Column("recipe", wrap=True), Column("estimate", "GiB", ".2f"),
                   Column("needed", "GiB", ".2f"), Column("tokens/s", fmt=",.0f"), Column("speed from", wrap=True)]
        fitting, pick = self.fitting, self.pick
        if not fitting:
            return Table(columns, [], title=self.rule(), notes=[self.nothing_fits()])
        shared, names = common_parts([short_name(r.recipe) for r in fitting[:show]])
        rows = [("*" if r is pick else "", name, r.estimate.peak_gib, r.needed / GiB, r.speed.tokens_per_s,
                 r.speed.basis) for r, name in zip(fitting[:show], names)]
        notes = [f"... and {len(fitting) - show} more that fit (--all lists them)."] if show is not None and \
            len(fitting) > show else []
        if pick is None:
            notes.append(f"{len(fitting)} of {len(self.rows)} candidates fit; none is picked: without a speed there "
                         "is no fastest (listed by memory needed).")
        else:
            how = "measured" if pick.speed.measured else "modelled"
            notes.append(f"{len(fitting)} of {len(self.rows)} candidates fit. Pick (*): {short_name(pick.recipe)}, "
                         f"{pick.speed.tokens_per_s:,.0f} tokens/s ({how}), needs {pick.needed / GiB:.2f} GiB "
                         f"of {self.budget / GiB:.2f}.")
        title = self.rule() + (f"\nEvery recipe below: {', '.join(shared)}; the recipe column lists the rest."
                               if shared else "")
        return Table(columns, rows, title=title, notes=notes)

    def format(self, show: int | None = None) -> str:
        """The plan as text of at most 100 characters a line: the rule, the fitting rows, the pick (or why
        nothing fits)."""
        return str(self.table(show))

    def _repr_pretty_(self, p, cycle: bool) -> None:
        p.text(self.format(show=10))

    def _repr_html_(self) -> str:
        """In Jupyter: the first 10 rows as an HTML table (plan.table(show=None) has them all)."""
        return self.table(show=10)._repr_html_()

    def nothing_fits(self) -> str:
        """Why nothing fits, how close the smallest candidate came, and what would go lower."""
        smallest = min(self.rows, key=lambda r: r.needed)
        lines = [f"Nothing in the {len(self.rows)} candidates fits in {self.budget / GiB:.2f} GiB.",
                 f"The smallest is {short_name(smallest.recipe)}: estimated {smallest.estimate.peak_gib:.2f} GiB, "
                 f"needs {smallest.needed / GiB:.2f} GiB with the margin."]
        ideas = []
        if smallest.recipe.load_in_4bit and smallest.recipe.prepare_kbit:
            lean = estimate(smallest.recipe.with_(prepare_kbit=False), hardware=self.hardware)
            ideas.append(f"prepare_kbit=False keeps the embeddings, lm_head and norms in 16-bit instead of fp32: "
                         f"estimated {lean.peak_gib:.2f} GiB, needs {needed_bytes(lean) / GiB:.2f} GiB (not measured)")
        if self.seq > 128:
            short = estimate(smallest.recipe.with_(max_seq_length=self.seq // 2), hardware=self.hardware)
            ideas.append(f"--seq {self.seq // 2}: needs {needed_bytes(short) / GiB:.2f} GiB")
        ideas.append("a smaller model (e.g. llama-3.2-1b)")
        return wrap("\n".join(lines + ["What would go lower: " + "; ".join(ideas) + "."]))


def plan(model: str, budget: int | str | None = None, *, seq: int = 512, hardware: str = "gpu",
         references: list | None = None, gpus: int | None = None) -> Plan:
    """Estimate every candidate recipe for `model`, mark what fits `budget`, and attach each one's speed. On several
    GPUs (`gpus`, or a budget such as "2 x 15 GiB": the budget is per GPU) DDP and FSDP variants: plan_multi.py."""

    hw = get_hardware(hardware)
    if budget is None:
        if hw.memory_gib is None:
            raise BudgetError(f"Give a budget (e.g. 16GiB); {hw.name} has no fixed memory size.")
        budget = int(hw.memory_gib * GiB)
    counted, budget_bytes = parse_gpu_budget(budget) if isinstance(budget, str) else (1, int(budget))
    if gpus is not None and counted not in (1, gpus):
        raise BudgetError(f"The budget {budget!r} is for {counted} GPUs but gpus={gpus}; give one of them.")
    if (gpus or counted) > 1:  # the budget is per GPU
        n = gpus or counted
        return Plan(model, seq, budget_bytes, hardware, multi_gpu_rows(model, n, budget_bytes, seq, hardware), gpus=n)
    refs = all_reference_results() if references is None else references
    rows = []
    for recipe in candidate_recipes(model, seq, precision=hw.auto_precision):
        e = estimate(recipe, hardware=hw)
        need = needed_bytes(e)
        rows.append(PlanRow(recipe, e, need, need <= budget_bytes, speed_of(recipe, refs)))
    return Plan(model=model, seq=seq, budget=budget_bytes, hardware=hardware, rows=rows)
