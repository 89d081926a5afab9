"""Beyond the source recipe: a leaner and a faster QLoRA recipe, one measured change at a time.

The source chapter's complete script is the baseline. Every change here keeps what is trained the
same (the same LoRA on the same frozen 4-bit model, the same data, the same tokens per optimizer
step) and changes only where bytes live, which kernels run, and how the tokens are batched:

  no fp32 upcast   peft's prepare_model_for_kbit_training casts every weight that is not 4-bit
                   (embeddings, lm_head, norms) to fp32. For Llama-3.1-8B that is 1.96 GiB more,
                   and the fp32 embedding output makes the whole residual stream fp32.
  embeddings on CPU  the input embedding table (1 GiB in bf16) is frozen, and a step reads only
                   micro_batch x sequence rows of it: it can stay in CPU memory.
  Liger kernels    fused RMSNorm, SwiGLU and RoPE from Liger (Triton, CUDA only). trl keeps its own
                   fused, chunked loss, which already never materializes the 128k-wide logits.
  micro-batch      at micro-batch 1 an 8B step is launch-bound: the GPU waits for Python. More
                   sequences per micro-batch, fewer accumulation steps, same tokens per step.

The GPU figures come from scripts/beyond_recipe.py, shipped in course_utils/reference/beyond/.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .recipe import Recipe, source_chapter_recipe

GiB = 2**30
BEYOND_DIR = "reference/beyond"

# the targets, as ratios against the source recipe measured in the same run
LEAN_MAX_RATIO = 0.70
LEAN_MAX_GIB = 5.7
FAST_MAX_GIB = 16.0
FAST_MIN_SPEEDUP = 8.0


def source(model: str = "llama-3.1-8b", steps: int = 5) -> Recipe:
    """The source chapter's recipe (QLoRA 1x16, checkpointing, paged 8-bit AdamW, bf16, sequence 512)."""
    return source_chapter_recipe(model).with_(steps=steps, warmup_steps=1, label="source recipe (1x16)")


def changes(model: str = "llama-3.1-8b", steps: int = 5) -> list[Recipe]:
    """The lean path: the source recipe, then one change at a time (each keeps the ones before)."""
    r = source(model, steps)
    out = [r]
    r = r.with_(prepare_kbit=False, label="+ no fp32 upcast")
    out.append(r)
    r = r.with_(offload_embeddings=True, label="+ embeddings on CPU")
    out.append(r)
    r = r.with_(liger_kernels=True, label="+ Liger kernels")
    out.append(r)
    return out


def lean(model: str = "llama-3.1-8b", steps: int = 5, micro_batch: int = 4) -> Recipe:
    """Same effective batch (16), sequence, LoRA and optimizer as the source; fewer bytes, more tokens/s."""
    r = changes(model, steps)[-1]
    return r.with_(micro_batch=micro_batch, grad_accum=16 // micro_batch, label=f"lean recipe ({micro_batch}x{16 // micro_batch})")


def fast(model: str = "llama-3.1-8b", steps: int = 5) -> Recipe:
    """Same tokens per optimizer step (16 x 512) in one micro-batch, within a 16 GiB card."""
    return source(model, steps).with_(prepare_kbit=False, liger_kernels=True, micro_batch=16, grad_accum=1,
                                      label="fast recipe (16x1)")


def fast_low_memory(model: str = "llama-3.1-8b", steps: int = 5) -> Recipe:
    """The fast recipe with the embeddings and, through trl, the saved activations in CPU memory."""
    return fast(model, steps).with_(offload_embeddings=True, offload_activations=True,
                                    label="fast, embeddings + activations on CPU (16x1)")


# ---------------------------------------------------------------------------------------------
# the side-by-side table
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One recipe beside the source recipe of the same run."""

    label: str
    allocated_gib: float
    reserved_gib: float
    tokens_per_s: float
    memory_ratio: float  # allocated / the source's allocated
    speed_ratio: float  # tokens/s / the source's tokens/s


def rows(measurements: list, source_label: str | None = None) -> list[Row]:
    """Rows with ratios against the source recipe among `measurements` (the first one by default)."""
    ok = [m for m in measurements if m.fits and m.cuda_max_allocated]
    if not ok:
        return []
    base = next((m for m in ok if m.label == source_label), ok[0])
    out = []
    for m in ok:
        out.append(Row(m.label, m.cuda_max_allocated / GiB, (m.cuda_max_reserved or 0) / GiB, m.tokens_per_s or 0.0,
                       m.cuda_max_allocated / base.cuda_max_allocated,
                       (m.tokens_per_s or 0.0) / base.tokens_per_s if base.tokens_per_s else 0.0))
    return out


def format_rows(table: list[Row]) -> str:
    """The side-by-side table as text."""
    w = max([len("recipe")] + [len(r.label) for r in table]) + 2
    lines = [f"{'recipe':<{w}}{'allocated':>10}{'reserved':>10}{'tokens/s':>10}{'memory':>9}{'speed':>8}",
             f"{'':<{w}}{'(GiB)':>10}{'(GiB)':>10}{'':>10}{'(x src)':>9}{'(x src)':>8}"]
    for r in table:
        lines.append(f"{r.label:<{w}}{r.allocated_gib:10.2f}{r.reserved_gib:10.2f}{r.tokens_per_s:10.0f}"
                     f"{r.memory_ratio:9.2f}{r.speed_ratio:8.2f}")
    return "\n".join(lines)


def target_checks(src, lean_m, fast_m) -> list[tuple[str, str, bool]]:
    """(target, what was measured, met?) for the issue's lean and fast targets."""
    out = []
    if src is None or not src.fits:
        return out
    s_alloc, s_speed = src.cuda_max_allocated / GiB, src.tokens_per_s
    if lean_m is not None and lean_m.fits:
        a = lean_m.cuda_max_allocated / GiB
        out.append((f"lean: allocated <= {LEAN_MAX_RATIO:.2f} x source", f"{a / s_alloc:.3f} x", a / s_alloc <= LEAN_MAX_RATIO))
        out.append((f"lean: allocated <= {LEAN_MAX_GIB} GiB", f"{a:.2f} GiB", a <= LEAN_MAX_GIB))
        out.append(("lean: tokens/s >= source", f"{lean_m.tokens_per_s:.0f} vs {s_speed:.0f}",
                    lean_m.tokens_per_s >= s_speed))
    if fast_m is not None and fast_m.fits:
        a = fast_m.cuda_max_allocated / GiB
        out.append((f"fast: allocated <= {FAST_MAX_GIB:.0f} GiB", f"{a:.2f} GiB", a <= FAST_MAX_GIB))
        out.append((f"fast: tokens/s >= {FAST_MIN_SPEEDUP:.0f} x source", f"{fast_m.tokens_per_s / s_speed:.2f} x",
                    fast_m.tokens_per_s >= FAST_MIN_SPEEDUP * s_speed))
    return out


def loss_agreement(a, b) -> dict:
    """How closely two runs' per-step losses agree: the largest and the mean gap, and how far each fell."""
    n = min(len(a.losses), len(b.losses))
    gaps = [abs(x - y) for x, y in zip(a.losses[:n], b.losses[:n])]
    return dict(steps=n, max_gap=max(gaps) if gaps else float("nan"),
                mean_gap=statistics.fmean(gaps) if gaps else float("nan"),
                fall_a=a.losses[0] - a.losses[n - 1] if n else float("nan"),
                fall_b=b.losses[0] - b.losses[n - 1] if n else float("nan"))


# ---------------------------------------------------------------------------------------------
# shipped data: the GPU runs and the peer figures
# ---------------------------------------------------------------------------------------------
def reference(model: str = "llama-3.1-8b") -> list:
    """The shipped GPU runs of scripts/beyond_recipe.py for `model` (empty when none ship)."""
    from .results import ResultStore

    path = Path(str(resources.files("course_utils") / BEYOND_DIR / f"{model}.jsonl"))
    out = ResultStore(path).load() if path.exists() else []
    for m in out:
        m.source = f"reference: beyond/{path.name}"
    return out


def peers() -> dict:
    """Figures measured for other stacks (Unsloth), with where they come from."""
    path = Path(str(resources.files("course_utils") / BEYOND_DIR / "peers.json"))
    return json.loads(path.read_text())
