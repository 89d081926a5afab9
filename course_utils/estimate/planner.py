"""The budget planner's entry: `plan(model, budget)` estimates every candidate recipe (estimate/plan.py),
marks what fits and attaches each one's speed; on several GPUs it adds the DDP and FSDP variants
(estimate/plan_multi.py). `Plan` shows the result as a table.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_utils.common import GiB
from course_utils.estimate.peak import Estimate, estimate
from course_utils.estimate.plan import (BudgetError, EFFECTIVE_BATCH, MARGIN_FACTOR, MARGIN_GIB, PlanRow,
                                        candidate_recipes, needed_bytes, short_name, speed_of)
from course_utils.estimate.plan_multi import multi_gpu_rows, multi_rule, multi_table, parse_gpu_budget
from course_utils.machine import get_hardware
from course_utils.results import all_reference_results
from course_utils.show.tables import Column, Table, common_parts, wrap

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
                 "measured factors for a family never run (see plan.py)."]
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
