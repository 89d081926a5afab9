"""The peak moment: every candidate moment's terms, the largest of them as the Estimate, CUDA's own memory
beside it.

Part of `course_utils.estimate` (its docstring says how the bytes are counted).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from course_utils.checks import check_positions
from course_utils.common import GiB, MiB
from course_utils.estimate.activations import (attention_backward_temporaries, embedding_backward_temporaries,
                                               head_activation_terms, layer_activation_terms,
                                               layer_backward_temporaries, loss_backward_temporaries,
                                               loss_forward_extras, offloaded, optimizer_step_temporaries,
                                               recomputed_input, reentrant_output)
from course_utils.estimate.shapes import model_shapes, shapes_from_config
from course_utils.estimate.terms import (BNB_PAGE_MIN, CATEGORIES, Setup, Term, attention_kernel, dtypes_for,
                                         gradient_terms, optimizer_terms, parameter_terms, trainable_tensors)
from course_utils.machine import Hardware, get_hardware, resolve_precision
from course_utils.recipe import Recipe
from course_utils.show.tables import wrap

# ---------------------------------------------------------------------------------------------
# the result
# ---------------------------------------------------------------------------------------------
class TermSum:
    """What a list of terms adds up to (an Estimate's, and estimate.distributed's per GPU): needs `terms` and
    `cuda_extra`."""

    terms: list[Term]
    cuda_extra: Term | None

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


@dataclass
class Estimate(TermSum):
    """Predicted peak memory of one training step, term by term."""

    recipe: Recipe
    hardware: Hardware
    precision: str  # the resolved precision
    moment: str  # when the peak happens
    terms: list[Term]  # everything alive at that moment
    moments: dict[str, int] = field(default_factory=dict)  # every candidate moment's total
    notes: list[str] = field(default_factory=list)
    cuda_extra: Term | None = None  # what CUDA allocates outside these tensors (None off CUDA)

    def explain(self) -> str:
        """The arithmetic, term by term, grouped by category, in lines of at most 100 characters."""
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
        return wrap("\n".join(lines))  # at most 100 characters a line


def fmt_bytes(n: float) -> str:
    """Bytes as MiB with thousands separators (B or KiB below 0.1 MiB, GiB from 100 GiB)."""
    if n >= 100 * GiB:
        return f"{n / GiB:,.1f} GiB"
    if n >= 0.1 * MiB:
        return f"{n / MiB:,.1f} MiB"
    return f"{n / 1024:,.1f} KiB" if n >= 1024 else f"{n:.0f} B"


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
    positions = getattr(config, "max_position_embeddings", None) if config is not None else None
    check_positions(recipe.model, recipe.max_seq_length, positions)  # a hub id's own positions: models.load_config
    s = shapes_from_config(config) if config is not None else model_shapes(recipe.model)
    precision = resolve_precision(recipe.precision, hw)
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
            static + later + layers + recomputed_input(x) + reentrant_output(x) + layer_backward_temporaries(x),
        "in the optimizer step": static + grads + optimizer_step_temporaries(x),
    }
    if x.kernel == "math":
        moments[f"in the attention backward of the last decoder layer, {which}"] = (
            static + later + layers + reentrant_output(x) + attention_backward_temporaries(x))
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
