"""One estimate's setting (recipe, shapes, dtypes, hardware) and its static terms: parameters, gradients and
optimizer state. What autograd keeps and what is alive only for a moment: `activations`.

Part of `course_utils.estimate` (its docstring says how the bytes are counted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from course_utils.common import CATEGORIES as _CATEGORIES, Hardware
from course_utils.recipe import Recipe, RecipeError


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


CATEGORIES = _CATEGORIES[:5]  # what the estimator predicts: every category but "other"

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


# ---------------------------------------------------------------------------------------------
# one line of the arithmetic
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Term:
    """One line of the arithmetic: bytes of one thing in one category."""

    category: str
    name: str
    nbytes: int
    arithmetic: str = ""


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
        raise RecipeError(f"lora_targets: LoRA target module(s) {sorted(missing)} not found in {recipe.model}; its "
                          f"linear layers are {sorted({n for n, _, _ in s.layer_linears})}.")
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
