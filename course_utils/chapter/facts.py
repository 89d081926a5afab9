"""Numbers by construction: every figure a quiz or a notebook's prose states comes from its source.

A text writes a figure as `{{ name }}` or `{{ name :format }}` (`{{ ref_qlora_16x1_allocated_gib :.2f }}`), `name`
a figure of course_utils/chapter/figures.yaml (arithmetic over names allowed): one expression there over these names:

  ref(label, model="llama-3.1-8b")  a shipped H200 reference run (course_utils/reference/), by its label
  est(recipe, hardware="cpu")       the course's estimator: an Estimate (.peak_bytes, .by_category, ...)
  rung(label, model="tiny")         a recipe of the chapter's ladder, built on notebook 07's base for a CPU
  chapter(model="llama-3.1-8b")     the source chapter's recipe (QLoRA 1x16, checkpointing, paged 8-bit AdamW)
  t4(notebook, label, variant="small")  a run of the shipped T4 check (course_utils/reference/t4/)
  beyond(label, run="")             a shipped run of notebook 09's recipes (course_utils/reference/beyond/)
  shapes(model), nf4_bits(dq)       a model's shapes; bits per weight of NF4 (with double quant)
  peer(batch, name="unsloth")       a peer stack's runs (reference/beyond/peers/, measured; else peers.json)
  planner(model, budget, hardware)  course_utils.estimate.planner.plan(...): its rows, its pick (with .speed)
  accuracy()                        the estimate against every GPU reference run (scripts/gpu/estimator_accuracy.py)
  curves(run="", label=None)        how notebook 09's loss curves agree with the source recipe's
  toward(label, run="", peak=None)  that run (or, in run "peer-run", the peer's) against its limit and floor (limits.py)
  matmul(device="NVIDIA H200")      the GPU's shipped measured bf16 matmul rate (limits.measured_peak: .tflops, .size)
  tried(variant, run=None)          a shipped try of issue 16 against its baseline (course_utils/chapter/toward_the_limit.py)
  profiled(label)                   where that recipe's step time went under torch.profiler (tries.profiled)
  host(variant, run=None)           a variant of a shipped count run at 1 x 16 (host_work.host_counts: operators, waits, ms)
  flops(recipe), floor(recipe)      FLOPs per token and memory floor of a recipe (course_utils.limits)
  lib                               constants read from the installed libraries and the course's profiles
  MiB, GiB                          units; mib(x) and gib(x) divide by them

Anything else in a text that reads as a figure must be a definition (a dtype, a model or GPU name, a
recipe's shape, a library version, a count up to 16), a quote of the source chapter that
`course_utils/data/source_chapter.txt` holds, or arithmetic the text shows (`4 + 4 + 8 = 16`), which is
checked. `unsourced(text)` lists what is left; `python -m pytest -m truth` runs it over every quiz bank
and every notebook's markdown.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from types import SimpleNamespace

from course_utils.estimate import terms as E
from course_utils.chapter import figures, shipped_runs as beyond, toward_the_limit
from course_utils.chapter.figures import PLACEHOLDER, FactError, _shown
from course_utils.chapter.shipped_runs import offline_examples, own_check, tf32_run as tf32
from course_utils.chapter.t4 import run_of as t4
from course_utils.chapter.host_work import host_counts
from course_utils.chapter.toward_the_limit import profiled, toward, tried
from course_utils.common import GiB, MiB, shipped
from course_utils.estimate import limits, plan as P
from course_utils.estimate.distributed import anchor_recipe, estimate_distributed
from course_utils.estimate.peak import estimate
from course_utils.estimate.shapes import model_shapes
from course_utils.estimate.terms import nf4_bits_per_param
from course_utils.estimate.limits import flops_per_token, memory_floor
from course_utils.estimate.plan import margin_calibration, tuning_factor
from course_utils.estimate.planner import plan
from course_utils.machine import H100_SXM_PEAK_FLOPS, H200_PEAK_FLOPS, PROFILES, T4_PEAK_FLOPS
from course_utils.recipe import Recipe, base_recipe_for, ladder, source_chapter_recipe
from course_utils.results import all_reference_results, reference_results

# --- the sources ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _references() -> dict:

    return {(m.recipe.get("model"), m.label): m for m in reference_results()}


def ref(label: str, model: str = "llama-3.1-8b"):
    """The shipped reference Measurement of `model` with this label."""
    found = _references().get((model, label))
    if found is None:
        labels = sorted(lab for mod, lab in _references() if mod == model)
        raise FactError(f"no reference run of {model} labelled {label!r}; there are: {labels}")
    return found


@functools.lru_cache(maxsize=None)
def est(recipe, hardware: str = "cpu"):
    """The estimate of a Recipe on 'cpu', 'gpu' (bf16) or 't4' (cached: a bank asks for the same ones often)."""

    return estimate(recipe, hardware=hardware)


def rung(label: str, model: str = "tiny"):
    """The ladder's recipe with this label, on the base the notebooks use for `model` on a CPU."""

    base = base_recipe_for(model, "cpu")
    for r in ladder(base):
        if r.name == label:
            return r
    raise FactError(f"no ladder rung labelled {label!r}; there are: {[r.name for r in ladder(base)]}")


def beyond_run(label: str, run: str = "", model: str = "llama-3.1-8b"):
    """A shipped run of scripts/gpu/beyond_recipe.py (run "": the side-by-side run, "explore", "plan-check"), by label."""

    found = beyond.by_label(beyond.reference(model, run))
    if label not in found:
        raise FactError(f"no {run or 'side-by-side'} run of notebook 09 labelled {label!r}; there are: {sorted(found)}")
    return found[label]


def chapter(model: str = "llama-3.1-8b"):
    """The source chapter's recipe."""

    return source_chapter_recipe(model)


@functools.lru_cache(maxsize=None)
def _lib() -> SimpleNamespace:
    """Constants the texts state, from the one place each is defined (tests/test_truth.py checks the estimator's
    copies against the installed libraries' source)."""

    return SimpleNamespace(
        h200_bf16_tflops=H200_PEAK_FLOPS["bf16"] / 1e12, h100_bf16_tflops=H100_SXM_PEAK_FLOPS["bf16"] / 1e12,
        bnb_state_block=E.BNB_8BIT_BLOCK, bnb_min_8bit_size=E.BNB_MIN_8BIT_SIZE, bnb_page_min=E.BNB_PAGE_MIN,
        nf4_block=E.NF4_BLOCK, nf4_scale_block=E.NF4_SCALE_BLOCK, loss_vocab_tile=E.LOSS_VOCAB_TILE,
        loss_token_tile=E.LOSS_TOKEN_TILE, t4_gib=PROFILES["t4"].card_bytes / GiB,
        t4_fp16_tflops=T4_PEAK_FLOPS["fp16"] / 1e12, t4_fp32_tflops=T4_PEAK_FLOPS["fp32"] / 1e12,
        margin_factor=P.MARGIN_FACTOR, margin_gib=P.MARGIN_GIB, cuda_context_gib=P.CUDA_CONTEXT_GIB)


def page_min() -> int:
    """bitsandbytes pages an optimizer state only for tensors of at least this many elements, read from its source
    (importing bitsandbytes takes seconds: the texts use estimate.BNB_PAGE_MIN, which tests/test_truth.py checks
    against this)."""
    import inspect

    from bitsandbytes.optim.optimizer import Optimizer8bit

    found = re.search(r"numel\(\)\s*<\s*([0-9.e]+)", inspect.getsource(Optimizer8bit.get_state_buffer))
    if not found:
        raise FactError("bitsandbytes' get_state_buffer no longer says which tensors it pages; update facts.page_min")
    return int(float(found.group(1)))


def shapes(model: str):
    """A model's shapes (layers, hidden, vocab, ...), as the estimator reads them from its config."""

    return model_shapes(model)


@functools.lru_cache(maxsize=None)
def _targets() -> SimpleNamespace:
    """Notebook 09's targets (course_utils.beyond)."""

    return SimpleNamespace(lean_max_ratio=beyond.LEAN_MAX_RATIO, lean_max_gib=beyond.LEAN_MAX_GIB,
                           fast_max_gib=beyond.FAST_MAX_GIB, fast_min_speedup=beyond.FAST_MIN_SPEEDUP,
                           peer_max_ratio=toward_the_limit.PEER_MAX_MEMORY_RATIO, peer_min_speedup=toward_the_limit.PEER_MIN_SPEEDUP,
                           stretch_fraction=toward_the_limit.STRETCH_LIMIT_FRACTION, stretch_gib=toward_the_limit.STRETCH_MAX_GIB)


def nf4_bits(double_quant: bool = True) -> float:
    """Bits per weight of an NF4 layer of Llama-3.1-8B's size: 4 + its scales (estimate.nf4_bits_per_param)."""

    return nf4_bits_per_param(double_quant)


def peer(batch: str, name: str = "unsloth") -> SimpleNamespace:
    """A peer stack's run at this batching ("1x16", "16x1"), from toward_the_limit.peers(): .peak_allocated_gib,
    .tokens_per_s, .version, ..."""
    from course_utils.chapter.toward_the_limit import peers

    p = peers()[name]
    for run in p["runs"]:
        if run["batch"] == batch:
            return SimpleNamespace(version=p["version"], **run)
    raise FactError(f"{name} has no run at {batch!r}; there are: {[r['batch'] for r in p['runs']]}")


@functools.lru_cache(maxsize=None)
def planner(model: str = "llama-3.1-8b", budget: str | None = None, hardware: str = "gpu"):
    """The budget planner's Plan (course_utils.estimate.planner.plan): .rows (every candidate), .pick (.speed.tokens_per_s)."""

    return plan(model, budget, hardware=hardware)


def factor(recipe, knob: str) -> float:
    """The planner's measured factor for notebook 09's change `knob` on `recipe` (plan.tuning_factor)."""

    refs = [m for m in all_reference_results() if m.fits and m.tokens_per_s]
    return tuning_factor(recipe, refs, knobs=(knob,))[0]


@dataclass(frozen=True)
class _Run:
    model: str
    label: str
    chapter: bool  # a run of course_utils/reference/ (the chapter's techniques), not of reference/beyond/
    measured: object
    estimated: object

    @property
    def error(self) -> float:
        """The estimate's peak against the tracked peak, in percent."""
        return 100 * (self.estimated.peak_bytes - self.measured.peak_bytes) / self.measured.peak_bytes


class Accuracy:
    """The estimate for a bf16 GPU against every shipped GPU reference run (what scripts/gpu/estimator_accuracy.py
    prints), and the planner's margin against what CUDA reserved in each (plan.margin_calibration)."""

    def __init__(self):

        key = lambda m: (m.recipe["model"], m.label, m.date)  # noqa: E731
        chapter = {key(m) for m in reference_results()}
        self.runs = [_Run(m.recipe["model"], m.label, key(m) in chapter, m, estimate(m.recipe_obj, hardware="gpu"))
                     for m in all_reference_results()]
        checks = margin_calibration()
        self.margin_runs, self.margin_covered = len(checks), sum(c.covered for c in checks)

    def _select(self, chapter=None, but=()):
        return [r for r in self.runs if (chapter is None or r.chapter == chapter) and r.label not in but]

    def count(self, chapter=None, within=None, but=()) -> int:
        """How many runs (of the chapter's, chapter=True; of notebook 09's, False) miss by at most `within` %."""
        return sum(within is None or abs(r.error) <= within for r in self._select(chapter, but))

    def largest(self, chapter=None, but=()) -> float:
        """The largest miss at the peak, in percent (absolute), leaving out the runs labelled in `but`."""
        return max(abs(r.error) for r in self._select(chapter, but))

    def run(self, label: str, model: str = "llama-3.1-8b") -> _Run:
        found = [r for r in self.runs if r.label == label and r.model == model]
        if len(found) != 1:
            raise FactError(f"{len(found)} GPU reference runs of {model} labelled {label!r}")
        return found[0]

    def error(self, label: str, model: str = "llama-3.1-8b") -> float:
        """The estimate's miss at the peak of this run, in percent (signed)."""
        return self.run(label, model).error

    def miss(self, label: str, category: str, model: str = "llama-3.1-8b") -> int:
        """Bytes of `category` the run measured beyond the estimate (negative: the estimate is over)."""
        r = self.run(label, model)
        return r.measured.peak_by_category.get(category, 0) - r.estimated.by_category.get(category, 0)


@functools.lru_cache(maxsize=None)
def accuracy() -> Accuracy:
    return Accuracy()


def curves(run: str = "", model: str = "llama-3.1-8b", label: str | None = None) -> SimpleNamespace:
    """Notebook 09's loss curves against the source recipe's in one shipped run: .max_gap (the largest gap of
    any recipe's per-step loss from the source's; in run "peer-run" the peer's runs count too), .fall (how far the
    source's loss fell), .steps; with `label`,
    that recipe's (in run "peer-run" the peer's too) with .apart_from, the first step more than
    beyond.LOSSES_APART from the source's (None: none)."""

    ms = toward_the_limit.shipped_runs(model, run)
    src = next((m for m in ms if m.label.startswith("source")), None)
    if src is None:
        runs = ", ".join(map(repr, ("", "explore", "plan-check", "peer-run", *beyond.CHECKS)))
        raise FactError(f"no shipped {run or 'side-by-side'} run of {model} with a source recipe to compare losses "
                        f"against (runs: {runs})")
    if label is not None:
        found = beyond.by_label(ms)
        if label not in found:
            raise FactError(f"no {run or 'side-by-side'} run labelled {label!r}; there are: {sorted(found)}")
        a = beyond.loss_agreement(src, found[label])
        return SimpleNamespace(max_gap=a["max_gap"], fall=a["fall_a"], steps=a["steps"], apart_from=a["apart_from"])
    agree = [beyond.loss_agreement(src, m) for m in ms if m is not src and len(m.losses) > 2]
    return SimpleNamespace(max_gap=max(a["max_gap"] for a in agree), fall=agree[0]["fall_a"],
                           steps=min(a["steps"] for a in agree))


def host(variant: str, run: str | None = None, model: str = "llama-3.1-8b"):
    """One variant of a shipped count run (scripts/gpu/count_launches.py), the latest where run is None."""
    return host_counts(run, model)[variant]


def namespace() -> dict:
    """The names a placeholder may use."""

    return dict(ref=ref, est=est, rung=rung, chapter=chapter, t4=t4, lib=_lib(), shapes=shapes, targets=_targets(),
                Recipe=Recipe, nf4_bits=nf4_bits, beyond=beyond_run, tf32=tf32, offline_examples=offline_examples,
                peer=peer, planner=planner, factor=factor, accuracy=accuracy, curves=curves, toward=toward, flops=flops_per_token,
                matmul=limits.measured_peak, tried=tried, profiled=profiled, host=host,
                floor=memory_floor, own_check=own_check, MiB=MiB, GiB=GiB, dist=estimate_distributed, anchor=anchor_recipe,
                mib=lambda x: x / MiB, gib=lambda x: x / GiB, round=round, min=min, max=max, abs=abs, len=len, sum=sum)


# --- rendering ------------------------------------------------------------------------------------
def render_value(expression: str):
    """One placeholder's value from the sources themselves (figures.render_value with namespace())."""
    return figures.render_value(expression, namespace)


def render(text: str) -> str:
    """Every placeholder in `text` replaced by its value, from the sources."""
    return figures.render(text, namespace)


def render_tree(data):
    """figures.render_tree from the sources."""
    return figures.render_tree(data, namespace)


def main(argv: list[str] | None = None) -> int:
    """`python -m course_utils.chapter.facts --write`: every named figure rendered from its source into
    course_utils/reference/facts.json; `--check`: say what is stale there, change nothing (exit 1 if anything)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--check", action="store_true", help="list what is stale, write nothing")
    ap.add_argument("--write", action="store_true", help="write course_utils/reference/facts.json")
    args = ap.parse_args(argv)
    values = {name: render_value(name) for name in sorted(figures.registry())}
    if args.write:
        figures.VALUES.write_text(figures.values_file(values), encoding="utf-8")
    problems = [] if args.write else figures.stale(values)
    print("\n".join(problems + [f"{len(values)} named figures, {len(problems)} stale in {figures.VALUES.name}"]))
    return 1 if problems else 0


# --- what needs no source -------------------------------------------------------------------------
_UNIT = r"(?:\s*(?:%|x\b|×|GiB|MiB|KiB|GB|MB|KB|B\b|bytes?\b|tokens/s|s\b|min\b|TFLOP|GFLOP))"
DEFINITIONS = [
    r"`[^`]*`",  # code: API names and arguments
    r"\b\d+-bits?\b", r"\b\d+\s?bits\b(?= (?:per|each|wide|index|values?))", r"\b(?:fp|bf|int|uint|nf|NF|FP|BF|INT)\d+\b",
    r"\bLlama-\d(?:\.\d)?(?:-\d+[Bb])?", r"\bSmolLM2-\d+M\b", r"\b\d+B\b",  # model names and sizes
    r"\bT4 is \d\.\d", r"\b[Cc]ompute capability (?:is |of )?\d\.\d\+?", r"\b\d\.\d(?= or (?:more|later|newer))",
    r"\b(?:T4|H100|H200|A100|A10G?|L4|V100|RTX ?\d+\w*|sm_\d+)\b",  # GPUs and their capabilities
    r"\b(?:1|2|4|8|16|32)\s*[x×]\s*(?:1|2|4|8|16|32)(?:\s*[x×]\s*(?:64|128|256|512|1,?024|2,?048))?\b(?!\s*[x×])",
    r"\b(?:[Nn]otebooks?|[Cc]ells?|[Qq]uiz|[Ss]tep|[Ii]ssue) \d+(?:(?:, | and | or |-)\d+)*\b", r"^#+ \d\d\b",
    r"\b\d\d_[a-z_0-9]+", r"\b\d{4}-\d\d-\d\d\b",
    r"\b(?:trl|transformers|peft|bitsandbytes|torch|PyTorch|ipywidgets|[Pp]ython|nbval|[Jj]upyter[Ll]ab|CUDA|datasets|"
    r"accelerate|Unsloth|Liger|numpy) \d+(?:\.\d+)*(?:\.x)?\b", r"\b\d+\.x\b",
    r"\bLlama-3's\b", r"\b[Ss]ection \d+", r"\bv\d+(?:\.\d+)+\b", r"\bHTTP \d+|\b40[13]\b",
    r"\b[1248] ?(?:bytes?|B)\b",  # an element's size in a dtype
    r"\b(?:micro-batch(?:es)?|sequences?(?: length)?|seq|rank|r|alpha|lora_alpha|max_length|effective batch(?: of)?)"
    r"(?: of)?[ =]\d[\d,]*\b",  # a recipe's knobs
    r"\b\d+ (?:optimizer |timed |warm-up |training )?steps?\b", r"\b\d+-step\b",
    r"\b(?:64|128|256|512|1,?024|2,?048) tokens\b",
    r"\b(?:1|2|4|8|16|32)\s*[x×]\s*(?:64|128|256|512|1,?024|2,?048)\b", r"\b\d+k\b",
    r"\b\d+ ?G(?:i)?B (?:cards?|GPUs?)\b", r"\ban? \d+ ?G(?:i)?B\b(?= (?:card|GPU))",
]
_DEFINITION = re.compile("|".join(f"(?:{d})" for d in DEFINITIONS), re.M)
_SMALL_COUNT = re.compile(rf"(?<![\w.,])(?:[0-9]|1[0-6])(?![\w.,]|{_UNIT})")
_NUMBER = re.compile(r"(?<![\w.])~?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")
_ARITH = re.compile(r"(\d[\d,]*(?:\.\d+)?)((?:\s*(?:[+x×*/−-])\s*\d[\d,]*(?:\.\d+)?)+)\s*=\s*(\d[\d,]*(?:\.\d+)?)")


@functools.lru_cache(maxsize=None)
def source_chapter() -> str:
    """The source chapter's text, as shipped (course_utils/data/source_chapter.txt)."""
    return shipped("data", "source_chapter.txt").read_text(encoding="utf-8")


def _quotes(text: str) -> list[tuple[int, int]]:
    """Spans of double-quoted passages that the source chapter holds, word for word."""
    chapter = " ".join(source_chapter().split())
    spans = []
    for m in re.finditer(r'"([^"\n]{3,200})"|“([^”]{3,200})”', text):
        quoted = " ".join((m.group(1) or m.group(2)).split())
        if quoted in chapter:
            spans.append(m.span())
    return spans


def _arithmetic_ok(terms: str, result: str) -> bool:
    expr = terms.replace(",", "").replace("×", "*").replace("x", "*").replace("−", "-")
    try:
        value = eval(expr, {"__builtins__": {}}, {})  # noqa: S307 (digits and operators only)
    except Exception:
        return False
    shown = float(result.replace(",", ""))
    decimals = len(result.split(".")[1]) if "." in result else 0
    return abs(value - shown) <= 0.5 * 10**-decimals + 1e-9 * abs(shown)


@dataclass(frozen=True)
class Unsourced:
    """A figure in a text with no source: the number and its context."""

    number: str
    context: str

    def __str__(self) -> str:
        return f"{self.number!r} in ...{self.context}..."


PINNED = re.compile(r"(~?\d[\d,]*(?:\.\d+)?)<!--\{\{(.+?)\}\}-->", re.S)


def pinned(text: str) -> list[tuple[str, str, str]]:
    """Figures written out in a text that cannot render (a notebook's markdown, the README) with their source in
    a comment right after them, `8.2<!--{{ expr :.1f }}-->`: (as written, as the source gives it, expression)."""
    out = []
    for m in PINNED.finditer(text):
        out.append((m.group(1), _shown(render_value(m.group(2))), m.group(2).strip()))
    return out


def refresh(text: str) -> tuple[str, list[tuple[str, str, str]]]:
    """`text` with every pinned figure rewritten as its source gives it now, and the (was, now, expression) of each
    one that changed: after a new reference run, `write_notebooks.py figures`, then read the prose around them."""
    changed = []

    def one(m: re.Match) -> str:
        now = _shown(render_value(m.group(2)))
        if now != m.group(1):
            changed.append((m.group(1), now, m.group(2).strip()))
        return f"{now}<!--{{{{{m.group(2)}}}}}-->"

    return PINNED.sub(one, text), changed


def unsourced(text: str) -> list[Unsourced]:
    """The figures in `text` that no placeholder, definition, chapter quote or shown arithmetic accounts for.
    A pinned figure (see pinned()) whose source now gives another value is reported as stale."""
    stale = [Unsourced(written, f"stale: {{{{ {expr} }}}} now gives {now}")
             for written, now, expr in pinned(text) if written != now]
    text = text.replace("**", "").replace("\\*", "*")
    # a pinned figure stays as written and a placeholder becomes its value, both marked as sourced, so that
    # arithmetic written around them is checked with the real numbers
    sourced, parts, at = [], [], 0
    for m in re.finditer(f"{PINNED.pattern}|{PLACEHOLDER.pattern}", text, re.S):
        parts.append(text[at:m.start()])
        start = sum(len(x) for x in parts)
        figure = m.group(1) if m.group(1) is not None else render(m.group(0))
        parts.append(figure)
        sourced.append((start, start + len(figure)))
        at = m.end()
    body = "".join(parts) + text[at:]
    blank = lambda s, spans: "".join(" " if any(a <= i < b for a, b in spans) else ch for i, ch in enumerate(s))
    body = blank(body, _quotes(body))
    wrong = []
    for m in _ARITH.finditer(body):
        if not _arithmetic_ok(m.group(1) + m.group(2), m.group(3)):
            wrong.append(Unsourced(m.group(0), f"arithmetic that does not hold: {m.group(0)}"))
    body = blank(body, [m.span() for m in _ARITH.finditer(body)] + sourced)
    body = _DEFINITION.sub(lambda m: " " * len(m.group(0)), body)
    body = _SMALL_COUNT.sub(" ", body)
    found = [Unsourced(m.group(0), " ".join(body[max(0, m.start() - 40):m.end() + 25].split()))
             for m in _NUMBER.finditer(body)]
    return stale + wrong + found


if __name__ == "__main__":
    raise SystemExit(main())
