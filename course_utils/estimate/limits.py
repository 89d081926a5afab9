"""Toward the limit (issue 16): how far a measured step is from what the GPU's arithmetic allows, and how far its
memory is from what the weights alone need. Arithmetic from the model's config and the recipe; no GPU.

- FLOPs per token (`flops_per_token`): 2 FLOPs per multiply-add. The forward multiplies every token by every
  weight of the decoder's linears, the LM head and the LoRA factors (2 x weights), plus attention's two products
  (scores and values, 2 x 2 x q_dim per earlier token; a causal token sees seq/2 on average). The backward
  computes the input gradients (the forward's matmuls again; attention's twice, both of its operands need
  gradients) and the weight gradients of what trains only (2 x those weights: the LoRA factors; the frozen 4-bit
  base gets none). Gradient checkpointing runs the decoder layers' forward once more (not the LM head's, which
  sits outside the checkpointed layers). scripts/gpu/profile_step.py and the T4 check (course_utils.t4check) count
  the same.
- The compute limit (`limit_tokens_per_s`): the GPU's peak FLOP/s over the FLOPs of one token, where the peak is a
  datasheet's (course_utils.machine.DATASHEET_PEAK_FLOPS, dense) or a measured matmul rate
  (scripts/gpu/peak_matmul.py records one). A step never reaches it: norms, element-wise kernels, the 4-bit
  dequantization and the optimizer add time and no matmul FLOPs.
- The memory floor (`memory_floor`): the weights at their storage width, which every step needs on the
  GPU: the decoder's linears in NF4 (4.127 bits per weight with double quant: 4 + 8/64 for the 8-bit block
  scales + 32/(64 x 256) for their fp32 scales) and the tables that stay unquantized in bf16 (the input
  embeddings unless they live in CPU memory, the LM head, the norms). LoRA's weights, gradients and optimizer
  state, the activations and the temporaries come on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from course_utils.common import GiB, json_lines, shipped
from course_utils.estimate.shapes import model_shapes
from course_utils.estimate.terms import lora_shapes, nf4_bits_per_param, nf4_bytes
from course_utils.machine import DATASHEET_PEAK_FLOPS
from course_utils.recipe import Recipe
from course_utils.show.tables import wrap

# ---------------------------------------------------------------------------------------------
# FLOPs per token
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Flops:
    """The FLOPs of one trained token of a recipe, term by term (2 FLOPs per multiply-add)."""

    model: str
    seq: int
    layers: int
    q_dim: int
    layer_weights: int  # elements of the decoder layers' linears
    head_weights: int  # elements of the LM head (the embedding matrix when tied)
    lora_weights: int  # elements of the LoRA factors (0 without LoRA)
    trained_weights: int  # elements that get weight gradients: the LoRA factors, or every weight in a full fine-tune
    attention: float  # attention's forward FLOPs per token (both products, causal)
    checkpointing: bool

    @property
    def weights(self) -> int:
        """Every weight a token is multiplied by in the forward."""
        return self.layer_weights + self.head_weights + self.lora_weights

    @property
    def forward(self) -> float:
        return 2 * self.weights + self.attention

    @property
    def backward(self) -> float:
        """Input gradients (the forward's matmuls again, attention's twice) and the trained weights' gradients."""
        return 2 * self.weights + 2 * self.attention + 2 * self.trained_weights

    @property
    def recompute(self) -> float:
        """The decoder layers' forward again under gradient checkpointing (not the LM head's)."""
        return 2 * (self.layer_weights + self.lora_weights) + self.attention if self.checkpointing else 0

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute

    per_token = total  # the name the T4 time budget reads (course_utils.t4check)

    def lines(self) -> list[str]:
        """The arithmetic, one step a line (at most 100 characters each)."""

        w, h, lo, t, a = self.layer_weights, self.head_weights, self.lora_weights, self.trained_weights, self.attention
        out = [f"FLOPs per token of {self.model}, sequence {self.seq} (2 FLOPs per multiply-add):",
               f"  weights    decoder linears {w:,} + LM head {h:,}" + (f" + LoRA {lo:,}" if lo else "")
               + f" = {self.weights:,}",
               f"  attention  {self.layers} layers x 2 products x 2 x {self.q_dim:,} x {self.seq / 2:g} "
               f"(causal: half of {self.seq}) = {a:,.0f}",
               f"  forward    2 x {self.weights:,} + {a:,.0f} = {self.forward / 1e9:.2f} GFLOP",
               f"  backward   input gradients 2 x {self.weights:,} + 2 x {a:,.0f}",
               f"             + weight gradients of what trains 2 x {t:,} = {self.backward / 1e9:.2f} GFLOP"]
        if self.checkpointing:
            out.append(f"  recompute  the layers' forward again 2 x ({w:,} + {lo:,}) + {a:,.0f} "
                       f"= {self.recompute / 1e9:.2f} GFLOP")
        share = f" (recomputation {self.recompute / self.total:.0%} of it)" if self.checkpointing else ""
        out.append(f"  total      {self.total / 1e9:.2f} GFLOP per token{share}")
        return [wrap(line, indent=" " * 13) for line in out]

    def explain(self) -> str:
        return "\n".join(self.lines())


def flops_per_token(recipe: Recipe, shapes=None) -> Flops:
    """The FLOPs of one trained token of `recipe` (the module's docstring says what is counted)."""

    s = shapes if shapes is not None else model_shapes(recipe.model)
    lora = s.layers * sum(recipe.lora_r * (i + o) for _, i, o in lora_shapes(recipe, s)) if recipe.uses_lora else 0
    head = s.lm_head_params or s.embed_params  # a tied head multiplies by the embedding matrix
    trained = lora if recipe.uses_lora else s.linear_params + head
    attention = s.layers * 2 * 2 * s.q_dim * recipe.max_seq_length / 2
    return Flops(model=recipe.model, seq=recipe.max_seq_length, layers=s.layers, q_dim=s.q_dim,
                 layer_weights=s.linear_params, head_weights=head, lora_weights=lora, trained_weights=trained,
                 attention=attention, checkpointing=bool(recipe.gradient_checkpointing))


# ---------------------------------------------------------------------------------------------
# the compute limit
# ---------------------------------------------------------------------------------------------
def datasheet_peak(device: str, precision: str = "bf16") -> float | None:
    """The datasheet's dense peak FLOP/s of the GPU torch names `device` in `precision`, or None if the course has
    none (course_utils.machine.DATASHEET_PEAK_FLOPS)."""

    return DATASHEET_PEAK_FLOPS.get(device, {}).get(precision)


@dataclass(frozen=True)
class Peak:
    """A measured dense matmul rate (scripts/gpu/peak_matmul.py): one size x size x size matmul, median of its runs."""

    device: str
    dtype: str
    size: int
    tflops: float
    date: str
    command: str

    @property
    def flops_per_s(self) -> float:
        return self.tflops * 1e12


def measured_peak(device: str = "NVIDIA H200", dtype: str = "bf16") -> Peak:
    """The fastest shipped matmul rate of `device` in `dtype` (reference/beyond/tries/peak-matmul.jsonl, written by
    scripts/gpu/peak_matmul.py with the GPU's driver, CUDA, library versions, date and command)."""

    path = shipped("reference", "beyond", "tries", "peak-matmul.jsonl")
    found = [d for d in json_lines(path.read_text()) if d["device"] == device and d["dtype"] == dtype]
    if not found:
        raise KeyError(f"no shipped {dtype} matmul rate of {device!r} ({path}); scripts/gpu/peak_matmul.py measures one")
    d = max(found, key=lambda d: d["tflops"])
    return Peak(d["device"], d["dtype"], d["size"], d["tflops"], d["date"], d["command"])


def limit_tokens_per_s(recipe: Recipe, peak_flops: float, shapes=None) -> float:
    """Tokens per second if every FLOP of the step ran at `peak_flops`."""
    return peak_flops / flops_per_token(recipe, shapes).total


# ---------------------------------------------------------------------------------------------
# the memory floor
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Floor:
    """The weights' bytes on the GPU: [(what, bytes, arithmetic)] and their sum."""

    terms: tuple[tuple[str, int, str], ...]

    @property
    def total(self) -> int:
        return sum(b for _, b, _ in self.terms)

    def lines(self) -> list[str]:
        out = [f"  {name:<38}{b / GiB:6.2f} GiB  {arith}" for name, b, arith in self.terms]
        return out + [f"  {'memory floor':<38}{self.total / GiB:6.2f} GiB"]

    def explain(self) -> str:
        return "\n".join(self.lines())


def memory_floor(recipe: Recipe, shapes=None) -> Floor:
    """The recipe's weights at their narrowest storage on a CUDA GPU (a LoRA recipe's frozen base, a full
    fine-tune's trained weights; gradients and optimizer states are not in the floor): the 4-bit linears (NF4, as the recipe
    quantizes them: estimate.nf4_bytes, per tensor) or bf16 ones, and the unquantized tables in bf16 (whatever
    the recipe upcasts: the floor is what the step cannot do without). The input embeddings count only when
    they are on the GPU (not with offload_embeddings, unless tied to the LM head)."""

    s = shapes if shapes is not None else model_shapes(recipe.model)
    terms = []
    if recipe.load_in_4bit:
        b = s.layers * sum(nf4_bytes(i * o, recipe.double_quant) for _, i, o in s.layer_linears)
        kind = "NF4 + double quant" if recipe.double_quant else "NF4"
        terms.append((f"decoder linears ({kind})", b, f"{s.linear_params:,} x "
                      f"{nf4_bits_per_param(recipe.double_quant):.3f} bits"))
    else:
        terms.append(("decoder linears (bf16)", s.linear_params * 2, f"{s.linear_params:,} x 2 B"))
    if not (recipe.offload_embeddings and not s.tied):
        terms.append(("input embeddings (bf16)" + (", tied" if s.tied else ""), s.embed_params * 2,
                      f"{s.vocab:,} x {s.hidden:,} x 2 B"))
    if s.lm_head_params:
        terms.append(("LM head (bf16)", s.lm_head_params * 2, f"{s.vocab:,} x {s.hidden:,} x 2 B"))
    terms.append(("norms (bf16)", s.small_params * 2, f"{s.small_params:,} x 2 B"))
    return Floor(tuple(terms))


# ---------------------------------------------------------------------------------------------
# a measured run against both
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Against:
    """One measured run against the compute limit and the memory floor of its recipe on its GPU."""

    label: str
    tokens_per_s: float
    gflop_per_token: float
    peak_tflops: float | None  # None: no datasheet peak for the run's GPU
    limit_tokens_per_s: float | None
    fraction: float | None  # tokens/s / limit
    allocated_gib: float
    floor_gib: float

    @property
    def over_floor(self) -> float:
        """Allocated peak / memory floor."""
        return self.allocated_gib / self.floor_gib


def against(m, peak_flops: float | None = None) -> Against:
    """A measurement against its recipe's limit (at `peak_flops`, else its GPU's datasheet peak in its precision)
    and memory floor."""
    recipe = m.recipe_obj
    f = flops_per_token(recipe)
    peak = peak_flops if peak_flops is not None else datasheet_peak(m.env.get("device", ""), m.precision or "bf16")
    limit = peak / f.total if peak else None
    tokens = m.tokens_per_s or 0.0
    return Against(m.label, tokens, f.total / 1e9, peak / 1e12 if peak else None, limit,
                   tokens / limit if limit else None, (m.cuda_max_allocated or 0) / GiB,
                   memory_floor(recipe).total / GiB)
