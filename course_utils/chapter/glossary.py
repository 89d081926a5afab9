"""The course's glossary (GLOSSARY.md): the terms a learner meets without a word of explanation, each defined
once, and linked from every notebook where the term first appears (issue 30; the list of jargon is the
teaching review's, section 3.2).

Data, rendering and the notebooks' links. `python -m course_utils.chapter.glossary` writes GLOSSARY.md;
`python scripts/notebooks/write_notebooks.py glossary` links each term at its first appearance in a notebook
(`--check`: exit 1 when a link is missing). A term first appears either in a Markdown cell, whose first
mention then becomes a link (titled with the term's few words, shown on hover), or in a cell's output (a table's column, an estimate's line), in which case
the Markdown cell that introduces that output gets a "Terms" line with the link and a short definition.
The links are absolute, to the release tag as the troubleshooting links are, so that they work on Colab too.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from course_utils.chapter.every_notebook import RELEASE_TAG, REPOSITORY, release_url

GUIDE = Path(__file__).resolve().parents[2] / "GLOSSARY.md"


@dataclass(frozen=True)
class Term:
    term: str  # as the glossary's heading shows it
    short: str  # a few words, for a notebook's "Terms" line
    definition: str  # the glossary's paragraph
    pattern: str  # where the notebooks use it (a case-insensitive regular expression)

    @property
    def anchor(self) -> str:
        """GitHub's anchor of the heading: lower case, punctuation dropped, spaces as hyphens."""
        return re.sub(r"[^\w\- ]", "", self.term.lower()).replace(" ", "-")


TERMS = (
    Term("activations", "what the forward pass keeps for the backward pass",
         "The tensors a forward pass keeps so that the backward pass can compute gradients: the inputs of each "
         "linear layer, the attention and MLP intermediates, the norms' inputs. They grow with the tokens of a "
         "micro-batch (micro-batch x sequence length) and with the number of layers; gradient checkpointing keeps "
         "fewer of them and recomputes the rest.", r"\bactivations\b"),
    Term("temporaries", "memory alive only for a moment",
         "Memory allocated for a moment inside a step and freed again: the backward pass's own buffers, the logits "
         "and the loss, the optimizer step's scratch. They do not stay between steps, but they count at the peak.",
         r"\btemporaries\b"),
    Term("optimizer state", "what the optimizer keeps per trainable parameter",
         "What the optimizer keeps between steps for every trainable parameter. AdamW keeps two running averages "
         "of the gradient (its first and second moment); 8-bit optimizers keep them in one byte each.",
         r"\boptimizer state\b"),
    Term("micro-batch", "the sequences of one forward and backward pass",
         "The sequences that go through one forward and backward pass together. With gradient accumulation, "
         "several micro-batches make one optimizer step; their sum is the effective batch.",
         r"\bmicro-batch(?:es)?\b"),
    Term("RMSNorm", "the normalisation layer of Llama models",
         "Root-mean-square normalisation, the norm layer of Llama-architecture models: each hidden vector is "
         "divided by the square root of its mean square (the `rsqrt` in the estimate) and scaled by a learned "
         "weight. Its input is kept, in fp32, for the backward pass.", r"\bRMSNorm\b"),
    Term("logsumexp", "the softmax's normaliser, kept by fused attention",
         "The logarithm of the sum of the exponentials of a row of attention scores: the softmax's normaliser. A "
         "fused attention kernel keeps this one number per token and head instead of the whole score matrix, and "
         "recomputes the rest in the backward pass.", r"\blogsumexp\b"),
    Term("rotary tables", "the cos and sin tables of rotary position embeddings",
         "Rotary position embeddings (RoPE) encode a token's position by rotating its query and key vectors by "
         "angles that depend on the position. The cos and sin of those angles are computed once per step as two "
         "small tables.", r"\brotary\b"),
    Term("fused loss", "the loss computed from the hidden states in tiles",
         "A loss that goes from the last hidden states to the cross-entropy without ever holding the whole "
         "[tokens x vocabulary] logits: it computes them a tile of vocabulary columns at a time. trl's loss "
         "keeps the hidden states and one tile.", r"\bfused loss\b"),
    Term("loss tile", "the block of logits the fused loss computes at a time",
         "The [tokens x columns] block of logits the fused loss computes at once. On a GPU its backward runs as "
         "one kernel; on a CPU PyTorch runs a slower fallback that keeps several fp32 copies of the tile (the "
         "estimate's \"CPU fallback of the tile backward\").", r"\bloss tile\b|\btile backward\b"),
    Term("GFLOP/tok", "billions of floating-point operations per token",
         "Billions of floating-point operations a training step spends on one token: about six times the "
         "parameters that take part, for the forward and backward passes, plus attention.", r"GFLOP/tok"),
    Term("TFLOP", "trillions of floating-point operations",
         "Trillions of floating-point operations: a run's tokens x GFLOP/tok, in thousands. Divided by a GPU's peak "
         "rate (TFLOP/s) it gives the shortest time that GPU could train them in.", r"\bTFLOP\b"),
    Term("T4 peak", "a run's FLOPs at the T4's datasheet rate: a lower bound",
         "The time a run's floating-point operations take at the T4's datasheet peak rate. A real T4 reaches "
         "only a fraction of its peak, so this is the least time a T4 could need, never what it takes.",
         r"\bT4 peak\b"),
    Term("start+build", "start-up and model build time, before training",
         "The seconds a run spends before its first training step: starting Python, importing the libraries, "
         "building or loading the model and preparing the data.", r"start\+build"),
    Term("autocast", "PyTorch running chosen operations in lower precision",
         "PyTorch's automatic mixed precision: inside `torch.autocast`, matrix multiplications run in fp16 or "
         "bf16 while the weights stay in their own dtype and precision-sensitive operations stay in fp32.",
         r"\bautocast\b"),
    Term("math kernel", "attention computed step by step, keeping the score matrix",
         "The plain attention implementation: it computes the whole score matrix, its softmax and the weighted "
         "sum as separate operations and keeps them for the backward pass, so its memory grows with the square "
         "of the sequence length.", r"\bmath kernel\b"),
    Term("fused attention", "attention in one kernel, without the score matrix",
         "An attention kernel (FlashAttention, PyTorch's memory-efficient SDPA) that computes attention block by "
         "block in one pass and never stores the score matrix: its memory grows with the sequence length, not "
         "its square.", r"\bfused attention\b"),
    Term("score matrix", "the [tokens x tokens] attention scores of each head",
         "The attention scores of one head: every query against every key, a [tokens x tokens] matrix. It is "
         "what makes plain attention's memory grow with the square of the sequence length.", r"\bscore matri(?:x|ces)\b"),
    Term("grouped-query attention", "several query heads sharing one key and value head",
         "Attention in which several query heads share one key head and one value head (GQA). The keys and "
         "values, and what is kept of them, are smaller than the queries, as in Llama-3.1-8B.", r"\bgrouped-query attention\b|\bGQA\b"),
    Term("compute capability", "NVIDIA's version number of a GPU's features",
         "NVIDIA's version number for what a GPU generation can do: a T4 (Turing) has no bf16; Ampere GPUs (an "
         "A100) and later have bf16 and TF32. `torch.cuda.get_device_capability()` returns it.",
         r"\bcompute capability\b"),
    Term("CUDA context", "the memory a process uses once it starts using the GPU",
         "What a process allocates on the GPU as soon as it first uses CUDA: the driver's state and the loaded "
         "kernels of PyTorch and the libraries. It is not a tensor, so PyTorch's own count does not show it, but "
         "the card must hold it.", r"\bCUDA context\b"),
    Term("allocator's reserve", "memory PyTorch holds beyond its tensors",
         "PyTorch's caching allocator keeps freed blocks for reuse instead of returning them to the driver, and "
         "blocks are rounded up: the memory it has reserved is more than the tensors alive in it. "
         "`torch.cuda.max_memory_reserved()` counts it; `max_memory_allocated()` does not.",
         r"\ballocator's reserve\b"),
    Term("planner's rule", "the margin the planner adds to an estimated peak",
         "The course planner's margin for what a GPU must hold beyond the estimated allocated peak: the "
         "allocator's reserve and fragmentation (a factor) plus the CUDA context (a constant). "
         "`course_utils.estimate.plan.needed_bytes` is the rule.", r"\bplanner's rule\b"),
    Term("Pareto front", "the recipes no other recipe beats on both memory and speed",
         "Among several recipes, those for which no other is both leaner and faster: each one is a fair choice "
         "for some budget.", r"\bPareto\b"),
    Term("residual stream", "the hidden vector each layer reads and adds to",
         "The hidden vector of each token that runs through a transformer: every layer reads it and adds its "
         "output to it. Its size, hidden size per token, sets the size of most activations.",
         r"\bresidual stream\b"),
    Term("Triton", "a language for writing GPU kernels in Python",
         "OpenAI's language and compiler for GPU kernels written in Python. Liger's kernels and `torch.compile`'s "
         "generated kernels are Triton kernels, so they need a GPU.", r"\bTriton\b"),
    Term("CUDA graphs", "a recorded sequence of GPU kernels replayed in one launch",
         "A recording of a sequence of GPU kernel launches that the GPU replays in one go, which removes the CPU's "
         "launch cost per kernel. It pays off when a step is launch-bound.", r"\bCUDA graphs?\b"),
    Term("graph break", "where torch.compile stops one compiled graph and starts another",
         "A place where `torch.compile` cannot follow the Python code (a data-dependent branch, an unsupported "
         "call) and ends the compiled graph, running that part eagerly. Many graph breaks remove most of the "
         "speed-up.", r"\bgraph breaks?\b"),
    Term("launch-bound", "the GPU waits for the CPU to launch its kernels",
         "A step whose kernels are so small that the GPU finishes each one before the CPU has launched the next: "
         "time goes into launching, not computing. Bigger micro-batches, fused kernels or CUDA graphs help.",
         r"\blaunch-bound\b"),
    Term("unified memory", "memory the GPU and the CPU share, moved page by page",
         "CUDA memory that the GPU and the CPU address alike; the driver moves its pages to whichever side uses "
         "them. Paged optimizers keep their state in it, so that it can move to the CPU when the GPU runs out.",
         r"\bunified memory\b"),
    Term("peer", "the other library measured beside the course's recipes (Unsloth)",
         "In notebook 10: the other fine-tuning library (Unsloth) measured on the same GPU, model and data beside "
         "the course's own recipes, for a comparison on equal terms.", r"\bpeers?\b"),
    Term("lease", "one session on a lent GPU machine",
         "One session on a lent GPU machine, during which the course's reference runs were measured; runs of one "
         "lease share the machine, its driver and its load.", r"\blease\b"),
    Term("x floor", "a time as a multiple of its FLOP floor",
         "A run's measured time divided by its floor, the time its floating-point operations take at the GPU's "
         "peak rate: 1.0 would be the hardware's limit, and the larger it is, the more room a faster recipe has.",
         r"\bx floor\b"),
    Term("of limit", "a speed as a share of the GPU's limit",
         "A run's measured speed as a share of the fastest the GPU could go at its peak rate (the floor's "
         "inverse).", r"\bof limit\b"),
    Term("rank", "LoRA's r, or one process's number in a multi-GPU job",
         "Two meanings. In LoRA, the rank r is the inner size of the two small adapter matrices (`lora_r`). In "
         "multi-GPU training, a rank is the number of one process of the job, one per GPU; rank 0 usually "
         "prints and saves.", r"\branks?\b"),
    Term("gloo", "PyTorch's CPU backend for communication between processes",
         "PyTorch's communication backend for CPUs: it lets the DDP example run as two processes on a CPU.",
         r"\bgloo\b"),
    Term("NCCL", "NVIDIA's library for communication between GPUs",
         "NVIDIA's collective communication library: how GPUs exchange gradients and parameters (all-reduce, "
         "all-gather) in DDP and FSDP.", r"\bNCCL\b"),
    Term("root unit", "the FSDP unit that holds what no layer unit holds",
         "FSDP wraps each transformer layer as a unit whose parameters are gathered only while it runs; the root "
         "unit holds the rest (embeddings, final norm, output layer) and stays gathered longer.",
         r"\broot unit\b"),
    Term("flat parameter", "FSDP's one flat tensor per unit, split across GPUs",
         "FSDP (version 1) joins all parameters of a unit into one flat tensor and gives each GPU an equal slice "
         "of it; the slices are gathered into the whole only while the unit runs.", r"\bflat parameters?\b"),
    Term("meta device", "tensors with a shape but no memory",
         "PyTorch's `meta` device: tensors that have shapes and dtypes but no data. A model built there costs no "
         "memory, which is how a large model's shapes are inspected, or sharded before any weight is loaded.",
         r"\bmeta device\b"),
)


def term(name: str) -> Term:
    found = [t for t in TERMS if t.term == name]
    if not found:
        raise KeyError(f"no glossary term {name!r}; the terms: {', '.join(t.term for t in TERMS)}")
    return found[0]


def link(name: str) -> str:
    """The glossary entry's address, at the release tag (course_utils.chapter.every_notebook.REPOSITORY)."""

    return release_url(GUIDE.name, term(name).anchor)


def render() -> str:
    """GLOSSARY.md."""
    lines = ["# Glossary", "",
             "The terms the notebooks use without stopping to explain them, each in a few sentences. Each "
             "notebook links a term here where it first appears. Written by `python -m course_utils.chapter.glossary` "
             "from `course_utils/chapter/glossary.py`.", ""]
    for t in sorted(TERMS, key=lambda t: t.term.lower()):
        lines += [f"## {t.term}", "", t.definition, ""]
    return "\n".join(lines)


# --- the notebooks' links ----------------------------------------------------------------------------
GENERATED = ("troubleshooting", "exercise")  # Markdown cells other scripts write: never edited here
TERMS_LINE = "*Terms:* "  # the line the introducing Markdown cell gets for terms first seen in an output
QUIZ_CALLS = ("show_quiz(", "show_chapter_quiz(")


def _shown(cell: dict) -> str:
    """What a cell shows a learner as text: a Markdown cell's source (code spans and links left out, where a
    term is not prose), a code cell's outputs (the quiz's static copy left out: the quiz comes last)."""
    if cell["cell_type"] == "markdown":
        text = "".join(line for line in cell["source"] if not line.startswith(TERMS_LINE))  # its own words
        return re.sub(r"`[^`]*`|\]\([^)]*\)|<!--.*?-->", " ", text)
    if any(call in "".join(cell["source"]) for call in QUIZ_CALLS):
        return ""
    parts = []
    for out in cell.get("outputs", []):
        parts.append("".join(out.get("text", "")))
        parts.append("".join(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def _editable(cell: dict) -> bool:
    return cell["cell_type"] == "markdown" and not set(cell["metadata"].get("tags", [])) & set(GENERATED)


def first_uses(nb: dict) -> dict[str, tuple[int, int]]:
    """{term: (the cell where it first shows, the Markdown cell that must link it)} for each glossary term the
    notebook shows: that cell itself if it is Markdown, else the nearest editable Markdown cell above it."""
    found = {}
    for i, cell in enumerate(nb["cells"]):
        text = _shown(cell)
        for t in TERMS:
            if t.term not in found and re.search(t.pattern, text, flags=re.I):
                intro = next((j for j in range(i, -1, -1) if _editable(nb["cells"][j])), None)
                if intro is not None:
                    found[t.term] = (i, intro)
    return found


def _links_here(source: str, name: str) -> bool:
    return f"]({link(name)}" in source  # with or without its title


def missing_links(nb: dict) -> list[str]:
    """The terms whose introducing Markdown cell does not link them, as 'cell N: term'."""
    return [f"cell {intro}: {name}" for name, (_, intro) in first_uses(nb).items()
            if not _links_here("".join(nb["cells"][intro]["source"]), name)]


def _link_first_mention(source: str, t: Term) -> str | None:
    """The source with the first prose mention of the term made a link, or None when there is none (only
    in code spans, links, headings or placeholders)."""
    skip = [m.span() for m in re.finditer(r"`[^`]*`|\[[^\]]*\]\([^)]*\)|<!--.*?-->|^#.*$", source, flags=re.M)]
    for m in re.finditer(t.pattern, source, flags=re.I):
        # not a mention a figure follows ("compute capability 8.0"): the truth test reads the two together
        if not any(a <= m.start() < b for a, b in skip) and not re.match(r"\s*(?:is |of )?\d", source[m.end():]):
            # the short definition as the link's title: a hover over the term shows it
            return f'{source[:m.start()]}[{m.group(0)}]({link(t.term)} "{t.short}"){source[m.end():]}'
    return None


def with_links(nb: dict) -> dict:
    """The notebook with every missing first-use link added (idempotent)."""
    cells = [dict(c) for c in nb["cells"]]
    by_anchor = {t.anchor: t.term for t in TERMS}
    for i, cell in enumerate(cells):  # links to an older address or tag (REPOSITORY, RELEASE_TAG) move to today's
        if _editable(cell):
            source = "".join(cell["source"])
            moved = re.sub(r"\]\(https://[^)\s]*/GLOSSARY\.md#([\w-]+)(?=[) ])",
                           lambda m: f"]({link(by_anchor[m.group(1)])}" if m.group(1) in by_anchor else m.group(0),
                           source)
            if moved != source:
                cells[i] = {**cell, "source": moved.splitlines(keepends=True)}
    additions: dict[int, list[Term]] = {}
    for name, (first, intro) in first_uses({**nb, "cells": cells}).items():
        source = "".join(cells[intro]["source"])
        if _links_here(source, name):
            continue
        t = term(name)
        linked = _link_first_mention(source, t) if first == intro else None
        if linked is not None:
            cells[intro] = {**cells[intro], "source": linked.splitlines(keepends=True)}
        else:
            additions.setdefault(intro, []).append(t)
    for intro, terms in additions.items():
        source = "".join(cells[intro]["source"])
        items = "; ".join(f"[{t.term}]({link(t.term)}): {t.short}" for t in terms)
        if TERMS_LINE in source:  # one Terms line per cell: add to it
            source = source.rstrip("\n").rstrip(".") + f"; {items}."
        else:
            source = source.rstrip("\n") + f"\n\n{TERMS_LINE}{items}."
        cells[intro] = {**cells[intro], "source": source.splitlines(keepends=True)}
    return {**nb, "cells": cells}


def write() -> bool:
    text = render()
    if GUIDE.exists() and GUIDE.read_text(encoding="utf-8") == text:
        return False
    GUIDE.write_text(text, encoding="utf-8")
    return True


def main(argv: list[str]) -> int:
    """`--check`: 1 when GLOSSARY.md differs from the rendering; else rewrite it."""
    if "--check" in argv:
        stale = not GUIDE.exists() or GUIDE.read_text(encoding="utf-8") != render()
        print(f"{GUIDE.name}: " + ("stale, run python -m course_utils.chapter.glossary" if stale else "up to date"))
        return 1 if stale else 0
    print(f"{GUIDE.name}: " + ("rewritten" if write() else "already up to date"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
