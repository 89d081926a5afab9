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
scaled_dot_product_attention.

Where each part lives, each importing only the ones above it (and `course_utils.hardware`, home of the
devices an estimate assumes, `Hardware` and `HARDWARE`, and of `resolve_precision`):

- `terms`: the sizes an estimate reads (`Shapes`), one estimate's setting (`Setup`: dtypes, attention kernel) and
  the parameters, gradients and optimizer state.
- `shapes`: the model's shapes from its config on the meta device (`model_shapes`).
- `activations`: activations and temporaries.
- `peak`: the candidate moments, `estimate()` and its `Estimate`, CUDA's own memory beside it.
- `reports`: the chapter's memory table, the tiny model's check recipes, estimate against measurement.
- `distributed`: per-GPU memory on several GPUs under DDP or FSDP (`estimate_distributed`), from the terms above.

Every name is importable from `course_utils.estimate` itself.
"""

from __future__ import annotations

from types import ModuleType as _ModuleType

from course_utils.common import GiB, MiB
from course_utils.estimate.activations import (Piece, attention_backward_temporaries, attention_piece,
                                               autocast_weight_copies, embedding_backward_temporaries,
                                               full_ft_linear_inputs, head_activation_terms, layer_activation_terms,
                                               layer_backward_temporaries, layer_pieces, lora_piece,
                                               loss_backward_temporaries, loss_forward_extras, loss_scalars,
                                               norm_keeps_layer_input, norm_piece, offloaded,
                                               optimizer_step_temporaries, per_layer_bytes, recomputed_input)
from course_utils.estimate.distributed import (ANCHOR_GB_PER_GPU, DDP_BUCKET_CAP_MB, DistributedEstimate,
                                               FSDP_PREFETCHED_UNITS, ShardedTerm, STRATEGIES, anchor_check,
                                               anchor_lines, anchor_recipe, ddp_bucket_term, estimate_distributed,
                                               fsdp_moment_terms, fsdp_static_terms, layer_gather_term,
                                               layer_unit_bytes, reduce_scatter_term, root_gather_term, run_recipe)
from course_utils.estimate.peak import (CUBLAS_HANDLES, Estimate, KERNEL_SCRATCH_PER_TOKEN, candidate_moments,
                                        cublas_workspace_bytes, cuda_extra_term, estimate, estimate_notes,
                                        fmt_bytes, lm_head_gradient)
from course_utils.estimate.reports import (CHAPTER_CLAIMS, ExpectedCell, ExpectedRow, NOT_MEMORY_FIELDS,
                                           SHORT_NAMES, TABLE_MODELS, comparison_header, comparison_lines,
                                           expected_memory_table, format_expected_table, percent_error,
                                           reference_for, same_setup, tiny_check_recipes,
                                           without_optimization_recipe)
from course_utils.estimate.shapes import EstimateError, load_config, model_shapes, shapes_from_config
from course_utils.estimate.terms import (ATTENTION_INPUTS, BNB_32BIT, BNB_8BIT_BLOCK, BNB_MIN_8BIT_SIZE,
                                         BNB_PAGE_MIN, BNB_QMAP_BYTES, CATEGORIES, DQ_CODE_BYTES, Dtypes,
                                         LOSS_TOKEN_TILE, LOSS_VOCAB_TILE, NF4_BLOCK, NF4_CODE_BYTES,
                                         NF4_SCALE_BLOCK, Setup, Shapes, Term, TORCH_ADAMW, attention_kernel,
                                         bnb_8bit_terms, dtype_name, dtypes_for, gradient_terms, lora_params,
                                         lora_shapes, nf4_bits_per_param, nf4_bytes, optimizer_terms,
                                         parameter_terms, trainable_bytes_per_element, trainable_tensors)
from course_utils.machine import HARDWARE, Hardware, get_hardware

__all__ = sorted(name for name, value in globals().items() if not name.startswith("_")
                 and not isinstance(value, _ModuleType))  # every name above, not the submodules
