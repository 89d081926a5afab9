"""The transient terms: activations (what autograd keeps, per token) and temporaries (what is alive only at
one moment: the loss's tiles, a layer's backward, the optimizer step).

Part of `course_utils.estimate` (its docstring says how the bytes are counted).
"""

from __future__ import annotations

from dataclasses import dataclass

from course_utils.estimate.terms import (ATTENTION_INPUTS, LOSS_TOKEN_TILE, LOSS_VOCAB_TILE, Setup, Term,
                                         TORCH_ADAMW, lora_shapes, trainable_bytes_per_element, trainable_tensors)

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


# linears that read one tensor: without dropout, LoRA keeps it once for all of them
SAME_INPUT = {"q_proj": "attention input", "k_proj": "attention input", "v_proj": "attention input",
              "gate_proj": "MLP input", "up_proj": "MLP input"}


def lora_piece(x: Setup, first_layer: bool = False, only: tuple[str, ...] | None = None) -> Piece:
    """LoRA keeps, per adapted linear: the dropout mask, lora_A's input and lora_A's output (only: these linears).
    Without dropout (lora_dropout=0: peft's Identity) lora_A's input is the base linear's own input, the very
    tensor when nothing casts it (LoRA weights, and for q/k/v and gate/up the norm's output, in the matmuls'
    dtype): q, k and v read one, kept once; gate and up another; o_proj's is the attention's output, which the
    fused kernels keep already (the math kernel copies it first). Fused LoRA shares them so with dropout too, and
    keeps the masks. Measured to the byte on a CPU (tests/test_estimate.py, tests/test_fused_lora.py)
    and on the H200 (course_utils/reference/beyond/tries/: 16x1, 192 MiB less than each linear keeping its own)."""
    recipe, c, r, d = x.recipe, x.dtypes.compute, x.recipe.lora_r, x.dtypes
    total, parts, kept = 0, [], set()
    shapes = [(n, i, o) for n, i, o in lora_shapes(recipe, x.shapes) if only is None or n in only]
    # the very tensor, only when nothing casts it on the way to lora_A: autocast (a norm output in another dtype
    # than the matmuls') or peft (LoRA weights in another dtype than the input) makes a copy per linear. Fused LoRA
    # (course_utils/fused_lora.py) keeps lora_A's input before the dropout where the mask is kept anyway (the
    # layer's input needs a gradient), and drops it out again in the backward: shared as without dropout
    fused = recipe.fused_lora and recipe.load_in_4bit
    for name, i, _ in shapes:
        has_mask = recipe.lora_dropout > 0 and not (first_layer and name in ATTENTION_INPUTS)
        m = d.mask if has_mask else 0
        uncast = (recipe.lora_dropout == 0 or (fused and has_mask)) and d.lora == c
        source = SAME_INPUT.get(name, name)
        shared = uncast and ((source in kept and d.norm_out == c) or (name == "o_proj" and x.kernel != "math"))
        kept.add(source)
        if shared:  # the mask only (where there is one), and lora_A's output
            total += i * m + r * c
            parts.append((f"{i} x {m} + " if m else "") + f"{r} x {c}")
        else:
            total += i * (c + m) + r * c
            parts.append(f"{i} x ({c}{f' + {m}' if m else ''}) + {r} x {c}")
    counted = {p: parts.count(p) for p in dict.fromkeys(parts)}  # identical modules once, with a count
    arithmetic = " + ".join(p if n == 1 else f"{n} x ({p})" for p, n in counted.items())
    names = ", ".join(n for n, _, _ in shapes)
    what = ("lora_A input and output; no dropout: inputs the linears share, or the attention keeps, counted once"
            if recipe.lora_dropout == 0 else "dropout mask, lora_A input and output" if not fused else
            "dropout mask, lora_A output and input before the dropout (fused: inputs shared, counted once)")
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


def reentrant_output(x: Setup) -> list[Term]:
    """Reentrant checkpointing (notebook 09) holds the recomputed layer's output until that layer's backward ends,
    where non-reentrant recomputation stops before computing it: one hidden state more, measured on the T4 profile
    (reference/beyond/checks/reentrant-t4-llama-3.1-8b.jsonl: 4 MiB at 512 tokens in fp16, to the byte)."""
    if not (x.recipe.reentrant_checkpointing and x.recipe.gradient_checkpointing):
        return []
    T, h, r = x.tokens, x.shapes.hidden, x.dtypes.residual
    return [Term("temporaries", "the recomputed layer's output, held through its backward (reentrant)", T * h * r,
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
