"""The one notebook writer: every cell the course generates in notebooks/*.ipynb, written from the package by one
cell-writing core (read a notebook, change its cells, write it back only if it changed; `--check` writes nothing and
exits 1 when a file would change). Each writer is idempotent: run on the committed notebooks it changes nothing
(tests/test_write_notebooks.py runs `all --check` and `clean` over them).

    python scripts/notebooks/write_notebooks.py all [--check]            # every writer but clean, every notebook
    python scripts/notebooks/write_notebooks.py setup [--check]          # badge, Colab setup cell, Colab metadata
    python scripts/notebooks/write_notebooks.py troubleshooting [--check] # the troubleshooting cell after the setup
    python scripts/notebooks/write_notebooks.py exercises [--check] [NB ...]  # the "Try it" block before the quiz
    python scripts/notebooks/write_notebooks.py own-script [--check]     # the "In your own script" cells
    python scripts/notebooks/write_notebooks.py glossary [--check]       # link each glossary term where it first appears
    python scripts/notebooks/write_notebooks.py figures [--check] [FILE ...]  # pinned figures, README.md too
    python scripts/notebooks/write_notebooks.py clean NB ...             # after executing: no widget state, no paths

What each writes, and from where:
- setup: the "Open in Colab" badge (every_notebook.REPOSITORY, RELEASE_TAG), the first code cell from the one
  template every_notebook.setup_cell() with SETUP_CELL_METADATA (Colab's form view), and COLAB_METADATA (a T4 runtime).
- troubleshooting: troubleshooting.guide.notebook_markdown, a Markdown cell tagged "troubleshooting" right after
  the setup cell.
- exercises: chapter/exercises.py's exercise as five cells tagged "exercise" before the Markdown cell that says
  "Check what you measured": "## Try it"; `show_exercise` (its figures come from the notebook's base recipe);
  the answer cell, the libraries' objects of the rung the task starts from (the learner changes the lines marked
  `# <- ?`); a collapsed solution cell (tags exercise + solution) whose button shows the worked solution;
  `check_exercise`, which checks the worked solution while the answer is still that rung (so nbval tests it).
  A cell whose source and tags are already right keeps its outputs and id.
- own-script: a heading and one literal code cell after each notebook's measurement, from build.library_objects of
  the recipe it names (chapter/own_script.py); tests/test_own_script.py holds every argument equal to build's.
- glossary: chapter/glossary.with_links: a term's first prose mention becomes a link, or the Markdown cell above
  the output where it first shows gets a "Terms" line.
- figures: facts.refresh rewrites each pinned figure (`8.2<!--{{ expr :.1f }}-->`) and lists the ones that
  changed, so the prose around them can be read again (a number is rewritten, never reworded).
- clean: removes widget state only (the notebook's `widgets` metadata and each output's widget view; a widget's
  static copy, course_utils.static_copy, stays; an output left with only the widget's repr is dropped), names the
  kernel as ipykernel does, and fails naming the cell if an absolute path remains in an output.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

NOTEBOOKS = ROOT / "notebooks"


# --- the core: one way to read, change and write a notebook's cells -------------------------------------------
def lines(text: str) -> list[str]:
    """A cell's source as nbformat stores it."""
    return text.splitlines(keepends=True)


def make_cell(kind: str, source: str, metadata: dict, cell_id: str) -> dict:
    """A new notebook cell (nbformat 4.5), code cells unexecuted, keys in the files' order."""
    cell = {"cell_type": kind, "id": cell_id, "metadata": metadata, "source": lines(source)}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return dict(sorted(cell.items()))


def tagged(cell: dict, tag: str) -> bool:
    return tag in cell.get("metadata", {}).get("tags", [])


def dump(nb: dict) -> str:
    """The notebook's JSON exactly as the committed files are written."""
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


Writer = Callable[[dict, Path, list], dict]  # (notebook, its path, problems to append to) -> the new notebook


def write(path: Path, writer: Writer, check: bool = False, problems: list | None = None) -> bool:
    """Apply `writer` to one notebook; write the file if it changed (unless `check`). True if it changes (or would)."""
    text = path.read_text(encoding="utf-8")
    out = dump(writer(json.loads(text), path, problems if problems is not None else []))
    if out == text:
        return False
    if not check:
        path.write_text(out, encoding="utf-8")
    return True


# --- setup: badge, Colab setup cell, Colab metadata -------------------------------------------------------------
BADGE = re.compile(r"\[!\[Open In Colab\]\(https://colab\.research\.google\.com/assets/colab-badge\.svg\)\]\([^)]*\)")


def setup(nb: dict, path: Path, problems: list) -> dict:
    """The notebook with its badge, setup cell (source; its outputs stay empty) and Colab metadata rewritten."""
    from course_utils.chapter.every_notebook import COLAB_METADATA, SETUP_CELL_METADATA, colab_url, setup_cell

    rel = path.resolve().relative_to(ROOT).as_posix() if path.resolve().is_relative_to(ROOT) else f"notebooks/{path.name}"
    badge = f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(rel)})"
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            source = "".join(cell["source"])
            new = BADGE.sub(badge, source)
            if new != source:
                cell["source"] = lines(new)
    first = next((c for c in nb["cells"] if c["cell_type"] == "code"), None)
    if first is None or "google.colab" not in "".join(first["source"]):
        raise SystemExit(f"{path.name}: the first code cell is not the Colab setup cell; add one (any old one) first")
    first["source"] = lines(setup_cell())
    first["outputs"] = []
    first["metadata"] = {**first.get("metadata", {}), **SETUP_CELL_METADATA}
    nb["metadata"] = {**COLAB_METADATA, **{k: v for k, v in nb["metadata"].items() if k not in COLAB_METADATA}}
    return nb


# --- troubleshooting: one Markdown cell after the setup cell ----------------------------------------------------
TROUBLE_TAG = "troubleshooting"


def troubleshooting(nb: dict, path: Path, problems: list) -> dict:
    """The notebook with its troubleshooting cell in place right after the first code cell (the setup)."""
    from course_utils.chapter.troubleshooting.guide import notebook_markdown

    cells = [c for c in nb["cells"] if not tagged(c, TROUBLE_TAG)]
    cell = make_cell("markdown", notebook_markdown(path.name[:2]), {"tags": [TROUBLE_TAG]}, TROUBLE_TAG)
    at = next(i for i, c in enumerate(cells) if c["cell_type"] == "code") + 1
    return {**nb, "cells": cells[:at] + [cell] + cells[at:]}


# --- exercises: the "Try it" block before the quiz ---------------------------------------------------------------
TAG, SOLUTION_TAG = "exercise", "solution"
QUIZ_MARK = "Check what you measured"
INTRO = """## Try it

A short task on this notebook's technique, set from this notebook's own recipe: the next cell shows it,
with its figures computed when it runs. You answer in the libraries' own code: the answer cell holds the
`SFTConfig` (and where the task needs them the `LoraConfig`, `BitsAndBytesConfig` or accelerate config) of
the rung you start from. Change the lines marked `# <- ?`, run it, then run the check: the course reads
your objects back into a recipe (`course_utils.from_library`), estimates it and says why it holds or not.
The worked solution shows only when you ask for it: the cell after the answer has a button (try the task
first)."""


def exercise_block(ex) -> list[tuple[str, str, dict]]:
    """An exercise's cells as (cell type, source, metadata)."""
    from course_utils.recipe import base_recipe_for

    name, base = ex.notebook, ex.base_name
    imports = "from course_utils.chapter.exercises import check_exercise, show_exercise, show_solution\n"
    show = imports + (ex.setup + "\n" if ex.setup else "") + f'\nshow_exercise("{name}", {base})'
    tags = {"tags": [TAG]}
    return [("markdown", INTRO, tags),
            ("code", show, tags),
            ("code", ex.answer_cell(base_recipe_for("tiny", "cpu"), "cpu"), tags),  # the rung, in library code
            ("code", f'show_solution("{name}", {base})',
             {"jupyter": {"source_hidden": True}, "tags": [TAG, SOLUTION_TAG]}),
            ("code", f'check_exercise("{name}", answer, {base})', tags)]


def _same(cell: dict, kind: str, source: str, metadata: dict) -> bool:
    """Whether an existing cell already is this one (outputs and execution metadata aside)."""
    meta = cell.get("metadata", {})
    return (cell["cell_type"] == kind and "".join(cell["source"]) == source
            and meta.get("tags") == metadata["tags"] and meta.get("jupyter") == metadata.get("jupyter"))


def exercises(nb: dict, path: Path, problems: list) -> dict:
    """The notebook with its exercise's block before its quiz section, replacing any earlier block."""
    from course_utils.chapter.exercises import EXERCISES

    if path.stem not in EXERCISES:
        raise SystemExit(f"{path}: no exercise named {path.stem!r} in course_utils/chapter/exercises.py "
                         f"(there are: {', '.join(EXERCISES)})")
    ex = EXERCISES[path.stem]
    old = [c for c in nb["cells"] if tagged(c, TAG)]
    cells = [c for c in nb["cells"] if not tagged(c, TAG)]
    quiz = next((i for i, c in enumerate(cells)
                 if c["cell_type"] == "markdown" and QUIZ_MARK in "".join(c["source"])), None)
    if quiz is None:
        raise SystemExit(f"{path}: no Markdown cell says {QUIZ_MARK!r}, so there is no quiz section to put the "
                         "exercise before; add the quiz section first")
    ids = {c.get("id") for c in cells}
    new = []
    for k, (kind, source, metadata) in enumerate(exercise_block(ex)):
        kept = old[k] if k < len(old) and _same(old[k], kind, source, metadata) else None
        cell_id = f"{ex.notebook[:2]}-try-{k}"
        if kept is None and cell_id in ids:
            raise SystemExit(f"{path}: a cell already has the id {cell_id!r}; rename it")
        new.append(kept or make_cell(kind, source, metadata, cell_id))
    nb["cells"] = cells[:quiz] + new + cells[quiz:]
    return nb


# --- own-script: the "In your own script" cells ------------------------------------------------------------------
# notebook: (kind, label, after, id of the cell the new cells follow, what the markdown says)
def own_script_rows() -> dict[str, tuple]:
    """{notebook stem: its room's OWN_SCRIPT row} for every notebook whose room (course_utils/chapter/<slug>.py)
    has one: what the own-script writer writes, kept in the lesson's room beside its exercise."""
    import importlib

    rows = {}
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        room = importlib.import_module(f"course_utils.chapter.{path.stem[3:]}")
        if hasattr(room, "OWN_SCRIPT"):
            rows[path.stem] = room.OWN_SCRIPT
    return rows


ALWAYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "bf16", "fp16",
          "activation_checkpointing", "optim", "max_length", "packing", "packing_strategy")
HUB_ID = "meta-llama/Llama-3.1-8B"
INTRODUCES_NEXT = {"00_where_memory_goes"}  # the markdown after the measurement introduces the next cell


def args_text(call: str, exp: dict, changed: set, always=(), order=None, indent="    ") -> list[str]:
    """The argument lines of `call`: the ones that differ from the library's default, `always`, and the changed
    ones (each changed one on its own line with the marker)."""
    from course_utils.chapter import own_script
    from course_utils.chapter.library_map import show

    default = own_script.defaults()[call]
    names = [n for (c, n) in exp if c == call and n]
    if order:
        names = sorted(names, key=lambda n: order.index(n) if n in order else len(order))
    plain, marked = [], []
    for n in names:
        value = exp[(call, n)]
        if (call, n) in changed:
            marked.append(f"{indent}{n}={show(value)},  {own_script.NEW}")
        elif n in always or default.get(n, object()) != value:
            plain.append(f"{n}={show(value)}")
    lines, line = [], indent
    for part in plain:
        if len(line) + len(part) > 100:
            lines.append(line.rstrip())
            line = indent
        line += part + ", "
    if line.strip():
        lines.append(line.rstrip())
    return lines + marked


def render(kind: str, label: str, after: str | None) -> str:
    """The code cell that writes recipe `label` of `kind` in the libraries' own lines (after recipe `after`)."""
    from course_utils.chapter import own_script

    recipe = own_script.find(kind, label)
    o = own_script.objects(recipe)
    exp = own_script.expected(o)
    changed: set = set()
    if after is not None:
        before = own_script.expected(own_script.objects(own_script.find(kind, after)))
        changed = {k for k in exp if before.get(k, "absent") != exp[k]} | {k for k in before if k not in exp}
    new_calls = {c for (c, n) in changed if n == ""}
    four_bit = o.quantization_config is not None
    where = f'(after "{after}")' if after else ""
    out = [f"# In your own script: the libraries' lines that train this recipe ({HUB_ID} on a GPU)",
           f'# recipe: {kind} "{label}" {where}'.rstrip(),
           "import os" if kind == "multi" else None,
           "import torch",
           "from peft import LoraConfig, get_peft_model" + (", prepare_model_for_kbit_training"
                                                            if o.prepare_kbit_kwargs else ""),
           "from transformers import AutoModelForCausalLM, AutoTokenizer" + (", BitsAndBytesConfig" if four_bit else ""),
           "from trl import SFTConfig, SFTTrainer",
           "",
           "TRAIN_HERE = False  # True loads Llama-3.1-8B here and trains it (a GPU with room for it)"]
    if four_bit:
        mark = f"  {own_script.NEW}" if ("BitsAndBytesConfig", "") in changed else ""
        bnb_changed = changed if not mark else set()
        out += [f"bnb_config = BitsAndBytesConfig({mark}"]
        out += args_text("BitsAndBytesConfig", exp, bnb_changed, always=("bnb_4bit_compute_dtype",))
        out += [")  # on a T4 (no bf16): bnb_4bit_compute_dtype=torch.float16"]
    exp[("LoraConfig", "target_modules")] = list(recipe.lora_targets)  # in the recipe's order (peft keeps a set)
    out += ["lora_config = LoraConfig("]
    out += args_text("LoraConfig", exp, changed, always=("r", "lora_alpha", "lora_dropout", "target_modules"))
    out += [")", "args = SFTConfig(",
            '    output_dir="lora-out", report_to="none", use_cpu=not torch.cuda.is_available(),']
    out += args_text("SFTConfig", exp, changed, always=ALWAYS, order=ALWAYS)
    out += [")", "if TRAIN_HERE:"]
    device = '{"": int(os.environ.get("LOCAL_RANK", 0))}' if kind == "multi" else '{"": 0}'
    out += ["    model = AutoModelForCausalLM.from_pretrained(", f'        "{HUB_ID}", device_map={device},']
    out += args_text("from_pretrained", exp, changed, always=("dtype",), indent="        ")
    out += ["    )"]
    if o.prepare_kbit_kwargs:
        mark = f"  {own_script.NEW}" if "prepare_model_for_kbit_training" in new_calls else ""
        out += [f"    model = prepare_model_for_kbit_training(  {mark.strip()}".rstrip(), "        model,"]
        out += args_text("prepare_model_for_kbit_training", exp, changed if not mark else set(),
                         always=tuple(o.prepare_kbit_kwargs), indent="        ")
        out += ["    )"]
    elif four_bit:
        mark = f"  {own_script.NEW}" if ("prepare_model_for_kbit_training", "") in changed else ""
        out += [f"    # no prepare_model_for_kbit_training(model): no fp32 upcast{mark}"]
    world = ' * int(os.environ.get("WORLD_SIZE", 1))' if kind == "multi" else ""
    step = f"{recipe.micro_batch} * {recipe.grad_accum}{world}"
    out += ["    model = get_peft_model(model, lora_config)",
            f'    tokenizer = AutoTokenizer.from_pretrained("{HUB_ID}")',
            "    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token",
            "    from course_utils.data import load_instructions, to_text_dataset",
            '    dataset = to_text_dataset(load_instructions("dolly"))  # or your own: a "text" column',
            "    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)",
            '    full = trainer.train_dataset.filter(lambda row: len(row["input_ids"]) == args.max_length)  # whole blocks',
            f"    per_step = {step}  # sequences per optimizer step",
            "    trainer.train_dataset = full.select(range(len(full) - len(full) % per_step))  # whole steps",
            "    if torch.cuda.is_available():",
            "        torch.cuda.reset_peak_memory_stats()",
            "    trainer.train()",
            "    if torch.cuda.is_available():",
            '        print(f"max allocated {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, "',
            '              f"max reserved {torch.cuda.max_memory_reserved() / 2**30:.2f} GiB")']
    if kind == "multi":
        out += ["# run it as train.py on 2 GPUs: accelerate launch --config_file ddp.yaml --num_processes 2 train.py",
                "# (course_utils/accelerate_configs/); under FSDP also bnb_4bit_quant_storage=torch.bfloat16"]
    return "\n".join(line for line in out if line is not None)



OWN_SCRIPT_SUFFIX = ("### In your own script\n\n", " Set `TRAIN_HERE = True` on a GPU to train it; `tests/test_own_script.py` "
                     "holds every argument equal to what the course's `build` passes for this recipe (the README's field table).")


def own_script_cells(nb: dict, path: Path, problems: list) -> dict:
    """The notebook with its two "In your own script" cells rewritten in place (found by the ids ending in
    -own-script-md and -own-script, so they keep their ids and outputs), or put after the cell CELLS names."""
    kind, label, after, follows, says = own_script_rows()[path.stem]
    cells = nb["cells"]
    md_text = OWN_SCRIPT_SUFFIX[0] + says + OWN_SCRIPT_SUFFIX[1]
    code_text = render(kind, label, after)
    ids = [c.get("id", "") for c in cells]
    md_at = next((i for i, x in enumerate(ids) if x.endswith("-own-script-md")), None)
    code_at = next((i for i, x in enumerate(ids) if x.endswith("-own-script")), None)
    if code_at is not None and md_at is not None:
        cells[md_at]["source"], cells[code_at]["source"] = lines(md_text), lines(code_text)
        return nb
    if follows not in ids:
        raise SystemExit(f"{path.name}: no cell with the id {follows!r} to put the own-script cells after; "
                         f"set it in OWN_SCRIPT in course_utils/chapter/{path.stem[3:]}.py")
    at = ids.index(follows) + 1
    while (path.stem not in INTRODUCES_NEXT and at < len(cells) and cells[at]["cell_type"] == "markdown"
           and not "".join(cells[at]["source"]).startswith("#")):
        at += 1  # the measurement's own commentary stays with it
    cells[at:at] = [make_cell("markdown", md_text, {}, f"{path.stem[:2]}-own-script-md"),
                    make_cell("code", code_text, {}, f"{path.stem[:2]}-own-script")]
    return nb


# --- glossary, figures, clean -------------------------------------------------------------------------------------
def glossary(nb: dict, path: Path, problems: list) -> dict:
    """The notebook with each glossary term linked where it first appears."""
    from course_utils.chapter.glossary import with_links

    return with_links(nb)


def figures(nb: dict, path: Path, problems: list) -> dict:
    """The notebook with its markdown's pinned figures as their sources give them now; each change in `problems`."""
    from course_utils.chapter import facts

    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        new, changed = facts.refresh(text)
        if changed:
            problems += [(path.name, *c) for c in changed]
            cell["source"] = lines(new)
    return nb


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
REPR_ONLY = {"text/plain"}  # what ipywidgets and tqdm add beside the view: the widget's repr
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:home|root|work|tmp|usr|opt|Users|content)/[\w.\-/]+")


def _without_widget_state(out: dict) -> dict | None:
    """An output without its widget view; None when what is left is only the widget's repr."""
    data = out.get("data", {})
    if WIDGET_VIEW not in data:
        return out
    static = {k: v for k, v in data.items() if k != WIDGET_VIEW}
    return None if set(static) <= REPR_ONLY else {**out, "data": static}


def _shown_text(out: dict) -> str:
    data = out.get("data", {})
    return json.dumps(out.get("text", "")) + "".join(json.dumps(data.get(k, "")) for k in ("text/plain", "text/markdown"))


def clean(nb: dict, path: Path, problems: list) -> dict:
    """The notebook without widget state, its kernel named as ipykernel names itself (JupyterLab rewrites another
    name when the kernel starts, marking the notebook modified); an absolute path left in an output in `problems`."""
    from ipykernel.kernelspec import KERNEL_NAME, get_kernel_dict

    spec = get_kernel_dict()
    nb.get("metadata", {}).pop("widgets", None)
    nb.setdefault("metadata", {})["kernelspec"] = {"display_name": spec["display_name"], "language": spec["language"],
                                                   "name": KERNEL_NAME}
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        cell["outputs"] = [kept for out in cell.get("outputs", []) if (kept := _without_widget_state(out)) is not None]
        for out in cell["outputs"]:
            if match := ABSOLUTE_PATH.search(_shown_text(out)):
                problems.append(f"{path.name} cell {i}: absolute path {match.group(0)!r}")
    return nb


# --- the command line -------------------------------------------------------------------------------------------
def _every() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def _with_exercise() -> list[Path]:
    from course_utils.chapter.exercises import WITHOUT_EXERCISE

    return [p for p in _every() if p.stem not in WITHOUT_EXERCISE]  # those say why they have no Try it


# name: (writer, the notebooks it writes by default)
WRITERS: dict[str, tuple[Writer, Callable[[], list[Path]]]] = {
    "setup": (setup, _every),
    "troubleshooting": (troubleshooting, _every),
    "exercises": (exercises, _with_exercise),
    "own-script": (own_script_cells, lambda: [NOTEBOOKS / f"{stem}.ipynb" for stem in own_script_rows()]),
    "glossary": (glossary, _every),
    "figures": (figures, _every),
    "clean": (clean, _every),
}
ALL = ("setup", "troubleshooting", "exercises", "own-script", "glossary", "figures")  # clean is for executed copies


def run(name: str, paths: list[Path], check: bool = False) -> tuple[list[Path], list]:
    """Run one writer over `paths` (its default notebooks when empty): (the files changed or that would, problems).
    `figures` also takes Markdown files (README.md by default)."""
    writer, default = WRITERS[name]
    if not paths:
        paths = default() + ([ROOT / "README.md"] if name == "figures" else [])
    changed, problems = [], []
    for path in paths:
        if path.suffix != ".ipynb":
            if name != "figures":
                raise SystemExit(f"{path}: {name} writes notebooks only (.ipynb)")
            from course_utils.chapter import facts

            text, found = facts.refresh(path.read_text(encoding="utf-8"))
            problems += [(path.name, *c) for c in found]
            if found:
                changed.append(path)
                if not check:
                    path.write_text(text, encoding="utf-8")
        elif write(path, writer, check, problems):
            changed.append(path)
    return changed, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("writer", choices=[*WRITERS, "all"])
    parser.add_argument("files", nargs="*", type=Path, help="default: the notebooks the writer writes")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    args = parser.parse_intermixed_args(argv)
    status = 0
    for name in ALL if args.writer == "all" else (args.writer,):
        changed, problems = run(name, args.files, args.check)
        for item in problems:
            print(f"{item[0]}: {item[1]} -> {item[2]}   {{{{ {item[3]} }}}}" if isinstance(item, tuple) else item)
        if problems and name == "clean":
            status = 1
        for path in changed:
            print(f"{name}: {'would change' if args.check else 'wrote'} {path.name}")
        if not changed:
            print(f"{name}: nothing to change")
        status |= int(args.check and bool(changed))
    return status


if __name__ == "__main__":
    sys.exit(main())
