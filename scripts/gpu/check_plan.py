"""Check the budget planner on a GPU: measure each budget's pick beside the source chapter's recipe.

    python scripts/gpu/check_plan.py --model llama-3.1-8b --budget 16GiB --budget 8GiB --out plan-check.jsonl
    python scripts/gpu/check_plan.py --model llama-3.1-8b --hardware t4 --out plan-check-t4.jsonl   # on a T4
    python scripts/gpu/check_plan.py --model llama-3.1-8b --budget 16GiB --dry-run                  # any machine
    python scripts/gpu/check_plan.py --budget 16GiB --budget 8GiB --without fused_lora ...   # + the pick without it

For each budget it measures, in fresh processes and with the reference runs' protocol (5 steps, 1
warm-up): the planner's pick (when nothing fits: the smallest candidate, to confirm it does not),
and the source chapter's recipe in the same run. It prints the estimate, the tracked peak, CUDA's
allocated and reserved peaks, tokens/s, and whether the pick fits: reserved + the CUDA context
share of the margin within the budget. The --out file is a results store: re-running resumes.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from course_utils.estimate import GiB, estimate, get_hardware  # noqa: E402
from course_utils.estimate.plan import fits_on_card, parse_budget, short_name
from course_utils.estimate.planner import plan  # noqa: E402
from course_utils.recipe import TECHNIQUES, Recipe, source_chapter_recipe  # noqa: E402


def recipes_to_check(model: str, budget: int, seq: int, hardware: str,
                     without: tuple[str, ...] = ()) -> list[tuple[str, Recipe]]:
    """(role, recipe): the planner's pick (or its smallest candidate) and the source chapter's recipe; with `without`
    (Recipe fields of notebook 09's changes) also the pick without each of those it uses, for a ratio in one run."""
    p = plan(model, budget, seq=seq, hardware=hardware)
    hw = get_hardware(hardware)
    source = source_chapter_recipe(model).with_(
        precision=hw.auto_precision, max_seq_length=seq, steps=5, warmup_steps=1, label="source chapter recipe")
    if p.pick is not None:
        pick = p.pick.recipe.with_(label=f"pick for {budget / GiB:.1f} GiB")
        off = [(f"pick without {t.short}", pick.with_(**{knob: t.default}, label=f"{pick.label} without {t.short}"))
               for knob in without for t in TECHNIQUES if t.fields[0] == knob and t.on(pick)]
        return [("pick", pick), *off, ("source", source)]
    smallest = min(p.rows, key=lambda r: r.needed).recipe
    out = [("smallest (nothing fits)", smallest.with_(label=f"smallest for {budget / GiB:.1f} GiB"))]
    if smallest.load_in_4bit:  # the planner's suggestion: keep the unquantized weights in 16-bit
        out.append(("suggested: prepare_kbit=False", smallest.with_(prepare_kbit=False, label="no kbit upcast")))
    return out + [("source", source)]


def report_line(role: str, recipe: Recipe, m, hardware: str, budget: int) -> str:
    """One row: role, recipe, estimate, measured peaks, tokens/s, fits?"""
    est = estimate(recipe, hardware=hardware).peak_bytes / GiB
    name = short_name(recipe)
    head = f"  {role:<31}{name:<100}{est:9.2f}"
    if m is None:
        return head
    if not m.fits:
        return head + f"   does not fit: {m.error}"
    reserved = (m.cuda_max_reserved or 0) / GiB
    fits = "fits" if fits_on_card(m.cuda_max_reserved or 0, budget) else "DOES NOT FIT"
    return head + (f"{m.peak_bytes / GiB:9.2f}{(m.cuda_max_allocated or 0) / GiB:10.2f}{reserved:10.2f}"
                   f"{m.tokens_per_s or 0:10.0f}  {fits}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--budget", action="append", default=None,
                        help="a budget such as 16GiB (repeatable; default with --hardware t4: 14.7GiB)")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--hardware", choices=("gpu", "t4"), default="gpu")
    parser.add_argument("--out", default="plan-check.jsonl", help="results store for the measurements")
    parser.add_argument("--without", action="append", default=[], metavar="FIELD",
                        help="also measure the pick without this change of notebook 09 (a Recipe field such as "
                             "fused_lora), when it uses it (repeatable)")
    parser.add_argument("--dry-run", action="store_true", help="print what would be measured, measure nothing")
    args = parser.parse_args(argv)
    hw = get_hardware(args.hardware)
    budgets = [parse_budget(b) for b in (args.budget or ([f"{hw.memory_gib}GiB"] if hw.memory_gib else ["16GiB"]))]
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("check_plan measures on a CUDA GPU; use --dry-run elsewhere", file=sys.stderr)
            return 1
        if args.hardware == "t4" and "T4" not in torch.cuda.get_device_name(0):
            print(f"note: --hardware t4 on {torch.cuda.get_device_name(0)}: fp16 runs here, but with this GPU's "
                  "attention kernels; only a T4 checks the T4 plan exactly.")
    from course_utils.measure import measure_all
    from course_utils.results import ResultStore

    store = ResultStore(args.out)
    print(f"{'':<33}{'recipe':<100}{'estimate':>9}{'tracked':>9}{'allocated':>10}{'reserved':>10}{'tokens/s':>10}")
    print(f"{'':<33}{'':<100}{'(GiB)':>9}{'(GiB)':>9}{'(GiB)':>10}{'(GiB)':>10}")
    for budget in budgets:
        print(f"budget {budget / GiB:.2f} GiB on {hw.short}, {args.model}, sequence {args.seq}:")
        roles, recipes = zip(*recipes_to_check(args.model, budget, args.seq, args.hardware, tuple(args.without)))

        def said(done) -> None:  # each row as soon as its recipe is measured (with --dry-run: none is)
            o = done[-1]
            print(report_line(roles[len(done) - 1], o.recipe, o.measurement, args.hardware, budget), flush=True)

        measure_all(recipes, store=store, progress=False, isolate=True, after_each=said,
                    skip=dict.fromkeys(range(len(recipes)), "--dry-run") if args.dry_run else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
