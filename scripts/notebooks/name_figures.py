"""Give every figure the texts pin a name: rewrite each `{{ expression }}` of the quiz banks, the notebooks' Markdown
and README.md as arithmetic over named figures (course_utils/chapter/figures.yaml), adding the names it needs.

    python scripts/notebooks/name_figures.py            # rewrite the texts, add names, write facts.json
    python scripts/notebooks/name_figures.py --count    # how many distinct placeholders, in how many places

A lookup (`ref('QLoRA 16x1').cuda_max_allocated / GiB`) becomes a name (`ref_qlora_16x1_allocated_gib`), named
after its source and quantity; the arithmetic around lookups stays in the text, so every figure renders exactly
as before. A placeholder that is already names only is left as it is. Notebooks change in Markdown cells only.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from course_utils.chapter import facts, figures  # noqa: E402

KNOWN: set = set()  # names already in the registry
ABOUT = {"t4_gib": "the free T4's memory, the one size of the card in the whole course (machine.PROFILES['t4'].card_bytes), "
                   "in GiB"}

UNITS = {"GiB": "gib", "MiB": "mib"}
NUM_UNITS = {1e9: "billions", 1e6: "millions"}
KEEP_CALLS = {"round", "abs", "min", "max"}

REF = {
    "source chapter recipe (QLoRA 1x16)": "source",
    "QLoRA 16x1": "qlora_16x1", "QLoRA 4x4": "qlora_4x4",
    "LoRA bf16, ckpt, 1x16, adamw_torch": "lora_bf16_ckpt",
    "LoRA bf16, no ckpt, 1x16, adamw_torch": "lora_bf16",
    "LoRA bf16, ckpt, 1x16, adamw_8bit": "lora_8bit",
    "LoRA bf16, ckpt, 1x16, paged 8-bit": "lora_paged",
    "LoRA bf16, ckpt, 16x1, adamw_torch": "lora_bf16_ckpt_16x1",
    "LoRA fp32, no ckpt, 1x16 (baseline)": "lora_fp32",
    "full FT bf16, ckpt, 1x16, adamw_8bit": "full_8bit",
    "full FT bf16, ckpt, 1x16, adamw_torch": "full_bf16_ckpt",
    "full FT bf16, no ckpt, 1x16, adamw_torch": "full_bf16",
}
RUNG = {
    "baseline (LoRA, fp32)": "baseline", "+ gradient checkpointing": "ckpt",
    "+ accumulation (micro-batch 1)": "accum", "+ 8-bit AdamW": "adam8bit",
    "+ paged 8-bit AdamW": "paged", "+ mixed precision": "mixed",
    "+ 4-bit QLoRA (NF4, double quant)": "qlora", "+ shorter sequences": "short",
}
BEYOND = {
    "fast recipe (16x1)": "fast", "lean recipe (4x4)": "lean", "source recipe (1x16)": "source",
    "source chapter recipe": "source", "fast + torch.compile": "fast_compiled",
    "lean + torch.compile": "lean_compiled", "+ Liger kernels": "liger", "+ embeddings on CPU": "embed_cpu",
    "+ no fp32 upcast": "no_upcast", "fast, embeddings + activations on CPU (16x1)": "fast_offload",
    "pick for 16.0 GiB": "pick_16gib", "pick for 8.0 GiB": "pick_8gib",
    "Unsloth 2026.10.9 (16x1)": "unsloth_16x1", "Unsloth 2026.10.9 (1x16)": "unsloth_1x16",
    "max_seq_length=128": "seq128", "max_seq_length=256": "seq256", "max_seq_length=512": "seq512",
}
MODEL = {"llama-3.1-8b": "llama8b", "llama-2-13b": "llama13b", "tiny": "tiny"}
ATTR = {"cuda_max_allocated": "allocated", "cuda_max_reserved": "reserved", "peak_bytes": "peak",
        "tokens_per_s": "tokens_per_s", "recipe_obj": "recipe", "per_gpu_gib": "per_gpu_gib",
        "per_gpu_bytes": "per_gpu"}
KW = {"gradient_checkpointing=False": "no_ckpt", "precision='auto'": "auto", "precision='fp16'": "fp16",
      "load_in_4bit=False": "no_4bit", "double_quant=False": "no_dq", "optimizer='adamw_torch'": "adamw_torch"}


def slug(s):
    return re.sub(r"_+", "_", re.sub(r"[^a-z0-9]+", "_", str(s).lower())).strip("_")


def const(node):
    return ast.literal_eval(node)


def is_unit(node):
    return (isinstance(node, ast.Name) and node.id in UNITS) or (
        isinstance(node, ast.Constant) and node.value in NUM_UNITS)


def unit_name(node):
    return UNITS[node.id] if isinstance(node, ast.Name) else NUM_UNITS[node.value]


def leafy(node):
    """Is node a lookup (not arithmetic, a constant or a unit)?"""
    if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Constant)):
        return False
    if isinstance(node, ast.Name) and node.id in UNITS:
        return False
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in KEEP_CALLS:
        return False
    return True


def split(node, leaves: dict):
    """`node` with every lookup replaced by its name (`leaves` collects {expression: name}); the arithmetic, units
    and round/abs/min/max around lookups stay. A lookup divided by a unit is one figure (`..._gib`)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and is_unit(node.right) and leafy(node.left):
        return leaf(node, leaves, unit_name(node.right))
    if isinstance(node, ast.BinOp):
        return ast.BinOp(split(node.left, leaves), node.op, split(node.right, leaves))
    if isinstance(node, ast.UnaryOp):
        return ast.UnaryOp(node.op, split(node.operand, leaves))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in KEEP_CALLS:
        return ast.Call(node.func, [split(a, leaves) for a in node.args], node.keywords)
    if isinstance(node, ast.Constant) or (isinstance(node, ast.Name) and node.id in UNITS):
        return node
    return leaf(node, leaves, None)


BYTES = ("_peak", "_allocated", "_reserved", "_parameters", "_gradients", "_optimizer", "_activations",
         "_temporaries", "_terms")


def leaf(node, leaves: dict, unit: str | None):
    if isinstance(node, ast.Name) and node.id in KNOWN:
        return node  # already a named figure
    src = ast.unparse(node)
    base = node.left if unit else node
    name = subject(base)
    name += f"_{unit}" if unit else "_bytes" if name.endswith(BYTES) else ""
    leaves[src] = name
    return ast.Name(name)


def subject(node) -> str:
    """A lookup's name: its source (the run, rung, recipe or model, shortened by the tables above) and quantity."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = subject(node.value)
        if isinstance(node.value, ast.Name) and node.value.id in ("lib", "targets"):
            return node.attr if node.value.id == "lib" else f"target_{node.attr}"
        return f"{base}_{ATTR.get(node.attr, node.attr)}"
    if isinstance(node, ast.Subscript):
        base = node.value
        key = const(node.slice)
        if isinstance(base, ast.Attribute) and base.attr in ("by_category", "peak_by_category"):
            return f"{subject(base.value)}_{slug(key)}"
        if isinstance(base, ast.Attribute) and base.attr == "losses":
            return f"{subject(base.value)}_{'last' if key == -1 else 'first'}_loss"
        return f"{subject(base)}_{slug(key)}"
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute):  # a method
            if f.attr == "with_":
                kws = [KW.get(f"{k.arg}={ast.unparse(k.value)}", f"{slug(k.arg)}_{slug(ast.unparse(k.value))}")
                       for k in node.keywords]
                kws = [k.replace("max_seq_length_", "seq") for k in kws]
                return subject(f.value) + "_" + "_".join(kws)
            parts = [BEYOND.get(const(a), slug(const(a))) for a in node.args] + [
                (k.arg if ast.unparse(k.value) == "True" else f"not_{k.arg}" if ast.unparse(k.value) == "False"
                 else f"{k.arg}_{slug(ast.unparse(k.value))}") for k in node.keywords]
            return "_".join([subject(f.value), f.attr, *parts])
        fn = f.id
        if fn == "ref":
            label = const(node.args[0])
            model = next((const(k.value) for k in node.keywords if k.arg == "model"), "llama-3.1-8b")
            return "ref_" + REF.get(label, slug(label)) + ("" if model == "llama-3.1-8b" else "_" + MODEL.get(model, slug(model)))
        if fn == "rung":
            return "tiny_" + RUNG.get(const(node.args[0]), slug(const(node.args[0])))
        if fn == "chapter":
            m = const(node.args[0]) if node.args else "llama-3.1-8b"
            return "chapter" + ("" if m == "llama-3.1-8b" else "_" + MODEL.get(m, slug(m)))
        if fn == "anchor":
            return "anchor"
        if fn == "est":
            hw = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "hardware"), None)
            hw = const(hw) if hw is not None else "cpu"
            s = subject(node.args[0])
            if s.startswith("tiny_") and hw == "cpu":
                return s  # the tiny ladder's rungs are estimated on the CPU
            return f"est_{s}" + ("" if hw == "cpu" else f"_{hw}")
        if fn == "dist":
            a = node.args
            hw = next((const(k.value) for k in node.keywords if k.arg == "hardware"), "gpu")
            return f"dist_{subject(a[0])}_{const(a[1])}gpu_{const(a[2])}" + ("" if hw == "gpu" else f"_{hw}")
        if fn == "beyond":
            run = const(node.args[1]) if len(node.args) > 1 else ""
            return "nb09_" + BEYOND.get(const(node.args[0]), slug(const(node.args[0]))) + ("_" + slug(run) if run else "")
        if fn == "t4":
            a = [const(x) for x in node.args]
            v = next((const(k.value) for k in node.keywords if k.arg == "variant"), "small")
            nb = a[0][:2]
            return f"t4_nb{nb}_" + BEYOND.get(a[1], RUNG.get(a[1], slug(a[1]))) + ("" if v == "small" else "_" + slug(v))
        if fn == "tf32":
            return "tf32_run_" + const(node.args[0])
        if fn == "peer":
            return "peer_" + const(node.args[0])
        if fn in ("toward", "profiled", "tried", "curves"):
            a = [const(x) for x in node.args]
            parts = [BEYOND.get(x, slug(x)) if i == 0 and fn != "curves" else slug(x) for i, x in enumerate(a)]
            for k in node.keywords:
                v = ast.unparse(k.value)
                if k.arg == "peak":
                    parts.append("measured_matmul")
                elif k.arg == "label":
                    parts.append(BEYOND.get(const(k.value), slug(const(k.value))))
                else:
                    parts.append(slug(v))
            return "_".join([fn, *[p for p in parts if p]])
        if fn == "flops":
            return "flops_" + subject(node.args[0])
        if fn == "shapes":
            return MODEL.get(const(node.args[0]), slug(const(node.args[0])))
        if fn == "nf4_bits":
            return "nf4_bits" + ("_dq" if const(node.args[0]) else "_no_dq")
        if fn == "planner":
            hw = const(node.args[2]) if len(node.args) > 2 else "gpu"
            budget = const(node.args[1]) if len(node.args) > 1 else None
            return "planner" + (f"_{slug(budget)}" if budget else "") + ("" if hw == "gpu" else f"_{hw}")
        if fn in ("accuracy", "matmul"):
            return fn
        if fn == "offline_examples":
            return "offline_examples_count"
        if fn == "len":
            return subject(node.args[0]) + "_count"
        if fn == "sum":  # sum(t.nbytes for t in E.terms if <condition on the term's name>)
            gen = node.args[0]
            terms = gen.generators[0].iter
            words = [c.value for c in ast.walk(gen.generators[0].ifs[0]) if isinstance(c, ast.Constant)
                     and c.value != "parameters"]
            return f"{subject(terms.value)}_{'_'.join(slug(w) for w in words)}_terms"
    raise SystemExit(f"cannot name {ast.unparse(node)}: teach subject() in {Path(__file__).name}, or add the "
                     f"figure to figures.yaml by hand")


KIND = {"ref": "the shipped H200 reference run {0!r}", "rung": "the tiny ladder's rung {0!r}",
        "beyond": "notebook 09's shipped run {0!r}", "beyond2": "notebook 09's shipped {1} run {0!r}", "t4": "the shipped T4 check of notebook {0}, run {1!r}",
        "tf32": "notebook 04's shipped {0} run", "peer": "the peer stack's run at {0}", "shapes": "{0}'s shapes",
        "toward": "{0!r} against its limit", "tried": "the shipped try {0!r}", "profiled": "the profile of {0!r}",
        "curves": "notebook 09's loss curves", "planner": "the budget planner", "accuracy": "the estimate against every GPU reference run",
        "matmul": "the H200's measured bf16 matmul rate", "chapter": "the source chapter's recipe",
        "anchor": "the multi-GPU anchor recipe", "nf4_bits": "bits per weight of NF4",
        "offline_examples": "the instruction records shipped for offline use", "flops": "FLOPs per token",
        "dist": "the multi-GPU estimate", "est": "the estimate"}
UNIT_WORDS = {"gib": ", in GiB", "mib": ", in MiB", "billions": ", in billions", "millions": ", in millions"}


def about(src: str, name: str) -> str:
    """A line saying what a lookup is: the quantity, of what source, in what unit."""
    node = ast.parse(src, mode="eval").body
    unit = ""
    if isinstance(node, ast.BinOp) and is_unit(node.right):
        unit, node = UNIT_WORDS[unit_name(node.right)], node.left
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in KIND]
    if name in ABOUT:
        return ABOUT[name]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("lib", "targets"):
        what = ("a constant of the libraries or the course's profiles" if node.value.id == "lib"
                else "a target of notebook 09 (beyond_the_recipe)")
        return f"{what}: {node.attr}{unit}"
    parts, hw = [], None
    for c in calls:
        if c.func.id == "est":
            hw = c.args[1] if len(c.args) > 1 else next((k.value for k in c.keywords if k.arg == "hardware"), None)
            hw = ast.literal_eval(hw) if hw is not None else "cpu"
            continue
        args = [ast.literal_eval(a) for a in c.args if isinstance(a, ast.Constant)]
        kind = "beyond2" if c.func.id == "beyond" and len(args) > 1 else c.func.id
        try:
            parts.append(KIND[kind].format(*args) if args or "{" not in KIND[c.func.id] else KIND[c.func.id])
        except IndexError:
            parts.append(KIND[c.func.id].split(" {")[0])
    where = ", of ".join(dict.fromkeys(parts))
    if hw:
        where = f"the {hw.upper()} estimate of {where}"
    return f"{quantity(node)} of {where}{unit}" if where else f"{quantity(node)}{unit}"


QUANT = {"cuda_max_allocated": "CUDA's peak allocated memory", "cuda_max_reserved": "CUDA's peak reserved memory",
         "peak_bytes": "the tracked peak", "tokens_per_s": "tokens per second", "trainable_params": "trainable parameters",
         "total_params": "parameters in all", "per_gpu_gib": "memory per GPU", "per_gpu_bytes": "memory per GPU"}


def quantity(node) -> str:
    if isinstance(node, ast.Attribute):
        return QUANT.get(node.attr, node.attr.replace("_", " "))
    if isinstance(node, ast.Subscript):
        key = ast.literal_eval(node.slice)
        if isinstance(node.value, ast.Attribute) and node.value.attr in ("by_category", "peak_by_category"):
            return f"{key} at the peak"
        if isinstance(node.value, ast.Attribute) and node.value.attr == "losses":
            return "the last loss" if key == -1 else "the first loss"
        return str(key) if isinstance(node.value, ast.Call) else f"{quantity(node.value)}: {key}"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return f"{node.func.attr}({', '.join(ast.unparse(a) for a in [*node.args, *node.keywords])})"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
        return f"how many {quantity(node.args[0])}"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sum":
        return f"bytes of the terms where {ast.unparse(node.args[0].generators[0].ifs[0])}"
    return "the value"


# --- the texts -----------------------------------------------------------------------------------------------------
def text_files() -> list[Path]:
    return [*sorted((ROOT / "quizzes").glob("*.yaml")), *sorted((ROOT / "notebooks").glob("*.ipynb")),
            ROOT / "README.md", ROOT / "GLOSSARY.md", ROOT / "TROUBLESHOOTING.md"]


def texts_of(path: Path):
    """Each text of a file: the whole file, or a notebook's Markdown cells."""
    if path.suffix != ".ipynb":
        yield path.read_text(encoding="utf-8")
        return
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            yield "".join(cell["source"])


def parts(inner: str) -> tuple[str, str | None]:
    expr = " ".join(inner.split())
    found = facts._SPEC.match(expr)
    if found and "(" not in found.group(2):
        return found.group(1), found.group(2)
    return expr, None


def census() -> str:
    """Places, distinct placeholders (of them in more than one file, in more than one place), and how many of the
    places type a source's expression rather than names (with the characters of all placeholders)."""
    where = collections.defaultdict(list)
    for path in text_files():
        for text in texts_of(path):
            for m in facts.PLACEHOLDER.finditer(text):
                where[" ".join(m.group(1).split())].append(path.name)
    names = set(figures.registry()) if figures.REGISTRY.exists() else set()
    typed = sum(len(v) for e, v in where.items()
                if set(re.findall(r"[A-Za-z_]\w*", parts(e)[0])) - names - figures.ARITHMETIC.keys())
    chars = sum(len(e) * len(v) for e, v in where.items())
    return (f"places {sum(map(len, where.values()))}, distinct {len(where)} (in more than one file "
            f"{sum(len(set(v)) > 1 for v in where.values())}, in more than one place {sum(len(v) > 1 for v in where.values())}); "
            f"places that type a source expression: {typed}; characters inside placeholders: {chars}")


def rewrite(text: str, leaves: dict) -> str:
    def one(m: re.Match) -> str:
        expr, spec = parts(m.group(1))
        new = ast.unparse(split(ast.parse(expr, mode="eval").body, leaves))
        return "{{ " + new + (f" :{spec}" if spec is not None else "") + " }}"
    return facts.PLACEHOLDER.sub(one, text)


def rewrite_file(path: Path, leaves: dict) -> bool:
    old = path.read_text(encoding="utf-8")
    if path.suffix != ".ipynb":
        new = rewrite(old, leaves)
    else:
        nb = json.loads(old)
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                text = "".join(cell["source"])
                if "{{" in text and (changed := rewrite(text, leaves)) != text:
                    cell["source"] = changed.splitlines(keepends=True)
        new = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if new != old:
        path.write_text(new, encoding="utf-8")
    return new != old


def registry_text(entries: dict) -> str:
    import yaml

    header = ("# The course's named figures (course_utils.chapter.figures): each name is one expression over\n"
              "# course_utils.chapter.facts' sources, and a line saying what it is. Texts pin figures by these names.\n"
              "# After a change: python -m course_utils.chapter.facts --write (renders course_utils/reference/facts.json).\n")
    ordered = {n: {"expr": entries[n]["expr"], "about": entries[n]["about"]} for n in sorted(entries)}
    return header + yaml.safe_dump(ordered, sort_keys=False, allow_unicode=True, width=120, default_flow_style=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", action="store_true", help="count the placeholders, change nothing")
    args = ap.parse_args(argv)
    print(census())
    if args.count:
        return 0
    entries = {}
    if figures.REGISTRY.exists():
        import yaml

        entries = yaml.safe_load(figures.REGISTRY.read_text(encoding="utf-8")) or {}
    KNOWN.update(entries)
    leaves: dict = {}
    changed = [p.name for p in text_files() if rewrite_file(p, leaves)]
    names = collections.defaultdict(set)
    for src, name in leaves.items():
        names[name].add(src)
    clash = {n: s for n, s in names.items() if len(s) > 1 or (n in entries and entries[n]["expr"] not in s)}
    if clash:
        raise SystemExit(f"one name for two expressions (name them in this script): {clash}")
    for src, name in leaves.items():
        entries.setdefault(name, {"expr": src, "about": about(src, name)})
    figures.REGISTRY.write_text(registry_text(entries), encoding="utf-8")
    print(f"{len(changed)} files rewritten, {len(entries)} named figures")
    subprocess.run([sys.executable, "-m", "course_utils.chapter.facts", "--write"], cwd=ROOT, check=True)
    figures.registry.cache_clear()
    print("after:", census())
    return 0


if __name__ == "__main__":
    sys.exit(main())
