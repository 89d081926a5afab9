"""Estimate peak training memory from a model's config and a Recipe: no weights, no GPU.

The estimate uses the categories `measure` reports (parameters, gradients, optimizer state,
activations, temporaries) at the moment `measure` reports them: the largest total of one
steady-state training step. Every term is arithmetic you can read with `Estimate.explain()`.

How the bytes are counted (each rule was checked against the tensor-level tracker, to the byte on
the tiny model, and against the H200 reference runs in `course_utils/reference/`):

- parameters: shapes from the model built on the meta device. NF4 stores 4 bits per weight plus
  one scale per block of 64 (fp32: 4.5 bits/param; with double quant an 8-bit scale plus one fp32
  per 256 scales: 4.127 bits/param). Embeddings, lm_head and norms stay unquantized, and
  `prepare_model_for_kbit_training` upcasts them to fp32.
- gradients: one per trainable parameter, in its dtype. With accumulation the peak is in a later
  micro-batch, when every gradient already exists; with one micro-batch it comes before any do.
- optimizer: AdamW keeps two states in the parameter's dtype; bitsandbytes' 8-bit AdamW keeps two
  bytes per parameter plus one fp32 scale per 256, but 32-bit state for tensors under 4,096
  elements and (the Trainer's choice) for embeddings.
- activations: what autograd saves per layer (norm inputs in fp32, what the attention kernel keeps,
  LoRA's dropout masks and inputs, the MLP's gate/up/silu outputs), or only each layer's input
  under gradient checkpointing, plus what the loss keeps.
- temporaries: what else is alive at the peak moment, which is the largest of four: the forward
  or the backward of trl's chunked loss (a [4096-token x 32,768-column] tile, fp32 gradient
  buffers, bf16 copies of an fp32 lm_head; in the forward the tracker files these as
  activations), the backward of the last layer (recomputed under checkpointing, plus the MLP's
  gradients), or the optimizer step (torch's AdamW makes one full copy of its second moment).

Assumed: full micro-batches (no padding; `padded=True` models one), Llama-style decoder layers,
scaled_dot_product_attention. `measured_step_has_padding` tells whether a stored measurement met
a padded micro-batch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from .recipe import Recipe, RecipeError

MiB = 1024**2
GiB = 1024**3
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "temporaries")

# Library constants the arithmetic depends on (trl 1.16, bitsandbytes 0.50).
LOSS_TOKEN_TILE = 4096  # trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE
LOSS_VOCAB_TILE = 32768  # trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE
NF4_BLOCK = 64  # weights per NF4 scale (absmax)
NF4_SCALE_BLOCK = 256  # scales per fp32 second-level scale under double quant
NF4_CODE_BYTES = 16 * 4  # each quantized tensor keeps its 16-value NF4 code book
DQ_CODE_BYTES = 256 * 4 + 4  # ... and, with double quant, a 256-value code book and an offset
BNB_8BIT_BLOCK = 256  # elements per fp32 scale of 8-bit optimizer state
BNB_MIN_8BIT_SIZE = 4096  # smaller tensors keep 32-bit optimizer state
BNB_QMAP_BYTES = 2 * 256 * 4  # the two shared 8-bit quantization maps
BNB_PAGE_MIN = 100_000  # paged optimizers page the state of tensors with at least this many elements

ATTENTION_INPUTS = ("q_proj", "k_proj", "v_proj")  # linears fed by the layer's first norm


class EstimateError(ValueError):
    """The estimator cannot model this model or recipe; the message says why."""


# ---------------------------------------------------------------------------------------------
# where it runs
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hardware:
    """What the estimate assumes about the device: its kind, 'auto' precision and attention kernel."""

    name: str
    device: str  # "cuda" or "cpu"
    auto_precision: str  # what precision="auto" becomes there
    flash_attention: bool  # FlashAttention-2 kernels (compute capability 8.0+)
    memory_gib: float | None = None  # usable memory, when the hardware fixes it
    short: str = ""  # a few words for table headers
    compute_capability: tuple[int, int] | None = None  # whose CUDA libraries' workspaces the estimate counts


HARDWARE = {
    "gpu": Hardware("CUDA GPU with bf16 (compute capability 8.0+: A100, L4, RTX 30/40, H100, H200)",
                    "cuda", "bf16", True, short="a bf16 GPU", compute_capability=(9, 0)),  # the reference H200's
    "t4": Hardware("NVIDIA T4 (Colab free tier): fp16, no FlashAttention-2", "cuda", "fp16", False, 14.7,
                   short="a T4 (fp16)", compute_capability=(7, 5)),
    "cpu": Hardware("CPU", "cpu", "fp32", False, short="a CPU"),
}


def get_hardware(hardware: str | Hardware) -> Hardware:
    """A Hardware from its name in HARDWARE (or itself)."""
    if isinstance(hardware, Hardware):
        return hardware
    try:
        return HARDWARE[hardware.lower()]
    except KeyError:
        raise EstimateError(f"Unknown hardware {hardware!r}; use one of {', '.join(HARDWARE)}.") from None


# ---------------------------------------------------------------------------------------------
# the result
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Term:
    """One line of the arithmetic: bytes of one thing in one category."""

    category: str
    name: str
    nbytes: int
    arithmetic: str = ""


@dataclass
class Estimate:
    """Predicted peak memory of one training step, term by term."""

    recipe: Recipe
    hardware: Hardware
    precision: str  # the resolved precision
    moment: str  # when the peak happens
    terms: list[Term]  # everything alive at that moment
    moments: dict[str, int] = field(default_factory=dict)  # every candidate moment's total
    notes: list[str] = field(default_factory=list)
    cuda_extra: Term | None = None  # what CUDA allocates outside these tensors (None off CUDA)

    @property
    def cuda_allocated_bytes(self) -> int:
        """What torch.cuda.max_memory_allocated should read: the peak plus CUDA's own allocations."""
        return self.peak_bytes + (self.cuda_extra.nbytes if self.cuda_extra else 0)

    @property
    def by_category(self) -> dict[str, int]:
        """Bytes per category at the peak (the same keys as Measurement.peak_by_category)."""
        out = dict.fromkeys(CATEGORIES, 0)
        for t in self.terms:
            out[t.category] += t.nbytes
        return out

    @property
    def peak_bytes(self) -> int:
        """The predicted peak: the sum of every term."""
        return sum(t.nbytes for t in self.terms)

    @property
    def peak_gib(self) -> float:
        """The predicted peak in GiB."""
        return self.peak_bytes / GiB

    def explain(self) -> str:
        """The arithmetic, term by term, grouped by category."""
        lines = [f"Estimate for {self.recipe.model}: {self.recipe.with_(precision=self.precision).describe()}",
                 f"on {self.hardware.name}; {self.recipe.micro_batch * self.recipe.max_seq_length} tokens "
                 "per micro-batch.",
                 f"The peak is {self.moment}.", ""]
        for cat in CATEGORIES:
            terms = [t for t in self.terms if t.category == cat]
            lines.append(f"{cat:<14}{fmt_bytes(sum(t.nbytes for t in terms)):>40}")
            for t in terms:
                lines.append(f"    {t.name}: {t.arithmetic} = {fmt_bytes(t.nbytes)}" if t.arithmetic
                             else f"    {t.name}: {fmt_bytes(t.nbytes)}")
            if not terms:
                lines.append("    none at this moment")
        lines.append(f"{'peak':<14}{fmt_bytes(self.peak_bytes):>40}  ({self.peak_gib:.2f} GiB)")
        if self.cuda_extra:
            lines.append(f"+ {self.cuda_extra.name}: {self.cuda_extra.arithmetic} = {fmt_bytes(self.cuda_extra.nbytes)}; "
                         f"CUDA's allocated peak {fmt_bytes(self.cuda_allocated_bytes)}")
        others = [f"{name} {fmt_bytes(b)}" for name, b in self.moments.items() if name != self.moment]
        if others:
            lines.append("Other candidate moments: " + "; ".join(others) + ".")
        lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(lines)


def fmt_bytes(n: float) -> str:
    """Bytes as MiB with thousands separators (B or KiB below 0.1 MiB, GiB from 100 GiB)."""
    if n >= 100 * GiB:
        return f"{n / GiB:,.1f} GiB"
    if n >= 0.1 * MiB:
        return f"{n / MiB:,.1f} MiB"
    return f"{n / 1024:,.1f} KiB" if n >= 1024 else f"{n:.0f} B"


# ---------------------------------------------------------------------------------------------
# the model's shapes, from its config on the meta device
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shapes:
    """The sizes the arithmetic needs, read from a config and a meta-device model."""

    model_type: str
    layers: int
    hidden: int
    heads: int
    head_dim: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool  # lm_head shares the embedding matrix
    layer_linears: tuple[tuple[str, int, int], ...]  # (name, in_features, out_features) of one layer
    embed_params: int
    lm_head_params: int  # 0 when tied
    small_tensors: tuple[tuple[str, int, int], ...]  # (kind, elements, count): norms and the like
    buffer_bytes: int  # rotary inv_freq and the like (fp32)

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def linear_params(self) -> int:
        """Elements of every linear layer inside the decoder layers (what 4-bit quantizes)."""
        return self.layers * sum(i * o for _, i, o in self.layer_linears)

    @property
    def small_params(self) -> int:
        """Elements of the norms and other small weights."""
        return sum(n * c for _, n, c in self.small_tensors)

    @property
    def total_params(self) -> int:
        return self.linear_params + self.embed_params + self.lm_head_params + self.small_params


def load_config(model: str):
    """The transformers config of a recipe's model: tiny, a preset, a local folder or a cached hub id."""
    from .models import PRESETS, TINY, ModelUnavailableError, is_preset, preset_config

    if is_preset(model):
        return preset_config(model)
    from transformers import AutoConfig

    if model == TINY:
        from .models import tiny_model_path

        return AutoConfig.from_pretrained(tiny_model_path())
    try:
        return AutoConfig.from_pretrained(model)
    except OSError as exc:
        raise ModelUnavailableError(
            f"Cannot read the config of {model!r} here: it is not a local folder holding a config.json, not in "
            "the local hub cache, and the hub cannot be reached (offline, or HF_HUB_OFFLINE is set). "
            f"Use model='tiny' or a preset with a real shape ({', '.join(PRESETS)}), or download the model's "
            "config.json and pass its folder."
        ) from exc


def shapes_from_config(config) -> Shapes:
    """Build the model on the meta device (no memory, no weights) and read every shape."""
    import collections

    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    layers = _decoder_layers(model)
    linears = tuple((name.rsplit(".", 1)[-1], m.in_features, m.out_features)
                    for name, m in layers[0].named_modules() if isinstance(m, torch.nn.Linear))
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed
    big = {id(p) for layer in layers for m in layer.modules() if isinstance(m, torch.nn.Linear)
           for p in m.parameters(recurse=False)} | {id(embed)} | ({id(head.weight)} if head is not None else set())
    small = collections.Counter(("norm" if "norm" in name.lower() else "other", p.numel())
                                for name, p in model.named_parameters() if id(p) not in big)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    return Shapes(
        model_type=text.model_type,
        layers=len(layers),
        hidden=text.hidden_size,
        heads=heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        intermediate=getattr(text, "intermediate_size", None) or 4 * text.hidden_size,
        vocab=embed.shape[0],
        tied=tied,
        layer_linears=linears,
        embed_params=embed.numel(),
        lm_head_params=0 if tied or head is None else head.weight.numel(),
        small_tensors=tuple((kind, n, c) for (kind, n), c in sorted(small.items())),
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
    )


def _decoder_layers(model) -> list:
    """The repeated decoder layers (the longest ModuleList in the model)."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise EstimateError(f"{type(model).__name__} has no list of decoder layers the estimator can read.")
    return list(max(lists, key=len))


@functools.lru_cache(maxsize=32)
def model_shapes(model: str) -> Shapes:
    """Shapes of a recipe's model (cached: the meta-device build happens once per model)."""
    return shapes_from_config(load_config(model))


# ---------------------------------------------------------------------------------------------
# dtypes: which tensor ends up in which precision
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dtypes:
    """Bytes per element of each kind of tensor, for one recipe on one device."""

    weight: int  # base weights that are not quantized (and their gradients in a full fine-tune)
    kept: int  # embeddings, lm_head and norms (fp32 after prepare_model_for_kbit_training)
    lora: int  # LoRA A and B (and their gradients and AdamW states)
    compute: int  # matmul outputs under autocast: 2 for bf16/fp16, 4 for fp32
    residual: int  # the residual stream between layers (the embedding's dtype)
    mlp: int  # saved MLP activations (bitsandbytes returns the input's dtype: fp32 after the upcast)
    norm_out: int  # a norm's output (weight dtype times input dtype)
    mask: int  # a dropout mask element: bool on CUDA, the input's dtype on CPU


def dtype_name(nbytes: int, precision: str) -> str:
    """'bf16', 'fp16', 'fp32' or 'bool' for an element size under this precision."""
    return {1: "bool", 2: "fp16" if precision == "fp16" else "bf16", 4: "fp32"}[nbytes]


def resolve_precision(recipe: Recipe, hw: Hardware) -> str:
    """The precision the recipe would train in on this hardware (what build.check_hardware decides)."""
    if recipe.precision == "auto":
        return hw.auto_precision
    if recipe.precision == "bf16" and hw.auto_precision == "fp16":
        raise RecipeError(f"precision='bf16' cannot run on {hw.name}; use precision='auto' (fp16 there).")
    if recipe.precision == "fp16" and hw.device == "cpu":
        raise RecipeError("precision='fp16' needs a CUDA GPU; use precision='auto' or 'fp32' on CPU.")
    return recipe.precision


def dtypes_for(recipe: Recipe, precision: str, hw: Hardware) -> Dtypes:
    """Apply build.py's rules (and trl's, peft's, bitsandbytes') to find each tensor's dtype."""
    compute = 2 if precision in ("bf16", "fp16") else 4
    full_ft = not recipe.uses_lora
    weight = 4 if precision == "fp32" or (precision == "fp16" and full_ft) else 2  # build.torch_dtype
    kept = 4 if recipe.load_in_4bit and recipe.prepare_kbit else weight
    # peft makes LoRA weights fp32; trl casts them to bf16 on 4-bit models in bf16 (build keeps fp32 otherwise)
    lora = 2 if recipe.load_in_4bit and precision == "bf16" else 4
    norm_out = kept  # norm weight times the residual stream, both in the embedding's dtype
    mlp = norm_out if recipe.load_in_4bit else compute
    if hw.device == "cuda":
        mask = 1
    else:  # CPU dropout masks have the dtype of the dropout's input
        mask = norm_out if recipe.load_in_4bit else lora
    return Dtypes(weight=weight, kept=kept, lora=lora, compute=compute, residual=kept, mlp=mlp,
                  norm_out=norm_out, mask=mask)


def attention_kernel(hw: Hardware, d: Dtypes, s: Shapes, padded: bool) -> str:
    """Which scaled_dot_product_attention kernel runs: 'flash', 'efficient', 'math' or 'cpu'."""
    if hw.device == "cpu":
        return "cpu"
    if padded:
        return "efficient"  # a padding mask rules out flash; transformers repeats k/v for it
    if hw.flash_attention and d.compute == 2 and s.head_dim <= 256:
        return "flash"
    return "math" if s.kv_heads < s.heads else "efficient"  # the efficient kernel has no grouped-query mode


# ---------------------------------------------------------------------------------------------
# one estimate's setting
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    """Everything one estimate depends on: recipe, shapes, dtypes, hardware, attention kernel, padding."""

    recipe: Recipe
    shapes: Shapes
    dtypes: Dtypes
    hardware: Hardware
    precision: str
    kernel: str  # 'flash', 'efficient', 'math' or 'cpu'
    padded: bool

    @property
    def tokens(self) -> int:
        """Tokens in one micro-batch (T)."""
        return self.recipe.micro_batch * self.recipe.max_seq_length

    @property
    def scored(self) -> int:
        """Tokens the loss scores in one micro-batch (N): each row's last token has no label."""
        return self.recipe.micro_batch * (self.recipe.max_seq_length - 1)

    @property
    def full_ft(self) -> bool:
        return not self.recipe.uses_lora

    def dtype(self, nbytes: int) -> str:
        """The name of an element size under this recipe's precision."""
        return dtype_name(nbytes, self.precision)


# ---------------------------------------------------------------------------------------------
# parameters, gradients, optimizer state
# ---------------------------------------------------------------------------------------------
def nf4_bytes(numel: int, double_quant: bool) -> int:
    """Bytes of one NF4-quantized tensor: packed 4-bit weights, block scales, code books."""
    blocks = math.ceil(numel / NF4_BLOCK)
    packed = math.ceil(numel / 2)
    if double_quant:
        return packed + blocks + math.ceil(blocks / NF4_SCALE_BLOCK) * 4 + NF4_CODE_BYTES + DQ_CODE_BYTES
    return packed + blocks * 4 + NF4_CODE_BYTES


def nf4_bits_per_param(double_quant: bool, numel: int = 4096 * 4096) -> float:
    """Average bits per weight of NF4 on a tensor of `numel` elements (4.127 with double quant, 4.5 without)."""
    return nf4_bytes(numel, double_quant) * 8 / numel


def lora_shapes(recipe: Recipe, s: Shapes) -> list[tuple[str, int, int]]:
    """(name, in_features, out_features) of each LoRA-adapted linear in one layer."""
    found = [(n, i, o) for n, i, o in s.layer_linears if n in recipe.lora_targets]
    missing = set(recipe.lora_targets) - {n for n, _, _ in found}
    if missing:
        raise RecipeError(f"LoRA target module(s) {sorted(missing)} not found in {recipe.model}; its linear "
                          f"layers are {sorted({n for n, _, _ in s.layer_linears})}.")
    return found


def lora_params(x: Setup) -> int:
    """Trainable LoRA elements: r x (in + out) per adapted linear per layer."""
    return x.shapes.layers * sum(x.recipe.lora_r * (i + o) for _, i, o in lora_shapes(x.recipe, x.shapes))


def parameter_terms(x: Setup) -> list[Term]:
    """Weights by dtype and quantization, LoRA weights, buffers."""
    recipe, s, d = x.recipe, x.shapes, x.dtypes
    terms = []
    for name, i, o in s.layer_linears:
        if recipe.load_in_4bit:
            per_tensor = nf4_bytes(i * o, recipe.double_quant)
            kind = "NF4 + double quant" if recipe.double_quant else "NF4"
            terms.append(Term("parameters", f"{name} ({kind}, {per_tensor * 8 / (i * o):.3f} bits/param)",
                              s.layers * per_tensor, f"{s.layers} layers x {i} x {o} x {per_tensor / (i * o):.4f} B"))
        else:
            terms.append(Term("parameters", f"{name} ({x.dtype(d.weight)})", s.layers * i * o * d.weight,
                              f"{s.layers} layers x {i} x {o} x {d.weight} B"))
    upcast = recipe.load_in_4bit and d.kept == 4 and d.weight != 4
    kept = x.dtype(d.kept) + (", upcast by prepare_model_for_kbit_training" if upcast else "")
    if recipe.offload_embeddings and x.hardware.device == "cuda" and not s.tied:
        terms.append(Term("parameters", f"embed_tokens ({kept}): in CPU memory (offload_embeddings)", 0,
                          f"{s.vocab} x {s.hidden} x {d.kept} B off the GPU"))
    else:
        terms.append(Term("parameters", f"embed_tokens{', tied to lm_head' if s.tied else ''} ({kept})",
                          s.embed_params * d.kept, f"{s.vocab} x {s.hidden} x {d.kept} B"))
    if s.lm_head_params:
        terms.append(Term("parameters", f"lm_head ({kept})", s.lm_head_params * d.kept,
                          f"{s.vocab} x {s.hidden} x {d.kept} B"))
    terms.append(Term("parameters", f"norms and other small weights ({x.dtype(d.kept)})", s.small_params * d.kept,
                      f"{s.small_params:,} x {d.kept} B"))
    if recipe.uses_lora:
        n = lora_params(x)
        terms.append(Term("parameters", f"LoRA A and B ({x.dtype(d.lora)})", n * d.lora,
                          f"{_lora_arithmetic(x)} = {n:,} x {d.lora} B"))
    terms.append(Term("parameters", "buffers (rotary frequencies, fp32)", s.buffer_bytes, ""))
    return terms


def _lora_arithmetic(x: Setup) -> str:
    """'32 layers x 16 x (4096+4096 + 4096+1024 + ...)': LoRA's element count, spelled out."""
    inner = " + ".join(f"{i}+{o}" for _, i, o in lora_shapes(x.recipe, x.shapes))
    return f"{x.shapes.layers} layers x {x.recipe.lora_r} x ({inner})"


def trainable_tensors(x: Setup) -> list[tuple[str, int, int]]:
    """(name, elements per tensor, tensor count) of what the optimizer updates."""
    s = x.shapes
    if x.recipe.uses_lora:
        out = []
        for name, i, o in lora_shapes(x.recipe, s):
            out.append((f"{name}.lora_A", x.recipe.lora_r * i, s.layers))
            out.append((f"{name}.lora_B", o * x.recipe.lora_r, s.layers))
        return out
    out = [(name, i * o, s.layers) for name, i, o in s.layer_linears] + [("embed_tokens", s.embed_params, 1)]
    if s.lm_head_params:
        out.append(("lm_head", s.lm_head_params, 1))
    return out + list(s.small_tensors)


def trainable_bytes_per_element(x: Setup) -> int:
    """Bytes of one trainable element (and of its gradient and AdamW states)."""
    return x.dtypes.lora if x.recipe.uses_lora else x.dtypes.weight


def gradient_terms(x: Setup) -> list[Term]:
    """One gradient per trainable element, in the parameter's dtype."""
    n, b = sum(e * c for _, e, c in trainable_tensors(x)), trainable_bytes_per_element(x)
    what = "LoRA gradients" if x.recipe.uses_lora else "every weight's gradient"
    return [Term("gradients", f"{what} ({x.dtype(b)})", n * b, f"{n:,} x {b} B")]


TORCH_ADAMW = ("adamw_torch", "adamw_torch_fused", "adamw_hf")
BNB_32BIT = ("paged_adamw_32bit", "adamw_bnb_32bit", "paged_adamw", "paged_lion_32bit")


def optimizer_terms(x: Setup) -> list[Term]:
    """Optimizer state per optimizer: AdamW's two moments, or bitsandbytes' 8-bit blocks."""
    opt, tensors = x.recipe.optimizer, trainable_tensors(x)
    n = sum(e * c for _, e, c in tensors)
    if "8bit" in opt:
        return bnb_8bit_terms(x)
    if opt in BNB_32BIT:
        return [Term("optimizer", f"{opt}: two fp32 states", 2 * n * 4, f"2 x {n:,} x 4 B")]
    b = trainable_bytes_per_element(x)
    what = "exp_avg and exp_avg_sq" if opt in TORCH_ADAMW else "assumed Adam-like: two states"
    terms = [Term("optimizer", f"{opt}: {what} ({x.dtype(b)}, the parameters' dtype)", 2 * n * b, f"2 x {n:,} x {b} B")]
    if x.hardware.device == "cpu":  # torch keeps `step` as a tensor on the parameters' device unless it is CUDA
        count = sum(c for _, _, c in tensors)
        terms.append(Term("optimizer", "step counters", 4 * count, f"{count} tensors x 4 B"))
    return terms


def bnb_8bit_terms(x: Setup) -> list[Term]:
    """bitsandbytes 8-bit state: 2 B/param + fp32 scales; 32-bit for small tensors and embeddings. A paged
    optimizer on CUDA puts the states of tensors with BNB_PAGE_MIN elements or more in unified memory, outside
    PyTorch's allocator (and so outside what the estimate, the tracker and max_memory_allocated count)."""
    tensors = trainable_tensors(x)
    eight = [(n, e, c) for n, e, c in tensors if e >= BNB_MIN_8BIT_SIZE and n != "embed_tokens"]
    wide = [(n, e, c) for n, e, c in tensors if (n, e, c) not in eight]
    scales_of = eight  # the scales are never paged
    if x.recipe.optimizer.startswith("paged") and x.hardware.device == "cuda":
        paged = [(n, e, c) for n, e, c in tensors if e >= BNB_PAGE_MIN]
        eight = [t for t in eight if t not in paged]
        wide = [t for t in wide if t not in paged]
    n8 = sum(e * c for _, e, c in eight)
    scales = sum(math.ceil(e / BNB_8BIT_BLOCK) * c for _, e, c in scales_of)
    terms = [Term("optimizer", f"{x.recipe.optimizer}: two 8-bit states + an fp32 scale per {BNB_8BIT_BLOCK}",
                  2 * n8 + 2 * scales * 4 + (BNB_QMAP_BYTES if scales_of else 0),
                  f"2 x {n8:,} x 1 B + 2 x {scales:,} x 4 B + 2 KiB of maps")]
    n32 = sum(e * c for _, e, c in wide)
    if n32:
        why = []
        if any(e < BNB_MIN_8BIT_SIZE for _, e, _ in wide):
            why.append(f"tensors under {BNB_MIN_8BIT_SIZE} elements")
        if any(n == "embed_tokens" for n, _, _ in wide):
            why.append("the embeddings (the Trainer keeps them 32-bit)")
        terms.append(Term("optimizer", "32-bit state for " + " and ".join(why), 2 * n32 * 4, f"2 x {n32:,} x 4 B"))
    return terms


# ---------------------------------------------------------------------------------------------
# activations: what autograd keeps, per token
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    """Bytes per token of one kind of saved tensor in one decoder layer."""

    name: str
    per_token: int
    arithmetic: str


def layer_pieces(x: Setup, first_layer: bool = False) -> list[Piece]:
    """What one decoder layer keeps for backward, per token (first_layer: LoRA's layer 0, whose input needs no grad)."""
    h, i, c = x.shapes.hidden, x.shapes.intermediate, x.dtypes.compute
    norms = 1 if first_layer else 2
    out = [norm_piece(x, norms)]
    if x.full_ft:
        r = x.dtypes.residual
        out.append(Piece("RMSNorm normalized values (the norm weights train)", 2 * r * h, f"2 x {r} B x {h}"))
    out.append(attention_piece(x))
    out.extend(full_ft_linear_inputs(x) if x.full_ft else [lora_piece(x, first_layer)])
    mlp = c if x.full_ft else x.dtypes.mlp
    if x.recipe.liger_kernels:  # Liger's SwiGLU keeps gate and up, and recomputes silu in its backward
        out.append(Piece(f"MLP gate and up outputs ({x.dtype(mlp)}; Liger SwiGLU)", 2 * i * mlp, f"2 x {i} x {mlp} B"))
    else:
        out.append(Piece(f"MLP gate, up and silu outputs ({x.dtype(mlp)})", 3 * i * mlp, f"3 x {i} x {mlp} B"))
    return out


def norm_piece(x: Setup, norms: int) -> Piece:
    """What RMSNorm keeps: an fp32 copy of its input and rsqrt; Liger's kernel keeps the input as it is."""
    h = x.shapes.hidden
    if x.recipe.liger_kernels:
        r = x.dtypes.residual
        return Piece(f"RMSNorm inputs ({x.dtype(r)}, Liger) + rsqrt", norms * (r * h + 4), f"{norms} x ({r} B x {h} + 4 B)")
    return Piece("RMSNorm inputs in fp32 + rsqrt", norms * (4 * h + 4), f"{norms} x (4 B x {h} + 4 B)")


def attention_piece(x: Setup) -> Piece:
    """What scaled_dot_product_attention keeps: q, k, v, output and logsumexp, or the probabilities (math)."""
    q, kv, heads, c, seq = x.shapes.q_dim, x.shapes.kv_dim, x.shapes.heads, x.dtypes.compute, x.recipe.max_seq_length
    if x.kernel == "math":  # no fused kernel: scaled q and k, v and the [heads x seq] probabilities, in fp32
        return Piece("attention (math kernel): scaled q, k, v and the probabilities, fp32",
                     4 * (3 * q + heads * seq), f"4 B x (3 x {q} + {heads} heads x {seq})")
    if x.padded:  # a mask: transformers repeats k and v to every head; the kernel keeps the float mask
        return Piece(f"attention ({x.kernel}, padded batch): q, k and v repeated to {q}, output, logsumexp, mask",
                     c * 4 * q + 4 * heads + c * seq, f"{c} B x 4 x {q} + 4 B x {heads} + {c} B x {seq}")
    return Piece(f"attention ({x.kernel}): q, k, v, output, logsumexp", c * (2 * q + 2 * kv) + 4 * heads,
                 f"{c} B x (2 x {q} + 2 x {kv}) + 4 B x {heads}")


def lora_piece(x: Setup, first_layer: bool = False, only: tuple[str, ...] | None = None) -> Piece:
    """LoRA keeps, per adapted linear: the dropout mask, lora_A's input and lora_A's output (only: these linears)."""
    recipe, c, r = x.recipe, x.dtypes.compute, x.recipe.lora_r
    total, parts = 0, []
    shapes = [(n, i, o) for n, i, o in lora_shapes(recipe, x.shapes) if only is None or n in only]
    for name, i, _ in shapes:
        has_mask = recipe.lora_dropout > 0 and not (first_layer and name in ATTENTION_INPUTS)
        m = x.dtypes.mask if has_mask else 0
        total += i * (c + m) + r * c
        parts.append(f"{i} x ({c}{f' + {m}' if m else ''}) + {r} x {c}")
    counted = {p: parts.count(p) for p in dict.fromkeys(parts)}  # identical modules once, with a count
    arithmetic = " + ".join(p if n == 1 else f"{n} x ({p})" for p, n in counted.items())
    names = ", ".join(n for n, _, _ in shapes)
    what = "dropout mask, lora_A input and output" if recipe.lora_dropout > 0 else "lora_A input and output"
    return Piece(f"LoRA ({names}): {what}", total, arithmetic + " B")


def full_ft_linear_inputs(x: Setup) -> list[Piece]:
    """A full fine-tune keeps every linear's input for its weight gradient (q/k/v share one)."""
    h, i, c = x.shapes.hidden, x.shapes.intermediate, x.dtypes.compute
    same = x.dtypes.norm_out == c  # else autocast makes one copy per consumer
    attn, mlp = (1, 1) if same else (3, 2)
    pieces = [Piece("linear inputs (the weights train): both norms' outputs and down_proj's input",
                    (attn + mlp) * h * c + i * c, f"{attn + mlp} x {h} x {c} B + {i} x {c} B")]
    if x.kernel == "math":  # the fused kernels keep their output anyway; the math path does not
        pieces.append(Piece("o_proj input", x.shapes.q_dim * c, f"{x.shapes.q_dim} x {c} B"))
    return pieces


def autocast_weight_copies(x: Setup) -> int:
    """Bytes per layer of half-precision copies autocast makes of fp32 weights that train (kept for backward)."""
    if x.dtypes.compute == 4:
        return 0
    if x.full_ft:
        return x.dtypes.compute * sum(i * o for _, i, o in x.shapes.layer_linears) if x.dtypes.weight == 4 else 0
    if x.dtypes.lora == 4:
        return x.dtypes.compute * sum(x.recipe.lora_r * (i + o) for _, i, o in lora_shapes(x.recipe, x.shapes))
    return 0


def _grouped(arithmetic: str) -> str:
    """Arithmetic with a sum in it, in parentheses, so that a product before it applies to all of it."""
    return f"({arithmetic})" if " + " in arithmetic else arithmetic


def per_layer_bytes(pieces: list[Piece]) -> int:
    """Bytes per token of one layer."""
    return sum(p.per_token for p in pieces)


def layer_activation_terms(x: Setup) -> list[Term]:
    """Every layer's saved tensors, or only each layer's input under gradient checkpointing."""
    recipe, s, d = x.recipe, x.shapes, x.dtypes
    B, S, T, L, h = recipe.micro_batch, recipe.max_seq_length, x.tokens, s.layers, s.hidden
    if offloaded(x):
        terms = [Term("activations", "the layers' saved tensors: in CPU memory (activation offloading)", 0, "")]
        if recipe.offload_embeddings and not s.tied:
            terms.append(Term("activations", f"the embedding output, copied to the GPU ({x.dtype(d.residual)})",
                              T * h * d.residual, f"{T} tokens x {h} x {d.residual} B"))
        return terms
    if recipe.gradient_checkpointing:
        terms = [Term("activations", f"checkpointed layer inputs ({x.dtype(d.residual)})", L * T * h * d.residual,
                      f"{L} layers x {T} tokens x {h} x {d.residual} B"),
                 Term("activations", "position ids (a checkpoint input)", S * 8, f"{S} x 8 B")]
        if x.padded:
            terms.append(Term("activations", "padding mask (bool, a checkpoint input)", B * S * S,
                              f"{B} x {S} x {S} x 1 B"))
        return terms
    rest = L - 1 if recipe.uses_lora else L  # LoRA's layer 0: the embedding output needs no gradient
    terms = [Term("activations", p.name, rest * T * p.per_token,
                  f"{rest} layers x {T} tokens x {_grouped(p.arithmetic)}") for p in layer_pieces(x)]
    if recipe.uses_lora:
        first = per_layer_bytes(layer_pieces(x, first_layer=True))
        terms.append(Term("activations", "layer 0 (its input needs no gradient: no first-norm input, no q/k/v masks)",
                          T * first, f"{T} tokens x {first:,} B"))
    copies = autocast_weight_copies(x)
    if copies:
        terms.append(Term("activations", f"{x.dtype(x.dtypes.compute)} copies of the fp32 weights that train "
                          "(autocast makes them; matmuls keep them)", L * copies, f"{L} layers x {copies:,} B"))
    return terms


def head_activation_terms(x: Setup) -> list[Term]:
    """What the final norm, the rotary tables and the fused loss keep (outside the layers)."""
    recipe, d, h = x.recipe, x.dtypes, x.shapes.hidden
    B, S, T, N = recipe.micro_batch, recipe.max_seq_length, x.tokens, x.scored
    final = norm_piece(x, 1)
    terms = [Term("activations", "final " + final.name, T * final.per_token, f"{T} tokens x {final.arithmetic}")]
    if x.full_ft:
        terms.append(Term("activations", "final RMSNorm normalized values", T * h * d.residual,
                          f"{T} x {h} x {d.residual} B"))
    rows = T if (x.hardware.device == "cpu" and B == 1) else N  # CPU with one row keeps a view, else a copy
    terms.append(Term("activations", "hidden states kept by the fused loss", rows * h * d.norm_out,
                      f"{rows} x {h} x {d.norm_out} B"))
    terms.append(Term("activations", "labels of the step's micro-batches, per-token log-probs",
                      recipe.grad_accum * T * 8 + N * 16, f"{recipe.grad_accum} x {T} x 8 B + {N} x 16 B"))
    terms.append(Term("activations", "rotary cos and sin tables", 2 * S * x.shapes.head_dim * d.residual,
                      f"2 x {S} x {x.shapes.head_dim} x {d.residual} B"))
    return terms


# ---------------------------------------------------------------------------------------------
# temporaries: three candidate moments
# ---------------------------------------------------------------------------------------------
def loss_backward_temporaries(x: Setup) -> list[Term]:
    """trl's chunked log-prob backward: the logits tile, fp32 gradient buffers, dtype copies."""
    s, d, h, c, N = x.shapes, x.dtypes, x.shapes.hidden, x.dtypes.compute, x.scored
    n = min(N, LOSS_TOKEN_TILE)
    cols = min(s.vocab, LOSS_VOCAB_TILE)
    terms = [Term("temporaries", f"loss tile (up to {LOSS_TOKEN_TILE} tokens x {LOSS_VOCAB_TILE:,} vocabulary columns)",
                  n * LOSS_VOCAB_TILE * c, f"{n} x {LOSS_VOCAB_TILE} x {c} B"),
             Term("temporaries", "fp32 gradient of the hidden states", N * h * 4, f"{N} x {h} x 4 B"),
             Term("temporaries", "gradient of the per-token log-probs", N * 4, f"{N} x 4 B"),
             loss_scalars(x)]
    if d.norm_out != c:
        terms.append(Term("temporaries", f"hidden states cast to {x.dtype(c)}", n * h * c, f"{n} x {h} x {c} B"))
    lm_head = d.weight if x.full_ft else d.kept
    if lm_head != c:
        # the next chunk's copy exists before the last is freed: the two biggest neighbours overlap
        nxt = min(LOSS_VOCAB_TILE, s.vocab - LOSS_VOCAB_TILE) if s.vocab > LOSS_VOCAB_TILE else 0
        rows = f"2 x {cols}" if nxt == cols else (f"({cols} + {nxt})" if nxt else f"{cols}")
        terms.append(Term("temporaries", f"lm_head chunk cast to {x.dtype(c)} ({2 if nxt else 1} overlapping)",
                          (cols + nxt) * h * c, f"{rows} x {h} x {c} B"))
    if x.full_ft:
        terms.append(Term("temporaries", "fp32 gradient of lm_head", s.vocab * h * 4, f"{s.vocab} x {h} x 4 B"))
        if lm_head != 4:
            terms.append(Term("temporaries", f"lm_head gradient cast back to {x.dtype(lm_head)}",
                              s.vocab * h * lm_head, f"{s.vocab} x {h} x {lm_head} B"))
    if x.hardware.device == "cpu":  # no Triton: the tile's backward runs as torch ops on [tokens x vocab] tensors
        k = 7 if c == 4 else 8
        terms.append(Term("temporaries", f"CPU fallback of the tile backward ({k} fp32 + 1 bool [tokens x vocab])",
                          n * cols * (k * 4 + 1), f"{n} x {cols} x ({k} x 4 + 1) B"))
    elif d.norm_out != 4:
        terms.append(Term("temporaries", f"hidden-state gradient cast back to {x.dtype(d.norm_out)}",
                          N * h * d.norm_out, f"{N} x {h} x {d.norm_out} B"))
    return terms


def loss_scalars(x: Setup) -> Term:
    """The loss, its scaled copy and its gradient's seed (and, with accumulation, the step's running loss)."""
    n = 5 if x.recipe.grad_accum > 1 else 3
    return Term("temporaries", "loss scalars", n * 4, f"{n} x 4 B")


def loss_forward_extras(x: Setup) -> list[Term]:
    """Alive only during the fused loss's forward (so the tracker files them as activations): the tile, casts."""
    s, d, h, c = x.shapes, x.dtypes, x.shapes.hidden, x.dtypes.compute
    n, cols = min(x.scored, LOSS_TOKEN_TILE), min(s.vocab, LOSS_VOCAB_TILE)
    terms = [Term("activations", "loss tile during the loss's forward", n * LOSS_VOCAB_TILE * c,
                  f"{n} x {LOSS_VOCAB_TILE} x {c} B")]
    if not (x.hardware.device == "cpu" and x.recipe.micro_batch == 1):  # the kept hidden states are a copy
        terms.append(Term("activations", "final norm output, still referenced during the loss's forward",
                          x.tokens * h * d.norm_out, f"{x.tokens} x {h} x {d.norm_out} B"))
    if d.norm_out != c:
        terms.append(Term("activations", f"hidden states cast to {x.dtype(c)} (forward)", n * h * c,
                          f"{n} x {h} x {c} B"))
    if (d.weight if x.full_ft else d.kept) != c:
        terms.append(Term("activations", f"lm_head chunk cast to {x.dtype(c)} (forward: one at a time)",
                          cols * h * c, f"{cols} x {h} x {c} B"))
    if x.hardware.device == "cpu":
        terms.append(Term("activations", "CPU fallback of the tile forward (3 fp32 [tokens x vocab])",
                          3 * n * cols * 4, f"3 x {n} x {cols} x 4 B"))
    return terms


def layer_backward_temporaries(x: Setup) -> list[Term]:
    """The last layer's backward: its recomputed activations (checkpointing) and the MLP's gradients."""
    T, h, i, d = x.tokens, x.shapes.hidden, x.shapes.intermediate, x.dtypes
    terms = []
    if x.recipe.gradient_checkpointing or offloaded(x):  # recomputed, or back from CPU memory
        per_token = per_layer_bytes(layer_pieces(x)) - norm_keeps_layer_input(x)
        copies = autocast_weight_copies(x)
        extra = f" + {copies:,} B of autocast weight copies" if copies else ""
        terms.append(Term("temporaries", "last layer recomputed (checkpointing)", T * per_token + copies,
                          f"{T} tokens x {per_token:,} B{extra}"))
    mlp = d.compute if x.full_ft else d.mlp
    if x.recipe.liger_kernels:  # Liger's SwiGLU backward writes the gate and up gradients over its inputs
        terms.append(Term("temporaries", "gradients in the MLP's backward: residual, down_proj input, gate/up (Liger)",
                          T * (h * d.residual + 2 * i * mlp), f"{T} tokens x ({h} x {d.residual} + 2 x {i} x {mlp}) B"))
    else:
        terms.append(Term("temporaries", "gradients in the MLP's backward: residual, down_proj input, gate, up",
                          T * (h * d.residual + 3 * i * mlp), f"{T} tokens x ({h} x {d.residual} + 3 x {i} x {mlp}) B"))
    return terms


def norm_keeps_layer_input(x: Setup) -> int:
    """Bytes per token the recomputed first norm shares with the layer's checkpointed input: it keeps that tensor
    itself (not a copy) when the residual stream is fp32 or Liger's norm keeps its input as it is."""
    d = x.dtypes
    return d.residual * x.shapes.hidden if (d.residual == 4 or x.recipe.liger_kernels) else 0


def offloaded(x: Setup) -> bool:
    """trl's activation offloading on a GPU: every tensor the layers save for backward goes to CPU memory."""
    return x.recipe.offload_activations and x.hardware.device == "cuda"


def recomputed_input(x: Setup) -> list[Term]:
    """Under offloading, the layer being recomputed gets its checkpointed input back on the GPU."""
    if not (offloaded(x) and x.recipe.gradient_checkpointing):
        return []
    T, h, r = x.tokens, x.shapes.hidden, x.dtypes.residual
    return [Term("temporaries", "the last layer's checkpointed input, back from CPU memory", T * h * r,
                 f"{T} tokens x {h} x {r} B")]


def attention_backward_temporaries(x: Setup) -> list[Term]:
    """The math kernel's backward in the last layer: per token, 8 bytes per [heads x seq] element beside the saved
    probabilities (in fp32 the probabilities' and the scores' gradients; in half precision the scores' gradient in
    fp32, as autocast runs softmax in fp32, and two half-precision ones), while the part of the layer before the
    attention (first norm, q/k/v LoRA) is still alive. Measured with the
    tensor tracker on the T4 profile (course_utils/reference/t4): this is where fp16 recipes without the
    fp32 upcast peak."""
    T, h, H, S, c, d = x.tokens, x.shapes.hidden, x.shapes.heads, x.recipe.max_seq_length, x.dtypes.compute, x.dtypes
    terms = recomputed_input(x)
    if x.recipe.gradient_checkpointing or offloaded(x):
        pieces = [norm_piece(x, 1).per_token - norm_keeps_layer_input(x), attention_piece(x).per_token]
        if x.full_ft:
            pieces.append(full_ft_linear_inputs(x)[0].per_token - x.shapes.intermediate * c - 2 * h * c)
        else:
            pieces.append(lora_piece(x, only=ATTENTION_INPUTS).per_token)
        per_token = sum(pieces)
        terms.append(Term("temporaries", "last layer recomputed up to its attention: first norm, q/k/v inputs, attention",
                          T * per_token, f"{T} tokens x {per_token:,} B"))
    if c == 4:
        what, arithmetic = "the probabilities' and the scores' gradients (fp32)", "(4 + 4)"
    else:  # autocast runs softmax in fp32
        what, arithmetic = f"the scores' gradient (fp32) + two {x.dtype(c)} [heads x seq] tensors", f"(4 + 2 x {c})"
    terms.append(Term("temporaries", f"attention backward (math kernel): {what}", T * H * S * 8,
                      f"{T} tokens x {H} heads x {S} x {arithmetic} B"))
    terms.append(Term("temporaries", f"gradient of the residual stream ({x.dtype(d.residual)})", T * h * d.residual,
                      f"{T} tokens x {h} x {d.residual} B"))
    return terms


def embedding_backward_temporaries(x: Setup) -> list[Term]:
    """A full fine-tune's input embedding backward on CUDA: a zeroed table, the table's gradient, and (tied to
    lm_head) the sum of the two gradients, each as big as the table (measured on the T4 profile)."""
    s, g = x.shapes, x.dtypes.weight
    n = 3 if s.tied else 2
    what = "zeros, gradient and the tied sum" if s.tied else "zeros and gradient"
    return [Term("temporaries", f"embedding backward: {n} tables ({what}) of {x.dtype(g)}", n * s.embed_params * g,
                 f"{n} x {s.embed_params:,} x {g} B")]


def optimizer_step_temporaries(x: Setup) -> list[Term]:
    """Scratch of the optimizer step: torch AdamW's sqrt of the second moment; 8-bit steps work in place."""
    if x.recipe.optimizer not in TORCH_ADAMW:
        return [Term("temporaries", f"{x.recipe.optimizer} step (in-place kernels)", 0, "")]
    tensors, b = trainable_tensors(x), trainable_bytes_per_element(x)
    if x.hardware.device == "cuda":  # foreach: one copy of every exp_avg_sq at once
        n = sum(e * c for _, e, c in tensors)
        return [Term("temporaries", "AdamW step: sqrt(exp_avg_sq) of every tensor at once (foreach)", n * b,
                     f"{n:,} x {b} B")]
    largest = max(e for _, e, _ in tensors)
    return [Term("temporaries", "AdamW step, one tensor at a time: two copies of the largest", 2 * largest * b,
                 f"2 x {largest:,} x {b} B")]


# ---------------------------------------------------------------------------------------------
# the estimate
# ---------------------------------------------------------------------------------------------
# What CUDA allocates outside the tensors above, as max_memory_allocated sees it. Each cuBLAS handle
# keeps a workspace from the caching allocator, and training uses two: the main thread's (forward) and
# autograd's device thread's (backward). Kernels also take scratch memory inside their calls (cuBLASLt,
# attention), which grows with the tokens of a micro-batch: KERNEL_SCRATCH_PER_TOKEN is fitted to the
# shipped T4 check (course_utils/reference/t4, its runs on an H200 under the T4 profile; the test
# test_estimate_cuda_allocated_on_t4_profile holds them within 3%, one named run aside).
CUBLAS_HANDLES = 2
KERNEL_SCRATCH_PER_TOKEN = 26 * 1024


def cublas_workspace_bytes(cc: tuple[int, int] | None) -> int:
    """torch's default cuBLAS workspace per handle: 32 MiB on compute capability 9.0 (Hopper), else
    4096 KiB x 2 + 16 KiB x 8 (CUBLAS_WORKSPACE_CONFIG changes it)."""
    return 4096 * 8 * 1024 if cc == (9, 0) else 4096 * 1024 * 2 + 16 * 1024 * 8


def cuda_extra_term(x: Setup, cc: tuple[int, int] | None) -> Term:
    """CUDA's allocations outside the counted tensors: cuBLAS workspaces and kernels' scratch."""
    ws = cublas_workspace_bytes(cc)
    tokens = x.tokens
    return Term("temporaries", "CUDA libraries' own memory",
                CUBLAS_HANDLES * ws + KERNEL_SCRATCH_PER_TOKEN * tokens,
                f"{CUBLAS_HANDLES} cuBLAS workspaces x {fmt_bytes(ws)} (compute capability "
                f"{'.'.join(map(str, cc)) if cc else '?'}) + {tokens:,} tokens x {KERNEL_SCRATCH_PER_TOKEN // 1024} KiB "
                f"of kernel scratch")


def estimate(recipe: Recipe, config=None, *, hardware: str | Hardware = "gpu", padded: bool = False,
             device_cc: tuple[int, int] | None = None) -> Estimate:
    """Predict the peak memory of one steady-state training step of `recipe`, term by term.

    config: a transformers config (default: the recipe's model's). hardware: 'gpu' (bf16, flash
    attention), 't4' (fp16) or 'cpu'. padded: a micro-batch at the peak has padding, so attention
    gets a mask (one per layer, and k/v repeated to every head); full batches have none.
    device_cc: the compute capability of the GPU that really runs it, when it is not the hardware's
    own (a T4 profile on an H200 runs the H200's libraries, so their workspaces).
    """
    hw = get_hardware(hardware)
    s = shapes_from_config(config) if config is not None else model_shapes(recipe.model)
    precision = resolve_precision(recipe, hw)
    d = dtypes_for(recipe, precision, hw)
    x = Setup(recipe, s, d, hw, precision, attention_kernel(hw, d, s, padded), padded)
    candidates = candidate_moments(x)
    totals = {name: sum(t.nbytes for t in terms) for name, terms in candidates.items()}
    moment = max(totals, key=totals.get)
    extra = cuda_extra_term(x, device_cc or hw.compute_capability) if hw.device == "cuda" else None
    return Estimate(recipe=recipe, hardware=hw, precision=precision, moment=moment,
                    terms=[t for t in candidates[moment] if t.nbytes], moments=totals, notes=estimate_notes(x),
                    cuda_extra=extra)


def candidate_moments(x: Setup) -> dict[str, list[Term]]:
    """What is alive at each moment the peak can happen: the loss's forward and backward, the last layer's backward,
    the optimizer step."""
    static = parameter_terms(x) + optimizer_terms(x)
    grads = gradient_terms(x)
    accumulating = x.recipe.grad_accum > 1
    which = "micro-batch 2 or later (every gradient exists)" if accumulating else "the step's only micro-batch"
    layers = layer_activation_terms(x)
    head = head_activation_terms(x)
    # in the layers' backward: with accumulation every gradient exists from the second micro-batch on; under
    # activation offloading every layer's backward needs the same memory, so the last (layer 0, with every
    # other gradient made and the loss's kept hidden states not yet freed) is the largest
    later = grads if accumulating else lm_head_gradient(x)
    if offloaded(x):
        later = grads + [t for t in head if t.name == "hidden states kept by the fused loss"]
    moments = {
        f"in the forward of the fused loss, {which}":
            static + (grads if accumulating else []) + layers + head + loss_forward_extras(x),
        f"in the backward of the fused loss, {which}":
            static + (grads if accumulating else []) + layers + head + loss_backward_temporaries(x),
        f"in the backward of the last decoder layer, {which}":
            static + later + layers + recomputed_input(x) + layer_backward_temporaries(x),
        "in the optimizer step": static + grads + optimizer_step_temporaries(x),
    }
    if x.kernel == "math":
        moments[f"in the attention backward of the last decoder layer, {which}"] = (
            static + later + layers + attention_backward_temporaries(x))
    if x.full_ft and x.hardware.device == "cuda":
        moments[f"in the input embedding's backward, {which}"] = static + grads + embedding_backward_temporaries(x)
    return moments


def lm_head_gradient(x: Setup) -> list[Term]:
    """A full fine-tune's first micro-batch: lm_head's gradient exists once the loss's backward is done."""
    if not x.full_ft:
        return []
    n, b = x.shapes.lm_head_params or x.shapes.embed_params, x.dtypes.weight
    return [Term("gradients", "lm_head's gradient (the layers' come later)", n * b, f"{n:,} x {b} B")]


def estimate_notes(x: Setup) -> list[str]:
    """Assumptions a reader should know about."""
    notes = []
    if x.shapes.model_type not in ("llama", "mistral", "qwen2", "qwen3"):
        notes.append(f"activations are modelled on Llama-style layers; {x.shapes.model_type!r} may differ.")
    if x.kernel == "math":
        notes.append("no fused attention kernel applies (fp32, or no FlashAttention-2, with grouped-query "
                     "attention): the math kernel keeps [heads x seq x seq] probabilities per layer.")
    if not x.padded:
        notes.append("assumes full (unpadded) micro-batches; a padded one adds a mask and repeated k/v per layer.")
    if x.recipe.offload_activations and x.hardware.device == "cuda":
        notes.append("activation offloading: the layers' saved tensors are counted in CPU memory, not the GPU's.")
    if x.recipe.optimizer.startswith("paged") and x.hardware.device == "cuda":
        paged = sum(e * c for _, e, c in trainable_tensors(x) if e >= BNB_PAGE_MIN)
        notes.append(f"paged optimizer: the state of tensors with {BNB_PAGE_MIN:,} elements or more "
                     f"({paged:,} parameters) lives in unified memory, outside PyTorch's allocator and this "
                     "estimate; the GPU holds it while there is room." if paged else
                     f"paged optimizer: no trainable tensor has {BNB_PAGE_MIN:,} elements or more, so nothing is paged.")
    return notes


# ---------------------------------------------------------------------------------------------
# the course's answer to the chapter's "Expected Memory Usage" table
# ---------------------------------------------------------------------------------------------
NOT_MEMORY_FIELDS = ("steps", "warmup_steps", "learning_rate", "seed", "label")  # knobs that do not move the peak

TABLE_MODELS = (("7B", "llama-2-7b"), ("8B", "llama-3.1-8b"), ("13B", "llama-2-13b"), ("70B", "llama-3.1-70b"))
# The source chapter's "Expected Memory Usage" table, as printed (no 8B row).
CHAPTER_CLAIMS = {"7B": ("~14GB", "~4-6GB"), "13B": ("~26GB", "~8-10GB"), "70B": ("~140GB", "~40-48GB")}


def same_setup(a: Recipe, b: Recipe) -> bool:
    """True when two recipes train the same model the same way (steps, learning rate, seed, label aside)."""
    da, db = a.to_dict(), b.to_dict()
    return all(da[k] == db[k] for k in da if k not in NOT_MEMORY_FIELDS)


def reference_for(recipe: Recipe, references: list | None = None):
    """The shipped GPU reference Measurement of this exact setup, or None."""
    from .results import reference_results

    refs = reference_results() if references is None else references
    return next((m for m in refs if m.fits and same_setup(m.recipe_obj, recipe)), None)


def without_optimization_recipe(model: str) -> Recipe:
    """'Without optimization', read honestly: a full fine-tune in bf16 with AdamW, no checkpointing, 1 x 16, seq 512."""
    return Recipe(model=model, lora_r=None, precision="bf16", gradient_checkpointing=False, micro_batch=1,
                  grad_accum=16, optimizer="adamw_torch", max_seq_length=512, label="full fine-tune, bf16, AdamW")


@dataclass(frozen=True)
class ExpectedCell:
    """One cell of the table: the chapter's claim, our estimate, our measurement if a reference run exists."""

    claim: str  # as the chapter prints it, or "" where it has no row
    estimate: Estimate
    measured: object = None  # a reference Measurement, or None

    @property
    def source(self) -> str:
        """'measured' or 'estimated': where our number comes from."""
        return "measured" if self.measured is not None else "estimated"

    @property
    def peak_bytes(self) -> int:
        """Our number: the measured peak where there is one, else the estimate."""
        return self.measured.peak_bytes if self.measured is not None else self.estimate.peak_bytes


@dataclass(frozen=True)
class ExpectedRow:
    """One model size: 'without optimization' and 'full optimization'."""

    size: str
    model: str
    without: ExpectedCell
    full: ExpectedCell


def expected_memory_table(hardware: str | Hardware = "gpu") -> list[ExpectedRow]:
    """Rows 7B, 8B, 13B, 70B: the chapter's claims beside our estimates and (where they exist) measurements."""
    from .recipe import source_chapter_recipe
    from .results import reference_results

    refs = reference_results()
    rows = []
    for size, model in TABLE_MODELS:
        claims = CHAPTER_CLAIMS.get(size, ("", ""))
        cells = []
        for claim, recipe in zip(claims, (without_optimization_recipe(model), source_chapter_recipe(model))):
            cells.append(ExpectedCell(claim, estimate(recipe, hardware=hardware), reference_for(recipe, refs)))
        rows.append(ExpectedRow(size, model, *cells))
    return rows


def _gib(nbytes: float) -> str:
    """GiB with three significant figures: '8.15', '74.8', '657'."""
    v = nbytes / GiB
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _cell_text(cell: ExpectedCell) -> str:
    """'74.8 GiB measured (est. 74.8)' or '62.8 GiB estimated'."""
    text = f"{_gib(cell.peak_bytes):>5} GiB {cell.source}"
    return text + (f" (est. {_gib(cell.estimate.peak_bytes)})" if cell.measured is not None else "")


def format_expected_table(rows: list[ExpectedRow]) -> str:
    """The table as text, with what each column means and where the measurements come from."""
    lines = ["Peak memory of one training step, sequence 512, effective batch 16 (GiB = 2^30 bytes; the chapter's",
             "figures as it prints them). 'measured' = a shipped GPU reference run; 'estimated' = "
             "course_utils.estimate.",
             "",
             f"{'':<19}{'Without optimization (full FT)':<40}{'Full optimization (chapter recipe)':<40}",
             f"{'size model':<19}{'chapter':<9}{'ours':<31}{'chapter':<9}{'ours':<31}"]
    for r in rows:
        lines.append(f"{r.size:<4} {r.model:<14}{r.without.claim or '-':<9}{_cell_text(r.without):<31}"
                     f"{r.full.claim or '-':<9}{_cell_text(r.full)}")
    first = rows[0]
    shown = next((r for r in rows if r.without.measured is not None), first)  # a measured peak, where one ships
    params, shown_params = model_shapes(first.model).total_params, model_shapes(shown.model).total_params
    lines += ["",
              "Without optimization = without_optimization_recipe(model): a full fine-tune with bf16 weights, gradients",
              "  and AdamW states, no checkpointing, micro-batch 1 x 16. It peaks in the optimizer step at "
              f"{shown.without.peak_bytes / shown_params:.1f} bytes",
              f"  per parameter ({shown.model}, {shown.without.source}): 2 weights + 2 gradient + 2 x 2 AdamW + 2 "
              "for the step's",
              "  sqrt(exp_avg_sq) = 10. Pure bf16 AdamW is a saving in itself, and a lossy one (bf16 weights drop "
              "small updates).",
              "  Standard mixed precision keeps fp32 master weights, gradients and AdamW states: 4 + 4 + 2 x 4 = 16 "
              "bytes per",
              f"  parameter, {16 * shown_params / GiB:.0f} GiB for {shown.model} before any activation.",
              f"The chapter's {first.without.claim} for {first.size} is the bf16 weights alone ({params / 1e9:.2f} "
              f"billion x 2 bytes = {2 * params / 1e9:.1f} GB).",
              "Full optimization = source_chapter_recipe(model): 4-bit NF4 + double quant, LoRA r=16 on q/k/v/o, bf16,",
              "  gradient checkpointing, 1 x 16, paged_adamw_8bit.",
              "Estimates assume a bf16 GPU with FlashAttention-2; they need no weights."]
    for r in rows:
        for name, c in (("without optimization", r.without), ("full optimization", r.full)):
            if c.measured is not None:
                m = c.measured
                lines.append(f"{r.model} {name}, measured on {m.env.get('device')} {m.date[:10]}: tensors "
                             f"{_gib(m.peak_bytes)}, allocated {_gib(m.cuda_max_allocated or 0)}, "
                             f"reserved {_gib(m.cuda_max_reserved or 0)} GiB")
                if name == "without optimization" and m.losses:
                    lines.append(f"  Its loss per step (random weights, learning rate {m.recipe['learning_rate']:g}): "
                                 + ", ".join(f"{x:.2f}" for x in m.losses))
    return "\n".join(line.rstrip() for line in lines)


# ---------------------------------------------------------------------------------------------
# the recipes the estimator is held to on the tiny model (tests and scripts/estimator_accuracy.py)
# ---------------------------------------------------------------------------------------------
def tiny_check_recipes() -> list[Recipe]:
    """The chapter's ladder on the tiny model in fp32, plus full fine-tunes, micro-batch 8, sequence 512 and NF4
    without double quant."""
    from .recipe import ladder

    base = Recipe(learning_rate=1e-3, steps=4, warmup_steps=1)
    recipes: dict[str, Recipe] = {}
    for rung in ladder(base):  # on a CPU the mixed-precision rung is fp32: the same recipe as the rung before
        recipes.setdefault(rung.with_(precision="fp32").key, rung.with_(precision="fp32", label=rung.label))
    small = base.with_(micro_batch=2, max_seq_length=128)
    extras = [small.with_(lora_r=None, label="full fine-tune (2x1, seq 128)"),
              small.with_(lora_r=None, gradient_checkpointing=True, optimizer="adamw_8bit",
                          label="full fine-tune, ckpt, 8-bit AdamW"),
              base.with_(micro_batch=8, max_seq_length=128, label="micro-batch 8 (seq 128)"),
              base.with_(micro_batch=1, max_seq_length=512, label="sequence 512 (micro-batch 1)"),
              small.with_(load_in_4bit=True, double_quant=False, label="4-bit NF4 without double quant, no ckpt")]
    return list(recipes.values()) + extras


# ---------------------------------------------------------------------------------------------
# estimate against measurement
# ---------------------------------------------------------------------------------------------
SHORT_NAMES = {"parameters": "params", "gradients": "grads", "optimizer": "optim", "activations": "activ",
               "temporaries": "temps"}


def percent_error(est: float, got: float) -> str:
    """'+1.2%', or the difference in MiB ('+0.0M') when both are under 1 MiB."""
    if max(est, got) < MiB:
        return f"{(est - got) / MiB:+.1f}M"
    return f"{100 * (est - got) / got:+.1f}%" if got else "new"


def comparison_header(width: int = 56) -> str:
    """Column names and units of comparison_lines()."""
    cols = list(CATEGORIES) + ["peak"]
    return (f"{'run':<{width}}     " + "".join(f"{SHORT_NAMES.get(c, c):>10}" for c in cols)
            + f"\n{'':<{width}}     " + "".join(f"{'(MiB)':>10}" for _ in cols))


def comparison_lines(label: str, est: Estimate, m, width: int = 56) -> list[str]:
    """Three lines: estimate, measurement, error, per category and at the peak (MiB)."""
    cols = list(CATEGORIES) + ["peak"]
    want = {**est.by_category, "peak": est.peak_bytes}
    got = {**{c: m.peak_by_category.get(c, 0) for c in CATEGORIES}, "peak": m.peak_bytes}
    return [f"{label[:width]:<{width}} est " + "".join(f"{want[c] / MiB:10.1f}" for c in cols),
            f"{'':<{width}} meas" + "".join(f"{got[c] / MiB:10.1f}" for c in cols),
            f"{'':<{width}} err " + "".join(f"{percent_error(want[c], got[c]):>10}" for c in cols)]
