"""Measurements shaped like the ones notebooks 03, 07 and 09 pass to technique_figure (no training):
the recipes the notebooks build, the peaks and speeds of their committed outputs (CPU) or plausible
ones (a T4, an H200 learner beside the shipped H200 runs). Used by tests/test_plots_notebooks.py and
to draw the figures for a look (python tests/plot_cases.py OUT_DIR)."""

from __future__ import annotations

import random
import sys

from course_utils.chapter import beyond_the_recipe as beyond
from course_utils.recipe import Recipe, ladder, source_chapter_recipe
from course_utils.common import MiB
from course_utils.results import Measurement, reference_results

CPU = "CPU (2 cores, x86_64)"


def make(recipe: Recipe, peak_mib: float, tokens_per_s: float, device: str = CPU, noisy: bool = False,
         precision: str | None = None, gpu: bool = False) -> Measurement:
    """A measurement of `recipe` at this peak and speed (CUDA's allocated peak too on a GPU)."""
    by_cat = {"parameters": peak_mib * 0.5 * MiB, "activations": peak_mib * 0.3 * MiB,
              "temporaries": peak_mib * 0.2 * MiB}
    resolved = precision or (recipe.precision if recipe.precision != "auto" else ("bf16" if gpu else "fp32"))
    return Measurement(recipe=recipe.to_dict(), recipe_key=recipe.key, env={"device": device}, env_key=device,
                       status="ok", peak_bytes=int(peak_mib * MiB), peak_by_category=by_cat,
                       tokens_per_s=tokens_per_s, precision=resolved,
                       cuda_max_allocated=int(peak_mib * MiB) if gpu else None,
                       timing={"spread": 0.9 if noisy else 0.01})


def h200() -> list[Measurement]:
    """Notebook 07's reference: every shipped Llama-3.1-8B run."""
    return [m for m in reference_results() if m.recipe["model"] == "llama-3.1-8b"]


def explore() -> list[Measurement]:
    """Notebook 09's reference: the explore run, in the notebook's order."""
    runs = beyond.by_label(beyond.reference(run="explore"))
    order = ["source recipe (1x16)", "+ no fp32 upcast", "+ embeddings on CPU", "+ Liger kernels", "lean 2x8",
             "lean recipe (4x4)", "fast recipe (16x1)"]
    return [runs[label] for label in order]


def _tiny_base() -> Recipe:
    return Recipe(model="tiny", micro_batch=4, max_seq_length=256, steps=6, learning_rate=1e-3,
                  label="baseline (LoRA, fp32)")


def nb03_cpu() -> tuple[list, list]:
    """Notebook 03 as committed: the ladder to paged 8-bit AdamW, then two full fine-tunes."""
    rungs = ladder(_tiny_base())[:5]
    mine = [make(r, p, s) for r, (p, s) in zip(rungs, [(304.3, 1754), (223.2, 1428), (69.9, 1113), (69.4, 1360),
                                                       (69.4, 1011)])]
    full = rungs[2].with_(lora_r=None, label="full FT, adamw_torch")
    mine += [make(full, 121.5, 1521),
             make(full.with_(optimizer="adamw_8bit", label="full FT, adamw_8bit"), 100.0, 1556)]
    ref = {m.label: m for m in h200()}
    return mine, [ref[k] for k in ("LoRA bf16, ckpt, 1x16, adamw_torch", "LoRA bf16, ckpt, 1x16, adamw_8bit",
                                   "LoRA bf16, ckpt, 1x16, paged 8-bit")]


def _source_here(base: Recipe) -> Recipe:
    """Notebook 07's cell 07-18: the source chapter's recipe at the base's sequence length."""
    return source_chapter_recipe().with_(model=base.model, max_seq_length=base.max_seq_length, precision="auto",
                                         steps=base.steps, learning_rate=base.learning_rate,
                                         label=f"source chapter recipe (seq {base.max_seq_length})")


def nb07_cpu() -> tuple[list, list]:
    """Notebook 07 as committed: the ladder on a CPU (its mixed-precision rung skipped), then the source recipe."""
    base = _tiny_base()
    rungs = [r for r in ladder(base) if r.label != "+ mixed precision"]
    figures = [(304.3, 302, True), (223.2, 1579, False), (69.9, 1166, False), (69.4, 290, True), (69.4, 1396, False),
               (59.0, 1184, False), (33.2, 717, True)]
    mine = [make(r, p, s, noisy=n) for r, (p, s, n) in zip(rungs, figures)]
    mine.append(make(_source_here(base), 59.0, 1066))
    return mine, notebook_reference("07")


def _nb07_gpu(model: str, figures, source: tuple[float, float], device: str,
              precision: str | None) -> tuple[list, list]:
    """Notebook 07's ladder (then the source recipe) on a GPU: figures are (GiB, tokens/s) per rung."""
    base = Recipe(model=model, micro_batch=4, max_seq_length=512, steps=6, learning_rate=2e-4,
                  label="baseline (LoRA, fp32)")
    mine = [make(r, g * 1024, s, device=device, gpu=True, precision=precision if r.precision == "auto" else None)
            for r, (g, s) in zip(ladder(base), figures)]
    mine.append(make(_source_here(base), source[0] * 1024, source[1], device=device, gpu=True, precision=precision))
    return mine, notebook_reference("07")


def nb07_t4() -> tuple[list, list]:
    """Notebook 07 on a free T4 (SmolLM2-360M): the T4 check's memory, speeds of the kind a T4 gives."""
    return _nb07_gpu("smollm2-360m", [(7.86, 8377), (1.99, 5830), (1.60, 1602), (1.58, 1425), (1.58, 1401),
                                      (0.87, 2130), (0.61, 1029), (0.56, 1890)], (0.61, 985), "Tesla T4", "fp16")


def nb07_h200() -> tuple[list, list]:
    """Notebook 07 with USE_LLAMA_8B on an H200: this run's points among the shipped runs of the same GPU."""
    return _nb07_gpu("llama-3.1-8b", [(36.1, 1240), (16.2, 1010), (15.5, 1215), (15.4, 1380), (15.4, 1330),
                                      (15.3, 2450), (8.3, 1150), (7.9, 1350)], (8.22, 1003), "NVIDIA H200", None)


def nb09_cpu() -> tuple[list, list]:
    """Notebook 09 as committed: the path on a CPU, Liger and activation offloading skipped."""
    src = source_chapter_recipe("tiny").with_(grad_accum=8, max_seq_length=128, steps=4, warmup_steps=1,
                                              learning_rate=1e-3, precision="fp32", label="source recipe (1x8)")
    path = [r.with_(liger_kernels=False, label=r.label) for r in beyond.path_from(src)]
    path = path[:3] + path[4:6]  # + Liger kernels and the activations on CPU cannot run on a CPU
    figures = [(33.2, 955), (33.2, 753), (33.2, 895), (58.7, 940), (211.4, 1568)]
    return [make(r, p, s) for r, (p, s) in zip(path, figures)], explore()


def nb09_h200() -> tuple[list, list]:
    """Notebook 09 with USE_LLAMA_8B on an H200: this run's points within a few percent of the shipped ones."""
    rng = random.Random(8)
    path = beyond.path_from(beyond.source("llama-3.1-8b"))
    figures = [(8.22, 1090), (5.81, 1177), (4.83, 1235), (4.81, 1545), (5.44, 4575), (9.03, 11752), (6.30, 10626)]
    mine = [make(r, g * 1024 * rng.uniform(0.98, 1.02), s * rng.uniform(0.95, 1.05), device="NVIDIA H200", gpu=True)
            for r, (g, s) in zip(path, figures)]
    return mine, explore()


# Notebooks 00-06 as committed (CPU): each figure's recipes with the peak (MiB) and tokens/s its results table
# shows, "~" marking a noisy speed
_LADDER_CPU = [(304.3, 2879, False), (223.2, 2880, False), (69.9, 1925, False), (69.4, 1722, False),
               (69.4, 2311, False), None, (59.0, 946, True)]


def _rungs(upto: int, figures=_LADDER_CPU) -> list[Measurement]:
    """The ladder's first `upto` rungs that run on a CPU (mixed precision does not), at the committed figures."""
    return [make(r, p, s, noisy=n) for r, f in zip(ladder(_tiny_base())[:upto], figures) if f is not None
            for p, s, n in [f]]


def notebook_reference(nn: str) -> list[Measurement]:
    """The shipped reference runs notebook `nn` passes to its figure: the labels of its reference_points call
    (read from the notebook, so the test follows the notebook), or of the cell before it."""
    import ast
    import json
    import re
    from pathlib import Path

    from course_utils.chapter.every_notebook import reference_points

    path = next((Path(__file__).parent.parent / "notebooks").glob(f"{nn}_*.ipynb"))
    sources = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    call = next(m for s in sources for m in [re.search(r"reference = reference_points\((.*?)\)(?:\n|$)", s, re.S)] if m)
    return reference_points(*ast.literal_eval("(" + call.group(1) + ",)"))


def nb00() -> tuple[list, list]:
    base = _tiny_base()
    return [make(base, 304.3, 1984, noisy=True), make(base.with_(lora_r=None, label="full fine-tune (fp32, AdamW)"),
                                                      339.2, 3607)], notebook_reference("00")


def nb01() -> tuple[list, list]:
    return [make(ladder(_tiny_base())[0], 304.3, 3697, noisy=True), *_rungs(2)[1:]], notebook_reference("01")


def nb02() -> tuple[list, list]:
    return _rungs(3), notebook_reference("02")


def nb03() -> tuple[list, list]:
    mine = _rungs(5)
    full = mine[2].recipe_obj.with_(lora_r=None, label="full FT, adamw_torch")
    return mine + [make(full, 121.5, 2238), make(full.with_(optimizer="adamw_8bit", label="full FT, adamw_8bit"),
                                                 100.0, 2478)], notebook_reference("03")


def nb04() -> tuple[list, list]:
    mine = _rungs(6)
    return mine + [make(mine[-1].recipe_obj.with_(precision="bf16", label="bf16 (this CPU, for the bytes)"), 44.3,
                        1529, precision="bf16")], notebook_reference("04")


def nb05() -> tuple[list, list]:
    return _rungs(7), notebook_reference("05")


def nb06() -> tuple[list, list]:
    short = _tiny_base().with_(gradient_checkpointing=True)
    return [make(short.with_(max_seq_length=v, label=f"max_seq_length={v}"), p, s)
            for v, p, s in ((64, 68.9, 1997), (128, 120.3, 2557), (256, 223.2, 2829))], notebook_reference("06")


NOTEBOOKS = {"00": nb00, "01": nb01, "02": nb02, "03": nb03, "04": nb04, "05": nb05, "06": nb06}
NOTEBOOK_TITLES = {"00": "Memory against speed: the starting points",
                   "06": "Memory against speed: sequence 64 to 256, with checkpointing"}


def crowded() -> tuple[list, list]:
    """A synthetic crowded case: eight of this run's points within a few pixels of each other, and every shipped
    Llama-3.1-8B run (three of them on top of each other between the 14.75 and 16 GiB lines)."""
    base = _tiny_base()
    mine = [make(base.with_(max_seq_length=64 + 8 * i, label=f"+ technique number {i}"), 60 + 3 * (i % 3),
                 1300.0 + 15 * i, noisy=i % 4 == 0) for i in range(8)]
    return mine, h200()


CASES = {"03-cpu": nb03_cpu, "07-cpu": nb07_cpu, "07-t4": nb07_t4, "07-h200": nb07_h200, "09-cpu": nb09_cpu,
         "09-h200": nb09_h200}
TITLES = {"03": "Memory against speed, every technique so far",
          "07": "Memory against speed: every technique in the chapter",
          "09": "Memory against speed: beyond the source recipe"}


def draw(case: str):
    """The notebook's figure for this case, as its cell draws it (a notebook 00-06 by its number, 'crowded')."""
    from course_utils.chapter.every_notebook import technique_figure

    if case in NOTEBOOKS:
        mine, reference = NOTEBOOKS[case]()
        return technique_figure(mine, reference, **({"title": NOTEBOOK_TITLES[case]} if case in NOTEBOOK_TITLES else {}))
    mine, reference = (crowded if case == "crowded" else CASES[case])()
    return technique_figure(mine, reference, title=TITLES.get(case[:2], "Memory against speed"))


if __name__ == "__main__":
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = sys.argv[1]
    for name in sys.argv[2:] or [*NOTEBOOKS, *CASES, "crowded"]:
        fig = draw(name)
        fig.savefig(f"{out}/{name}.png", dpi=100, bbox_inches="tight")  # as the inline backend shows it
        print(f"{out}/{name}.png", fig.get_size_inches() * 100)
        plt.close(fig)
