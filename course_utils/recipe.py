"""Recipe: every knob the chapter teaches, in one frozen dataclass.

A notebook "adds one technique" with ``recipe.with_(gradient_checkpointing=True)``. A recipe has a
stable key, so a measurement of it can be stored and found again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

def base_recipe_for(model: str, device: str) -> Recipe:
    """base_recipe() as it is on a 'cpu' or a 'cuda' machine (the quizzes quote the CPU one anywhere)."""
    if device == "cpu":
        return Recipe(model=model, micro_batch=4, max_seq_length=256, steps=6, learning_rate=1e-3,
                      label="baseline (LoRA, fp32)")
    return Recipe(model=model, micro_batch=4, max_seq_length=512, steps=6, learning_rate=2e-4,
                  label="baseline (LoRA, fp32)")

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# Optimizers the chapter teaches, plus the usual alternatives; any name in transformers'
# OptimizerNames is accepted too (checked in validate()).
CHAPTER_OPTIMIZERS = ("adamw_torch", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit")
BNB_OPTIMIZERS_PREFIXES = ("paged_", "adamw_8bit", "adamw_bnb", "lion_", "ademamix", "rmsprop_bnb")
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")



class RecipeError(ValueError):
    """A recipe knob has a value that cannot work; the message says which and what to do."""


def _whole(v: Any) -> bool:
    """A whole number (True and False are not numbers here)."""
    return isinstance(v, int) and not isinstance(v, bool)


_MOST = "2**31 - 1"  # the largest count a field takes: a 32-bit int's, as the libraries' sizes and steps are


def _count(v: Any, least: int) -> bool:
    """A whole number from `least` to 2**31 - 1 (a larger one is a typo, and overflows the libraries' counters)."""
    return _whole(v) and least <= v < 2**31


def _real(v: Any) -> bool:
    """A finite int or float (no bool, nan or inf)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class FieldRule:
    """What one Recipe field accepts: a test of one value and the words that say what is allowed (the error
    reads '<field> must <allowed>, got <value>.'), the field's help as `course` shows it, and whether it came
    after reference results were shipped. FIELD_RULES holds one per field; validate() reads it."""

    ok: Any  # value -> bool
    allowed: str
    kind: str  # "bool", "whole", "number", "text", "choice", "names": what a flag or a form would read
    help: str = ""  # the `course` command's help for its flag ("" for model and label, which have no derived flag)
    later: bool = False  # added after results were shipped: at its default it is left out of a recipe's key


def _rule_bool(help: str, later: bool = False) -> FieldRule:
    return FieldRule(lambda v: isinstance(v, bool), "be true or false (True/False; not a string or a number)", "bool",
                     help, later)


# Every Recipe field's type, range or choices, help, whether it came later: Recipe.validate() checks them (TECHNIQUES below)
FIELD_RULES: dict[str, FieldRule] = {
    "model": FieldRule(lambda v: isinstance(v, str) and bool(v.strip()),
                       "name a model ('tiny', a preset such as 'llama-3.1-8b', a hub id or a local folder)", "text"),
    "load_in_4bit": _rule_bool("QLoRA: NF4 base weights through bitsandbytes"),
    "double_quant": _rule_bool("quantize the 4-bit scales too (about 0.37 bits/param saved)"),
    "lora_r": FieldRule(lambda v: v is None or _count(v, 1),
                        f"be a whole number from 1 to {_MOST} or None (full fine-tune)", "whole",
                        "LoRA rank, or 'none' for a full fine-tune"),
    "lora_alpha": FieldRule(lambda v: _real(v) and v > 0,
                            "be a finite number above 0 (the chapter uses 32: the update is scaled by alpha / r)",
                            "number", "LoRA scaling numerator (the update is scaled by alpha / r)"),
    "lora_dropout": FieldRule(lambda v: _real(v) and 0 <= v < 1,
                              "be at least 0 and below 1 (the chapter uses 0.05)", "number",
                              "dropout on the LoRA input, at least 0 and below 1"),
    "lora_targets": FieldRule(lambda v: isinstance(v, tuple) and all(isinstance(t, str) and t for t in v),
                              "be module names such as 'q_proj'", "names", "the modules LoRA adapts, comma-separated"),
    "precision": FieldRule(lambda v: isinstance(v, str) and v in PRECISIONS, f"be one of {PRECISIONS}", "choice",
                           "auto picks bf16 / fp16 / fp32 from the hardware"),
    "gradient_checkpointing": _rule_bool("keep only each layer's input and recompute the rest in the backward"),
    "micro_batch": FieldRule(lambda v: _count(v, 1), f"be a whole number from 1 to {_MOST}", "whole",
                             "sequences per forward and backward (per_device_train_batch_size)"),
    "grad_accum": FieldRule(lambda v: _count(v, 1), f"be a whole number from 1 to {_MOST}", "whole",
                            "micro-batches per optimizer step (gradient_accumulation_steps)"),
    "optimizer": FieldRule(lambda v: isinstance(v, str) and bool(v),
                           "be an optimizer name such as 'adamw_torch' (any name in transformers' OptimizerNames)",
                           "text", "adamw_torch, adamw_8bit, paged_adamw_8bit, ... (any name in transformers' "
                           "OptimizerNames)"),
    "max_seq_length": FieldRule(lambda v: _count(v, 1), f"be a whole number from 1 to {_MOST}", "whole",
                                "max sequence length (sequences are packed to exactly this many tokens)"),
    "steps": FieldRule(lambda v: _count(v, 1), f"be a whole number from 1 to {_MOST}", "whole",
                       "optimizer steps per recipe: warm-up, 1 tracked for memory, the rest timed"),
    "warmup_steps": FieldRule(lambda v: _count(v, 0), f"be a whole number from 0 to {_MOST}", "whole",
                              "steps before the tracked one, left out of tokens/s and of the peak"),
    "learning_rate": FieldRule(lambda v: _real(v) and v > 0,
                               "be a positive, finite number (the chapter uses 2e-4)", "number",
                               "learning rate (the chapter's is 2e-4)"),
    "seed": FieldRule(lambda v: _whole(v) and 0 <= v < 2**32,
                      "be a whole number from 0 to 2**32 - 1 (numpy's range)", "whole",
                      "random seed of the data order and the LoRA initialization, 0 to 2**32 - 1"),
    "prepare_kbit": _rule_bool("peft's prepare_model_for_kbit_training on 4-bit models (the fp32 upcast)"),
    "offload_embeddings": _rule_bool("keep the input embedding table in CPU memory and look tokens up there", True),
    "liger_kernels": _rule_bool("Liger's Triton kernels for RMSNorm, SwiGLU and RoPE (CUDA only)", later=True),
    "torch_compile": _rule_bool("compile the model with torch.compile", later=True),
    "offload_activations": _rule_bool("trl's activation offloading: saved activations in CPU memory (CUDA only)", True),
    "tf32": _rule_bool("fp32 matmuls on TF32 tensor cores (Ampere, compute capability 8.0, and later)", later=True),
    "lean_host": _rule_bool("no host-GPU waits inside a micro-batch: metrics read once per log, no NaN gate", True),
    "fused_lora": _rule_bool("each 4-bit linear with its LoRA adapter as one autograd function (QLoRA)", True),
    "reentrant_checkpointing": _rule_bool("checkpointing's first forward builds no graph (use_reentrant)", True),
    "compile_layers": _rule_bool("torch.compile each decoder layer's forward, inside its checkpoint", True),
    "label": FieldRule(lambda v: isinstance(v, str), "be text (a display name)", "text"),
}


def check_field(name: str, value: Any) -> None:
    """RecipeError naming the field, its value and what FIELD_RULES allows, unless the value is allowed."""
    rule = FIELD_RULES[name]
    try:
        good = bool(rule.ok(value))
    except Exception:  # a value whose comparison itself fails (an object of another kind)
        good = False
    if not good:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise RecipeError(f"{name} must {rule.allowed}, got {shown}.")


@dataclass(frozen=True)
class Recipe:
    """One training configuration. Every field is a technique or a size the chapter talks about."""

    model: str = "tiny"  # "tiny" (embedded, offline), a preset such as "llama-3.1-8b", or a hub id/path
    load_in_4bit: bool = False  # QLoRA: NF4 base weights through bitsandbytes
    double_quant: bool = True  # quantize the 4-bit scales too (about 0.37 bits/param saved)
    lora_r: int | None = 16  # None means full fine-tuning
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_targets: tuple[str, ...] = DEFAULT_TARGETS
    precision: str = "fp32"  # "auto" picks bf16 / fp16 / fp32 from the hardware
    gradient_checkpointing: bool = False
    micro_batch: int = 4  # per_device_train_batch_size
    grad_accum: int = 1  # gradient_accumulation_steps
    optimizer: str = "adamw_torch"
    max_seq_length: int = 256
    steps: int = 8  # optimizer steps
    warmup_steps: int = 2  # steps excluded from tokens/s and from the peak (first-step allocations)
    learning_rate: float = 2e-4
    seed: int = 0
    prepare_kbit: bool = True  # call peft's prepare_model_for_kbit_training on 4-bit models
    # --- beyond the source chapter (notebook 09) ---
    offload_embeddings: bool = False  # keep the input embedding table in CPU memory and look tokens up there
    liger_kernels: bool = False  # Liger's Triton kernels for RMSNorm, SwiGLU and RoPE (CUDA only)
    torch_compile: bool = False  # compile the model with torch.compile (the Trainer's torch_compile)
    offload_activations: bool = False  # trl's activation offloading: saved activations wait in CPU memory (CUDA only)
    tf32: bool = False  # fp32 matmuls on TF32 tensor cores (10-bit mantissa): Ampere (8.0) and later only
    lean_host: bool = False  # no host-GPU waits inside a micro-batch: metrics read once per log (lean_trainer.py)
    fused_lora: bool = False  # each 4-bit linear with its LoRA adapter as one autograd function (fused_lora.py)
    reentrant_checkpointing: bool = False  # checkpointing's first forward without an autograd graph (use_reentrant)
    compile_layers: bool = False  # each decoder layer's forward compiled inside its checkpoint (compiled_layers.py)
    label: str = field(default="", compare=False)  # display name only; not part of the key

    def __post_init__(self) -> None:
        # lists from JSON or from a learner become tuples, so the recipe stays hashable
        if isinstance(self.lora_targets, str):  # tuple("q_proj") would be ('q', '_', 'p', ...)
            raise RecipeError(f"lora_targets must be a sequence of module names, e.g. ('q_proj', 'v_proj'), "
                              f"not the string {self.lora_targets!r}: write ({self.lora_targets!r},).")
        if not isinstance(self.lora_targets, tuple):
            object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        self.validate()

    # --- derived -------------------------------------------------------------------------------
    @property
    def effective_batch(self) -> int:
        """Sequences per optimizer step: micro-batch times accumulation steps."""
        return self.micro_batch * self.grad_accum

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step (sequences are packed to exactly max_seq_length)."""
        return self.effective_batch * self.max_seq_length

    @property
    def uses_lora(self) -> bool:
        """True for LoRA / QLoRA, False for full fine-tuning."""
        return self.lora_r is not None

    @property
    def uses_bitsandbytes(self) -> bool:
        """True when the recipe needs bitsandbytes (4-bit weights or an 8-bit/paged optimizer)."""
        return self.load_in_4bit or self.optimizer.startswith(BNB_OPTIMIZERS_PREFIXES)

    # --- identity ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of every field."""
        d = {f.name: getattr(self, f.name) for f in _FIELDS}  # every value is immutable: no deep copy needed
        d["lora_targets"] = list(self.lora_targets)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Recipe":
        """Inverse of to_dict; unknown keys are an error that names them."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise RecipeError(f"Unknown recipe field(s) {unknown}; valid fields are {sorted(names)}.")
        return cls(**d)

    @property
    def key(self) -> str:
        """Stable 12-hex-digit hash of every field that changes the measurement (not the label)."""
        d = self.to_dict()
        d.pop("label")
        for name, default in LATER_FIELDS.items():  # fields added later leave older keys unchanged
            if d[name] == default:
                d.pop(name)
        for name in ("learning_rate", "lora_dropout"):  # 1 and 1.0 are the same recipe
            d[name] = float(d[name])
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def with_(self, **changes: Any) -> "Recipe":
        """A copy with some knobs changed: how a notebook adds one technique."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise RecipeError(f"Unknown recipe field(s) {unknown}; valid fields are {sorted(names)}.")
        if "label" not in changes:
            changes["label"] = ""
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """One short line a learner can read: the techniques this recipe uses (TECHNIQUES, in order)."""
        return ", ".join(part for part in (t.part(self) for t in TECHNIQUES) if part)

    @property
    def name(self) -> str:
        """The label if one was given, else the description."""
        return self.label or self.describe()

    # --- validation ----------------------------------------------------------------------------
    def validate(self) -> None:
        """Reject values that cannot work, with a message that says what to do instead: each field against
        FIELD_RULES (type and range, before any process starts), then the rules between fields."""
        for f in _FIELDS:
            check_field(f.name, getattr(self, f.name))
        if self.steps < self.warmup_steps + 2:
            raise RecipeError(
                f"steps ({self.steps}) must be at least warmup_steps + 2 ({self.warmup_steps + 2}): after the "
                "warm-up, one step is tracked for memory and at least one is timed. Raise steps or lower warmup_steps."
            )
        if self.load_in_4bit and not self.uses_lora:
            raise RecipeError(
                "load_in_4bit=True needs LoRA (lora_r set): 4-bit weights cannot be trained directly. "
                "Set lora_r=16, or load_in_4bit=False for a full fine-tune."
            )
        if self.uses_lora and not self.lora_targets:
            raise RecipeError("lora_targets is empty; name the modules to adapt, e.g. ('q_proj', 'v_proj').")
        if self.reentrant_checkpointing and self.offload_activations and self.gradient_checkpointing:
            raise RecipeError("reentrant_checkpointing=True recomputes each layer inside the backward pass, where "
                              "offload_activations=True would move the recomputed activations to CPU memory and back. "
                              "Set one of them to False.")
        if self.compile_layers and (self.liger_kernels or self.torch_compile):
            raise RecipeError("compile_layers=True compiles each decoder layer, where " + (
                "Liger's RoPE (torch.compiler.disable'd) would break the graph: set liger_kernels=False (torch.compile "
                "fuses RMSNorm, SwiGLU and RoPE itself)." if self.liger_kernels else "torch_compile=True compiles the "
                "whole model: set one of them to False."))
        _check_optimizer(self.optimizer)


def known_optimizers() -> list[str]:
    """Every optimizer name the installed transformers accepts for `optim=`."""
    from transformers.training_args import OptimizerNames

    return [o.value for o in OptimizerNames]


def _check_optimizer(name: str) -> None:
    """Unknown optimizer names fail here, not halfway into a training run."""
    if name in CHAPTER_OPTIMIZERS:
        return
    try:
        valid = known_optimizers()
    except Exception:  # transformers missing: only the chapter's names are known
        valid = list(CHAPTER_OPTIMIZERS)
    if name not in valid:
        import difflib

        close = difflib.get_close_matches(name, valid, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise RecipeError(
            f"Unknown optimizer {name!r}.{hint} The chapter uses {', '.join(CHAPTER_OPTIMIZERS)}; "
            "any name in transformers' OptimizerNames works."
        )


@dataclass(frozen=True)
class Technique:
    """One row of TECHNIQUES: a technique the course teaches, or a setting describe() names (LoRA or full FT).
    The lists of knob names elsewhere are derived from these rows: the ladder (LADDER_STEPS), describe(), the
    `course` command's flags (cli_recipe), the steps of the path (show/path.py), the rung comparison
    (checks.ladder_here), the planner's knobs (estimate/plan.py), notebook 08's exercise knobs and
    library_map's toggles. Adding a technique: its Recipe field with its FIELD_RULES entry, one row here, and
    its build code (build.py), plus the estimator's terms when it changes the memory. A CUDA-only technique says
    so here (cuda_only, with the compute capability or package it needs), and checks.check_hardware refuses it where
    it cannot run."""

    fields: tuple[str, ...]  # the Recipe fields it sets; a change of any of them is one technique (a path step)
    short: str  # its short name: describe()'s words when it is on, the planner's name for it
    where: str = "ladder"  # "ladder": the chapter's; "beyond": notebook 08's; "setup": not a technique (LoRA/full)
    rungs: tuple = ()  # its rungs on the chapter's ladder: ((place, label, changes), ...); changes: a dict, or
    #                    a function of the rung above that returns one; the ladder sorts the rungs by place
    show: Any = None  # recipe -> describe()'s words for it ("" for none); default: `short` when it is on
    memory: str = ""  # "": the estimator models its memory (a `course estimate` flag); else why it does not
    planner: bool = False  # the planner may add it to a 4-bit bf16 recipe (estimate/plan.py's TUNINGS)
    instead: tuple = ()  # ((field, value), ...) what it takes the place of: the planner prices it against that
    needs: tuple = ()  # ((field, value), ...) it needs to mean anything: prepare_kbit acts on 4-bit recipes only
    cuda_only: str = ""  # "": it runs on any device; else what it does, which needs a CUDA GPU (checks.check_hardware
    #                      refuses it elsewhere with these words)
    min_cc: tuple = ()  # with cuda_only: the compute capability it needs, (8, 0) for Ampere
    package: str = ""  # with cuda_only: the package it needs ("liger_kernel"; pip's name has dashes)

    @property
    def default(self) -> Any:
        """Its first field's default: the technique off."""
        return _DEFAULTS[self.fields[0]]

    @property
    def on_value(self) -> Any:
        """The value that turns it on: the other one of a bool field's two."""
        return not self.default

    def on(self, r: "Recipe") -> bool:
        """True when `r` uses it: its first field is away from the default, and what it needs is there."""
        return getattr(r, self.fields[0]) != self.default and \
            all(getattr(r, name) == value for name, value in self.needs)

    def part(self, r: "Recipe") -> str:
        """describe()'s words for it on `r` ("" when it says nothing)."""
        return self.show(r) if self.show is not None else (self.short if self.on(r) else "")


def _half_sequence(r: Recipe) -> dict:
    """The shorter-sequences rung: half the rung above's length (16 at least)."""
    return {"max_seq_length": max(16, r.max_seq_length // 2)}


def _all_in_accumulation(r: Recipe) -> dict:
    """The accumulation rung: micro-batch 1, the same sequences per optimizer step as the rung above."""
    return {"micro_batch": 1, "grad_accum": r.micro_batch * r.grad_accum}


# In describe()'s order; the ladder's order is its rungs' places.
_SPEED = "the memory does not change"
TECHNIQUES: tuple[Technique, ...] = (
    Technique(("load_in_4bit", "double_quant"), "4-bit NF4", rungs=((6, "+ 4-bit QLoRA (NF4, double quant)",
                                                                       {"load_in_4bit": True}),),
              show=lambda r: ("4-bit NF4" + (" +DQ" if r.double_quant else "")) if r.load_in_4bit else ""),
    Technique(("lora_r",), "LoRA", "setup", show=lambda r: f"LoRA r={r.lora_r}" if r.uses_lora else "full FT"),
    Technique(("precision",), "mixed precision", rungs=((5, "+ mixed precision", {"precision": "auto"}),),
              show=lambda r: r.precision),
    Technique(("gradient_checkpointing",), "ckpt",
              rungs=((1, "+ gradient checkpointing", {"gradient_checkpointing": True}),)),
    Technique(("micro_batch", "grad_accum"), "accumulation",
              rungs=((2, "+ accumulation (micro-batch 1)", _all_in_accumulation),),
              show=lambda r: f"{r.micro_batch}x{r.grad_accum}"),
    Technique(("optimizer",), "optimizer", rungs=((3, "+ 8-bit AdamW", {"optimizer": "adamw_8bit"}),
                                                  (4, "+ paged 8-bit AdamW", {"optimizer": "paged_adamw_8bit"})),
              show=lambda r: r.optimizer),
    Technique(("max_seq_length",), "seq", rungs=((7, "+ shorter sequences", _half_sequence),),
              show=lambda r: f"seq {r.max_seq_length}"),
    Technique(("prepare_kbit",), "no fp32 upcast", "beyond", planner=True, needs=(("load_in_4bit", True),)),
    Technique(("offload_embeddings",), "embeddings on CPU", "beyond", planner=True),
    Technique(("liger_kernels",), "Liger", "beyond", planner=True, package="liger_kernel",
              cuda_only="runs Liger's Triton kernels for RMSNorm, SwiGLU and RoPE"),
    Technique(("torch_compile",), "compiled", "beyond",
              memory="a speed knob the estimator does not model: its answer would not change"),
    Technique(("offload_activations",), "activations on CPU", "beyond",
              cuda_only="moves saved activations from the GPU to CPU memory and back"),
    Technique(("tf32",), "TF32", "beyond", memory=f"a speed knob (matmul precision): {_SPEED}", min_cc=(8, 0),
              cuda_only="runs fp32 matmuls on TF32 tensor cores (Ampere: A100, RTX 30xx, L4, and later)"),
    Technique(("lean_host",), "lean host", "beyond", memory=f"a speed knob (host-GPU waits): {_SPEED}"),
    Technique(("fused_lora",), "fused LoRA", "beyond", planner=True, needs=(("load_in_4bit", True),)),
    Technique(("reentrant_checkpointing",), "reentrant ckpt", "beyond", planner=True,
              needs=(("gradient_checkpointing", True),)),
    Technique(("compile_layers",), "compiled layers", "beyond", planner=True, instead=(("liger_kernels", True),),
              needs=(("gradient_checkpointing", True),),
              memory="the estimate is the eager layers': compiled, they keep no more for backward (CSE off)"),
)
BASELINE = "baseline (LoRA, fp32)"  # the ladder's first rung, the base recipe itself
_RUNGS = sorted((rung for t in TECHNIQUES for rung in t.rungs), key=lambda rung: rung[0])
LADDER_FIELDS = tuple(name for t in TECHNIQUES if t.rungs for name in t.fields)  # what the rungs may set


def ladder(base: Recipe | None = None) -> list[Recipe]:
    """The chapter's recipes in order, each adding one technique to the rung before it."""
    base = base or Recipe()
    return list(_ladder(repr(base), base))


@functools.lru_cache(maxsize=64)
def _ladder(_key: str, recipe: Recipe) -> tuple[Recipe, ...]:
    """ladder()'s rungs, built once per base: facts.py asks for the same ladders for every figure it renders. A
    Recipe is frozen; `_key`, its repr, keeps bases that are == but not the same (1 and 1.0) apart."""
    rungs = [recipe.with_(label=BASELINE)]
    for _, label, changes in _RUNGS:
        rungs.append(rungs[-1].with_(**(changes(rungs[-1]) if callable(changes) else changes), label=label))
    return tuple(rungs)


def gpu_recipe(model: str, four_bit: bool) -> Recipe:
    """Notebook 11's per-GPU recipe on GPUs (QLoRA for Llama-3.1-8B; its "In your own script" cell shows it)."""
    return Recipe(model=model, load_in_4bit=four_bit, prepare_kbit=False, precision="auto",
                  gradient_checkpointing=True, micro_batch=4, max_seq_length=512, steps=6, label="per-GPU recipe")


def source_chapter_recipe(model: str = "llama-3.1-8b") -> Recipe:
    """The source chapter's complete script as a Recipe (its settings, our current APIs)."""
    return Recipe(model=model, load_in_4bit=True, double_quant=True, lora_r=16, lora_alpha=32, lora_dropout=0.05,
                  lora_targets=DEFAULT_TARGETS, precision="bf16", gradient_checkpointing=True, micro_batch=1,
                  grad_accum=16, optimizer="paged_adamw_8bit", max_seq_length=512, learning_rate=2e-4,
                  label="source chapter recipe")


_FIELDS = dataclasses.fields(Recipe)
assert set(FIELD_RULES) == {f.name for f in _FIELDS}, "every Recipe field needs its rule in FIELD_RULES"
_DEFAULTS = {f.name: f.default for f in _FIELDS}
# Derived from FIELD_RULES: the flags' help, and the fields added after reference results were shipped (at their
# defaults they are left out of a recipe's key, so the keys and stored measurements of older recipes stay valid).
FIELD_HELP = {name: rule.help for name, rule in FIELD_RULES.items() if rule.help}
LATER_FIELDS = {name: _DEFAULTS[name] for name, rule in FIELD_RULES.items() if rule.later}
# Derived from TECHNIQUES: the chapter's ladder on any model, (label, changes) per rung, as on Recipe()'s sizes.
LADDER_STEPS: tuple[tuple[str, dict[str, Any]], ...] = tuple(
    (r.label, {k: v for k, v in r.to_dict().items() if k != "label" and v != above.to_dict()[k]})
    for above, r in zip((Recipe(),) + tuple(ladder()), ladder()))
RUNG_NAMES = tuple(label for label, _ in LADDER_STEPS)  # how a notebook names a rung: run_ladder(base, through=...)


class RungError(KeyError):
    """A rung asked for by a name the ladder does not have, or one not measured here; the message says which."""

    def __str__(self) -> str:
        return str(self.args[0])


def rungs_through(name: str | None) -> int | None:
    """How many rungs the ladder has up to the one named `name` (None: all of them)."""
    if name is None:
        return None
    if name not in RUNG_NAMES:
        raise RungError(f"No rung of the ladder is named {name!r}; the rungs are {', '.join(map(repr, RUNG_NAMES))}.")
    return RUNG_NAMES.index(name) + 1


# Two recipes train the same when only these differ: knobs that do not move the peak (the estimator's setup).
NOT_MEMORY_FIELDS = ("steps", "warmup_steps", "learning_rate", "seed", "label")


def same_setup(a: Recipe, b: Recipe, ignore: tuple[str, ...] = ()) -> bool:
    """True when two recipes train the same model the same way (steps, learning rate, seed, label aside), the
    fields in `ignore` aside too."""
    return all(getattr(a, k) == getattr(b, k) for k in _SETUP_FIELDS if k not in ignore)


_SETUP_FIELDS = tuple(f.name for f in dataclasses.fields(Recipe) if f.name not in NOT_MEMORY_FIELDS)
