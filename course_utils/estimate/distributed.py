"""Per-GPU memory of one recipe on N GPUs: DDP (every rank holds the whole model) or FSDP full shard (parameters,
gradients and optimizer state divided among the ranks), built from the single-GPU estimate's own terms.

    e = estimate_distributed(recipe, gpus=2, strategy="fsdp")
    print(e.explain())          # every term with its arithmetic, e.g. "4-bit weights 32.8 GiB / 2 GPUs = 16.4 GiB"

On one GPU there is no wrapper to model: `gpus=1` returns the single-GPU estimate itself, term for term, whatever
the strategy (FSDP on one rank switches itself to NO_SHARD). `recipe.micro_batch` is per rank (the Trainer's
per_device_train_batch_size), so a rank's activations and temporaries are the single-GPU ones; the global batch is
micro_batch x grad_accum x gpus.

DDP (torch.nn.parallel.DistributedDataParallel as the Trainer and accelerate build it): every rank holds what one
GPU holds, plus the gradient buckets. DDP allocates its buckets when it wraps the model (`bucket_cap_mb=25` MiB
each, the first one 1 MiB) for the parameters that need a gradient: with LoRA only the adapters. With
`gradient_as_bucket_view=False` (torch's default, and accelerate's) the buckets are a copy of every trainable
gradient, alive from then on; with True the gradients are views into them and the copy goes (torch's docs: the
saving equals the total gradients' size).

FSDP (full shard; FSDP1 with use_orig_params=False as in peft's FSDP-QLoRA config; the units: one decoder layer,
peft's policy wrapping each trainable LoRA module apart, the root holding embed_tokens, the final norm, lm_head):
- at rest each rank holds 1/N of every parameter, gradient and optimizer state (the padding of a flat parameter
  to a multiple of N, fewer than N elements per unit, is left out);
- 4-bit weights: with `bnb_4bit_quant_storage` equal to the model's dtype the packed 4-bit data is a float tensor
  FSDP can flatten and shard. Their quantization state (absmax scales, code books) is not a parameter:
  bitsandbytes keeps it on the module, whole, on every rank;
- trl skips prepare_model_for_kbit_training for sharded QLoRA and peft keeps the adapters in the model's dtype, so
  every weight is in the storage dtype: bf16 under bf16 (the estimate takes prepare_kbit=False), fp32 under fp16
  (peft's advice for fp16 autocast; the estimate takes prepare_kbit=True, whose dtypes are those);
- buffers FSDP adds: the all-gathered (unsharded) parameters of the units in use, in the storage dtype: the root's
  from the forward to the end of the backward (FSDP does not reshard the root after its forward); one decoder
  layer with its LoRA modules during the loss's backward (prefetched), two in a layer's backward (its own and the
  next, BACKWARD_PRE prefetch; FSDP's rate limit allows two in flight); the reduce-scatter of the largest trainable
  unit's gradients (unsharded, plus the shard it writes);
- gradient accumulation: the Trainer runs every micro-batch but the last under no_sync, and FSDP then keeps the
  gradients unsharded, so from the second micro-batch on every trainable gradient is whole on every rank; only
  the optimizer step sees them sharded. (accelerate's sync_each_batch=True would shard them each micro-batch.)
- the optimizer state and AdamW's step scratch are per shard: 1/N (8-bit blocks and step counters of flat
  shards are not re-rounded).

Not modelled: CPU offload of parameters (FSDP's offload_params, which moves shards, gradients and the optimizer
step to CPU memory); NCCL's own buffers (allocated outside PyTorch's caching allocator, as the CUDA context is);
FSDP2's per-parameter sharding (the same sizes, other buffers); DeepSpeed; fragmentation of the allocator's reserve
(the planner's margin covers it on one GPU; multi-GPU runs have not been measured yet); embeddings offloaded to
the CPU (refused under FSDP).

Sources: torch DistributedDataParallel docs (bucket_cap_mb, gradient_as_bucket_view); torch FSDP docs
(FULL_SHARD, BackwardPrefetch, limit_all_gathers); peft's "Use PEFT QLoRA and FSDP" guide (fsdp_config_qlora.yaml,
bnb_4bit_quant_storage, 19.6 GB per GPU with CPU offload and 35.6 GB without for Llama-2-70B on two GPUs) and
bitsandbytes' FSDP-QLoRA guide; Answer.AI's FSDP-QLoRA posts (70B on 2 x 24 GB); trl's sharded-QLoRA check.

Part of `course_utils.estimate` (its docstring says how the single-GPU bytes are counted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from course_utils.common import GiB, MiB
from course_utils.estimate.activations import optimizer_step_temporaries
from course_utils.estimate.peak import Estimate, TermSum, candidate_moments, estimate, fmt_bytes
from course_utils.estimate.shapes import EstimateError, model_shapes, shapes_from_config
from course_utils.estimate.terms import (CATEGORIES, Setup, Term, attention_kernel, dtypes_for, gradient_terms,
                                         lora_params, optimizer_terms, parameter_terms, trainable_bytes_per_element,
                                         trainable_tensors)
from course_utils.machine import Hardware, get_hardware, resolve_precision
from course_utils.recipe import Recipe
from course_utils.show.tables import wrap

STRATEGIES = ("ddp", "fsdp")
DDP_BUCKET_CAP_MB = 25  # torch DistributedDataParallel(bucket_cap_mb=25): MiB per bucket
DDP_FIRST_BUCKET_MB = 1  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: the first bucket is 1 MiB
FSDP_PREFETCHED_UNITS = 2  # a layer's backward: its own unit and the next one (BACKWARD_PRE, limit_all_gathers)


@dataclass(frozen=True)
class ShardedTerm(Term):
    """A term divided among the ranks: nbytes = ceil(full_bytes / gpus)."""

    full_bytes: int = 0
    gpus: int = 1


def gib(n: float) -> str:
    """Bytes as GiB with two decimals (fmt_bytes' MiB or KiB below 0.01 GiB)."""
    return f"{n / GiB:,.2f} GiB" if n >= 0.01 * GiB else fmt_bytes(n)


def shard(t: Term, gpus: int, name: str | None = None) -> ShardedTerm:
    """`t` divided among `gpus` ranks, with the division written out."""
    return ShardedTerm(t.category, (name or t.name) + f", sharded over {gpus} GPUs", math.ceil(t.nbytes / gpus),
                       f"{gib(t.nbytes)} / {gpus} GPUs", full_bytes=t.nbytes, gpus=gpus)


@dataclass
class DistributedEstimate(TermSum):
    """Predicted peak memory of one GPU of N in one training step, term by term."""

    recipe: Recipe  # as the run uses it (FSDP-QLoRA: every weight in the storage dtype)
    strategy: str  # "ddp" or "fsdp" ("single" on one GPU)
    gpus: int
    single: Estimate  # the same recipe on one GPU
    moment: str
    terms: list[Term]
    moments: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def hardware(self) -> Hardware:
        return self.single.hardware

    @property
    def precision(self) -> str:
        return self.single.precision

    @property
    def cuda_extra(self) -> Term | None:
        """CUDA libraries' own memory, per rank (the single-GPU term: each rank has its own cuBLAS handles)."""
        return self.single.cuda_extra

    per_gpu_bytes = TermSum.peak_bytes  # the predicted peak of one GPU: the sum of every term
    per_gpu_gib = TermSum.peak_gib

    @property
    def sharded_terms(self) -> list[ShardedTerm]:
        return [t for t in self.terms if isinstance(t, ShardedTerm)]

    def lines(self) -> list[str]:
        """One line per term: 'name: arithmetic = bytes'."""
        return [f"{t.name}: {t.arithmetic} = {gib(t.nbytes)}" if t.arithmetic else f"{t.name}: {gib(t.nbytes)}"
                for t in self.terms]

    def explain(self) -> str:
        """The arithmetic per category, in lines of at most 100 characters."""
        r = self.recipe
        how = {"ddp": f"DDP on {self.gpus} GPUs", "fsdp": f"FSDP full shard on {self.gpus} GPUs"}.get(
            self.strategy, "one GPU")
        lines = [f"Per-GPU estimate for {r.model}: {r.with_(precision=self.precision).describe()}",
                 f"{how}, each {self.hardware.name}; each GPU trains micro-batches of {r.micro_batch} x "
                 f"{r.max_seq_length} tokens; global batch {r.effective_batch * self.gpus} sequences.",
                 f"The peak is {self.moment}.", ""]
        for cat in CATEGORIES:
            terms = [t for t in self.terms if t.category == cat]
            lines.append(f"{cat:<14}{gib(sum(t.nbytes for t in terms)):>30}")
            lines += ["    " + line for line, t in zip(self.lines(), self.terms) if t.category == cat]
            if not terms:
                lines.append("    none at this moment")
        lines.append(f"{'per GPU':<14}{gib(self.per_gpu_bytes):>30}")
        if self.cuda_extra:
            lines.append(f"+ {self.cuda_extra.name}: {gib(self.cuda_extra.nbytes)} per GPU; CUDA's allocated peak "
                         f"{gib(self.cuda_allocated_bytes)} per GPU")
        lines += [f"Note: {n}" for n in self.notes]
        return wrap("\n".join(lines))


def run_recipe(recipe: Recipe, strategy: str, hardware: str | Hardware = "gpu") -> Recipe:
    """The recipe as a run under `strategy` uses it: FSDP-QLoRA keeps every weight in the storage dtype (bf16 under
    bf16: no fp32 upcast; fp32 under fp16, whose dtypes are those of prepare_kbit=True)."""
    if strategy != "fsdp" or not recipe.load_in_4bit:
        return recipe
    precision = resolve_precision(recipe.precision, get_hardware(hardware))
    return recipe.with_(prepare_kbit=precision != "bf16", label=recipe.label)


def estimate_distributed(recipe: Recipe, gpus: int = 2, strategy: str = "fsdp", config=None, *,
                         hardware: str | Hardware = "gpu", padded: bool = False,
                         device_cc: tuple[int, int] | None = None, gradient_as_bucket_view: bool = False,
                         bucket_cap_mb: float = DDP_BUCKET_CAP_MB) -> DistributedEstimate:
    """Per-GPU peak memory of `recipe` on `gpus` GPUs under 'ddp' or 'fsdp' (see the module's docstring for what is
    modelled). gpus=1 is the single-GPU estimate, term for term."""
    if strategy not in STRATEGIES:
        raise EstimateError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}.")
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise EstimateError(f"gpus must be a whole number of at least 1, got {gpus!r}.")
    hw = get_hardware(hardware)
    if gpus == 1:
        e = estimate(recipe, config, hardware=hw, padded=padded, device_cc=device_cc)
        return DistributedEstimate(recipe, "single", 1, e, e.moment, list(e.terms), dict(e.moments), list(e.notes))
    if strategy == "fsdp" and recipe.offload_embeddings:
        raise EstimateError("offload_embeddings keeps the embedding table in CPU memory, which FSDP cannot shard; "
                            "use offload_embeddings=False with FSDP.")
    run = run_recipe(recipe, strategy, hw)
    single = estimate(run, config, hardware=hw, padded=padded, device_cc=device_cc)
    x = _setup(run, config, hw, padded)
    if strategy == "ddp":
        bucket = ddp_bucket_term(x, gradient_as_bucket_view, bucket_cap_mb)
        moments = {m: terms + [bucket] for m, terms in candidate_moments(x).items()}
        notes = ["DDP: every GPU holds the whole model, its gradients and optimizer state, plus the gradient "
                 "buckets; NCCL's buffers are outside PyTorch's allocator and this estimate."]
    else:
        static = fsdp_static_terms(x, gpus)
        moments = {m: fsdp_moment_terms(x, gpus, m, terms, static) for m, terms in candidate_moments(x).items()}
        notes = fsdp_notes(recipe, run, x, gpus)
    totals = {m: sum(t.nbytes for t in terms) for m, terms in moments.items()}
    moment = max(totals, key=totals.get)
    return DistributedEstimate(run, strategy, gpus, single, moment, [t for t in moments[moment] if t.nbytes],
                               totals, notes + list(single.notes))


def _setup(recipe: Recipe, config, hw: Hardware, padded: bool) -> Setup:
    """The same Setup `estimate` builds (estimate itself has checked the recipe and its positions)."""
    s = shapes_from_config(config) if config is not None else model_shapes(recipe.model)
    precision = resolve_precision(recipe.precision, hw)
    d = dtypes_for(recipe, precision, hw)
    return Setup(recipe, s, d, hw, precision, attention_kernel(hw, d, s, padded), padded)


# ---------------------------------------------------------------------------------------------
# DDP
# ---------------------------------------------------------------------------------------------
def ddp_bucket_term(x: Setup, as_view: bool = False, cap_mb: float = DDP_BUCKET_CAP_MB) -> Term:
    """DDP's gradient buckets: a copy of every trainable gradient (none with gradient_as_bucket_view=True)."""
    total = sum(t.nbytes for t in gradient_terms(x))
    first = DDP_FIRST_BUCKET_MB * MiB
    buckets = 1 + max(0, math.ceil((total - first) / (cap_mb * MiB)))
    what = "LoRA's" if x.recipe.uses_lora else "every weight's"
    if as_view:
        return Term("gradients", "DDP gradient buckets (gradient_as_bucket_view: the gradients are views into "
                    "them)", 0, f"{gib(total)} shared with the gradients")
    return Term("gradients", f"DDP gradient buckets: a copy of {what} gradients (gradient_as_bucket_view=False)",
                total, f"{gib(total)} in about {buckets} buckets ({DDP_FIRST_BUCKET_MB} MiB, then {cap_mb:g} MiB each)")


# ---------------------------------------------------------------------------------------------
# FSDP
# ---------------------------------------------------------------------------------------------
def _phase(moment: str) -> str:
    """'step', 'loss forward', 'loss backward' or 'backward' (a decoder layer's or the embedding's)."""
    if moment.startswith("in the optimizer step"):
        return "step"
    if "forward of the fused loss" in moment:
        return "loss forward"
    return "loss backward" if "backward of the fused loss" in moment else "backward"


def fsdp_static_terms(x: Setup, gpus: int) -> dict[Term, list[Term]]:
    """Each static single-GPU term (parameters, optimizer state, AdamW's step scratch) and what one rank holds of it."""
    s, d = x.shapes, x.dtypes
    params = parameter_terms(x)
    linears = params[:len(s.layer_linears)]
    assert all(t.name.startswith(n) for t, (n, _, _) in zip(linears, s.layer_linears)), "parameter_terms' order"
    total = sum(t.nbytes for t in linears)
    out: dict[Term, list[Term]] = {t: [] for t in linears}
    if x.recipe.load_in_4bit:
        packed = s.layers * sum(math.ceil(i * o / 2) for _, i, o in s.layer_linears)
        what = f"4-bit weights of the decoder layers (packed in {x.dtype(d.kept)} storage)"
        out[linears[0]] = [
            shard(Term("parameters", what, packed), gpus),
            Term("parameters", "4-bit quantization state (absmax scales, code books), not sharded", total - packed,
                 "whole on every GPU: bitsandbytes keeps it on the module, outside the parameter FSDP shards")]
    else:
        out[linears[0]] = [shard(Term("parameters", f"weights of the decoder layers ({x.dtype(d.weight)})", total),
                                 gpus)]
    for t in params[len(s.layer_linears):]:
        replicated = t.name.startswith("buffers") or not t.nbytes
        out[t] = [t] if replicated else [shard(t, gpus)]
    for t in optimizer_terms(x) + optimizer_step_temporaries(x):
        out[t] = [shard(t, gpus)] if t.nbytes else [t]
    return out


def fsdp_moment_terms(x: Setup, gpus: int, moment: str, terms: list[Term],
                      static: dict[Term, list[Term]] | None = None) -> list[Term]:
    """What one rank holds at `moment`: the single-GPU terms with the static ones sharded, the gradients sharded at
    the step (unsharded while accumulating), and the buffers FSDP adds."""
    static = fsdp_static_terms(x, gpus) if static is None else static
    grads = set(gradient_terms(x))
    phase = _phase(moment)
    out = []
    for t in terms:
        if t in static:
            out += static[t]
        elif t in grads and phase == "step":
            out.append(shard(t, gpus))
        elif t in grads:  # accumulating: the micro-batches before the last run under no_sync
            out.append(Term(t.category, t.name + ", unsharded while accumulating (no_sync)", t.nbytes,
                            t.arithmetic + " (every rank: the reduce-scatter waits for the last micro-batch)"))
        else:
            out.append(t)  # activations, temporaries, lm_head's unsharded gradient: per rank, as on one GPU
    if phase != "step":
        out.append(root_gather_term(x))
    units = {"loss forward": 0, "loss backward": 1, "backward": FSDP_PREFETCHED_UNITS}.get(phase, 0)
    if units:
        out.append(layer_gather_term(x, units))
    if phase == "backward":
        out.append(reduce_scatter_term(x, gpus))
    return out


def layer_unit_bytes(x: Setup) -> tuple[int, str]:
    """Bytes of one decoder layer's parameters, unsharded, with its LoRA modules (and how they add up)."""
    s, d = x.shapes, x.dtypes
    if x.recipe.load_in_4bit:
        base = sum(math.ceil(i * o / 2) for _, i, o in s.layer_linears)
        parts = [f"{gib(base)} of 4-bit weights"]
    else:
        base = sum(i * o for _, i, o in s.layer_linears) * d.weight
        parts = [f"{gib(base)} of {x.dtype(d.weight)} weights"]
    norms = (s.small_params - s.hidden) // s.layers * d.kept  # the layer's norms (the final norm is the root's)
    parts.append(f"{fmt_bytes(norms)} of norms")
    lora = lora_params(x) // s.layers * d.lora if x.recipe.uses_lora else 0
    if lora:
        parts.append(f"{fmt_bytes(lora)} of LoRA")
    return base + norms + lora, " + ".join(parts)


def layer_gather_term(x: Setup, units: int) -> Term:
    """The all-gathered parameters of `units` decoder layers (FSDP units), in the storage dtype."""
    unit, parts = layer_unit_bytes(x)
    why = "the last layer, prefetched for its backward" if units == 1 else "the layer in backward, the next prefetched"
    return Term("parameters", f"FSDP all-gather: {units} decoder layer{'s' if units > 1 else ''} unsharded ({why})",
                units * unit, f"{units} x ({parts})")


def root_gather_term(x: Setup) -> Term:
    """The root unit's parameters (embed_tokens, lm_head, final norm), gathered from the forward to the backward."""
    s, k = x.shapes, x.dtypes.kept
    n = s.embed_params + s.lm_head_params + s.hidden
    heads = "embed_tokens (tied to lm_head)" if s.tied else "embed_tokens, lm_head"
    return Term("parameters", f"FSDP root unit unsharded: {heads}, final norm (not resharded after the forward)",
                n * k, f"{n:,} x {k} B")


def reduce_scatter_term(x: Setup, gpus: int) -> Term:
    """The reduce-scatter of the largest trainable unit: its unsharded gradient and the shard it writes."""
    s, b = x.shapes, trainable_bytes_per_element(x)
    if x.recipe.uses_lora:  # peft's policy: each trainable LoRA module is a unit
        n = max(e for _, e, _ in trainable_tensors(x))
        what = "the largest LoRA module"
    else:
        layer = sum(i * o for _, i, o in s.layer_linears) + (s.small_params - s.hidden) // s.layers
        n = max(layer, s.embed_params + s.lm_head_params + s.hidden)
        what = "the largest unit (a decoder layer or the root)"
    g = n * b
    return Term("gradients", f"FSDP reduce-scatter of {what}: its unsharded gradient + its shard",
                g + math.ceil(g / gpus), f"{n:,} x {b} B x (1 + 1/{gpus})")


def fsdp_notes(asked: Recipe, run: Recipe, x: Setup, gpus: int) -> list[str]:
    """What the FSDP estimate assumes."""
    notes = [f"FSDP full shard over {gpus} GPUs, one decoder layer per unit (peft's FSDP-QLoRA setup); CPU offload "
             "of parameters and NCCL's buffers are not modelled."]
    if run.prepare_kbit != asked.prepare_kbit:
        notes.append(f"FSDP-QLoRA keeps every weight in the storage dtype ({x.dtype(x.dtypes.kept)}): trl skips "
                     f"prepare_model_for_kbit_training for sharded QLoRA, so this estimates prepare_kbit="
                     f"{run.prepare_kbit}.")
    if run.grad_accum > 1:
        notes.append("gradient accumulation: the Trainer's no_sync keeps every trainable gradient unsharded until "
                     "the last micro-batch.")
    return notes


# ---------------------------------------------------------------------------------------------
# the published anchor (a plausibility check, not a measurement of ours)
# ---------------------------------------------------------------------------------------------
# peft's "Use PEFT QLoRA and FSDP" guide (examples/sft/run_peft_qlora_fsdp.sh, fsdp_config_qlora.yaml): Llama-2-70B
# on 2 GPUs, FSDP full shard, seq 2048 (packed), 2 x 2 micro-batches per GPU, gradient checkpointing, flash
# attention, LoRA r=8 alpha 16 dropout 0.1 on every linear, NF4 with nested quant, bf16 compute and storage, the
# Trainer's default AdamW. Reported: 19.6 GB per GPU with CPU offload of parameters, 35.6 GB per GPU without (how
# it was read, nvidia-smi or torch's counters, is not said; GB as written there).
ANCHOR_GB_PER_GPU = {"with CPU offload": 19.6, "without CPU offload": 35.6}
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LLAMA_2_70B = dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                   num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
                   tie_word_embeddings=False)


def anchor_recipe(model: str = "llama-3.1-70b") -> Recipe:
    """The anchor's settings as a Recipe (the model aside: the anchor trained Llama-2-70B)."""
    return Recipe(model=model, load_in_4bit=True, double_quant=True, lora_r=8, lora_alpha=16, lora_dropout=0.1,
                  lora_targets=ALL_LINEAR, precision="bf16", gradient_checkpointing=True, micro_batch=2,
                  grad_accum=2, optimizer="adamw_torch", max_seq_length=2048, prepare_kbit=False,
                  label="peft's FSDP-QLoRA example")


def llama_2_70b_config():
    """Llama-2-70B's published shape as a transformers config (no weights, no download)."""
    from transformers import LlamaConfig

    return LlamaConfig(**LLAMA_2_70B)


def anchor_check() -> list[tuple[str, DistributedEstimate]]:
    """The anchor's recipe on 2 GPUs under FSDP: on Llama-2-70B (the anchor's model) and on the Llama-3.1-70B preset."""
    return [("Llama-2-70B (the anchor's model)",
             estimate_distributed(anchor_recipe("meta-llama/Llama-2-70b-hf"), 2, "fsdp", llama_2_70b_config())),
            ("Llama-3.1-70B (preset)", estimate_distributed(anchor_recipe(), 2, "fsdp"))]


def anchor_lines() -> list[str]:
    """The estimate beside the published figure, labelled as what it is."""
    gb = ANCHOR_GB_PER_GPU["without CPU offload"]
    lines = ["Plausibility check against a published figure (peft's FSDP-QLoRA guide, Llama-2-70B on 2 GPUs): "
             f"{gb} GB per GPU without CPU offload ({ANCHOR_GB_PER_GPU['with CPU offload']} GB with it, which this "
             "estimator does not model)."]
    for name, e in anchor_check():
        lines.append(f"{name}: estimated {e.per_gpu_bytes / 1e9:.1f} GB per GPU ({e.per_gpu_gib:.2f} GiB; with "
                     f"CUDA's own {e.cuda_allocated_bytes / 1e9:.1f} GB), {e.per_gpu_bytes / 1e9 - gb:+.1f} GB from "
                     f"the published {gb} GB.")
    return lines
