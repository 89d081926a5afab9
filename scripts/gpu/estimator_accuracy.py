"""How close is the estimator? Estimate against measurement, per category and at the peak.

    python scripts/gpu/estimator_accuracy.py            # the GPU reference runs and the tiny model on CPU
    python scripts/gpu/estimator_accuracy.py --gpu-only # only the shipped reference runs (no training, ~10 s)

GPU: every run in course_utils/reference/ and reference/beyond/ (NVIDIA H200) against course_utils.estimate on a bf16 GPU.
CPU: the tiny model's ladder and a few more recipes, measured here in-process (deterministic: the
same bytes every run), against the estimate for a CPU. Where a number misses, the notes say which
term and why. The last table checks the planner's safety margin against what CUDA reserved.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from course_utils.estimate import comparison_header, comparison_lines, estimate, tiny_check_recipes

W = 56  # width of the run column


def peak_error(est, m) -> float:
    return 100 * (est.peak_bytes - m.peak_bytes) / m.peak_bytes


def notes_for(m, est) -> list[str]:
    """What a reader needs to know about this run: misses and where the peak was."""
    notes = []
    cats = m.peak_by_category
    if m.recipe.get("offload_activations"):
        notes.append("activation offloading: trl moves the layers' saved tensors to CPU memory, so the estimate "
                     f"keeps only the loss's inputs and the embedding output on the GPU "
                     f"({est.by_category['activations'] / 2**30:.2f} GiB of activations) and peaks in the "
                     "backward of layer 0, with every gradient made")
    if m.recipe.get("prepare_kbit") is False and m.recipe["micro_batch"] == 1:
        notes.append("at micro-batch 1 without the fp32 upcast the estimate misses ~75 MiB of temporaries "
                     "(a dequantized weight that outlives its matmul; not modelled)")
    if "optimizer step" in est.moment:
        notes.append("the peak is the optimizer step: temporaries are torch AdamW's sqrt(exp_avg_sq), one more "
                     "copy of the weights' size, and activations are gone")
    if m.recipe["grad_accum"] == 1 and cats.get("gradients", 0) == 0 and m.recipe.get("lora_r"):
        notes.append("gradients are 0 at the peak: one micro-batch per step, and the peak is in the backward "
                     "before any LoRA gradient exists")
    if "forward of the fused loss" in est.moment:
        notes.append("the peak is in the loss's forward (vocabulary <= 32,768: one chunk, so backward never holds "
                     "two lm_head copies): the loss tile and the bf16 lm_head copy count as activations, "
                     "temporaries are 0")
    return notes


def gpu_part() -> list[tuple[str, float]]:
    """The reference runs: print the comparison, return (label, peak error %)."""
    from course_utils.chapter.facts import accuracy

    runs = accuracy().runs  # the one comparison of estimate and reference run, which the README quotes too
    env = runs[0].measured.env
    print(f"GPU reference runs ({env['device']}, {runs[0].measured.date[:10]}, torch {env['versions']['torch']}, "
          f"transformers {env['versions']['transformers']}, trl {env['versions']['trl']}) "
          "against the estimate for a bf16 GPU:\n")
    print(comparison_header(W))
    errors, notes = [], []
    for r in runs:
        m, est = r.measured, r.estimated
        label = f"{r.model}: {r.label}"[:W]
        print("\n".join(comparison_lines(label, est, m, W)))
        errors.append((label, r.error))
        notes += [f"- {label}: {n}." for n in notes_for(m, est)]
    print("\nNotes:\n" + "\n".join(notes))
    return errors


def cpu_part() -> list[tuple[str, float]]:
    """The tiny model, measured here: print the comparison, return (label, peak error %)."""
    from transformers.utils import logging as hf_logging

    from course_utils.child import run_here

    hf_logging.disable_progress_bar()  # "Loading weights" for every run
    print("\nTiny model on this CPU, measured in-process (run_here), against the estimate for a CPU:\n")
    print(comparison_header(W))
    errors = []
    for recipe in tiny_check_recipes():
        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # the trainer's progress lines
            m = run_here(recipe)
        est = estimate(recipe, hardware="cpu")
        print("\n".join(comparison_lines(f"tiny: {recipe.label} ({time.perf_counter() - t:.0f} s)", est, m, W)))
        errors.append((recipe.label, peak_error(est, m)))
    return errors


def margin_part() -> None:
    """The planner's margin against what the CUDA allocator reserved in each reference run."""
    from course_utils.estimate.plan import CUDA_CONTEXT_GIB, MARGIN_FACTOR, MARGIN_GIB, margin_calibration

    rows = margin_calibration()
    print(f"\nThe planner's rule (estimate x {MARGIN_FACTOR} + {MARGIN_GIB} GiB, of which {CUDA_CONTEXT_GIB} GiB is "
          "for the CUDA context) against what CUDA reserved:\n")
    print(f"{'run':<58}{'estimate':>10}{'allocated':>11}{'reserved':>10}{'rule':>8}{'reserved/est':>14}")
    for c in rows:
        print(f"{c.model + ': ' + c.label:<58}{c.estimated / 2**30:10.2f}{c.allocated / 2**30:11.2f}"
              f"{c.reserved / 2**30:10.2f}{c.needed / 2**30:8.2f}{c.reserved / c.estimated:14.3f}"
              + ("" if c.covered else "  NOT COVERED"))
    worst = max(rows, key=lambda c: c.reserved / c.estimated)
    print(f"All {sum(c.covered for c in rows)} of {len(rows)} covered; the largest reserve over the estimate is "
          f"x{worst.reserved / worst.estimated:.3f} ({worst.label}, {worst.model}).")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu-only", action="store_true", help="only the shipped reference runs (no training)")
    parser.add_argument("--cpu-only", action="store_true", help="only the tiny model on this CPU")
    args = parser.parse_args()
    started = time.perf_counter()
    errors = []
    if not args.cpu_only:
        errors += gpu_part()
        margin_part()
    if not args.gpu_only:
        errors += cpu_part()
    worst = max(errors, key=lambda e: abs(e[1]))
    within = sum(abs(e) <= 10 for _, e in errors)
    print(f"\nPeak error over {len(errors)} runs: largest {worst[1]:+.2f}% ({worst[0]}); "
          f"{within} of {len(errors)} within 10%. ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
