"""Notebook 04 (notebooks/04_mixed_precision.ipynb, quizzes/04_mixed_precision.yaml): Mixed precision: fp32, bf16, fp16.

Its room in the package: what the notebook's cells import, what its exercise checks, and what other rooms or the README quote from it. The code the notebook teaches is in the notebook itself.
"""

from __future__ import annotations


from course_utils import machine
from course_utils.chapter.shipped_runs import _by_kind, tf32_reference, tf32_run  # noqa: F401
from course_utils.chapter.exercises import Exercise, Verdict, _est, _mib, _only, _try_est
from course_utils.common import GiB, MiB
from course_utils.machine import get_hardware
from course_utils.recipe import Recipe
from course_utils.results import Measurement
from course_utils.show.report import _joined, dated, not_measured
from course_utils.show.tables import wrap

# --- 04: a precision a free T4 runs ----------------------------------------------------------------------
def _fig_04(start: Recipe, hw: str) -> dict:
    cc = get_hardware("t4").compute_capability
    return {"fp32": _mib(_est(start.with_(precision="fp32"), hw).peak_bytes), "cc": ".".join(map(str, cc))}


def _check_04(answer: Recipe, start: Recipe, hw: str) -> Verdict:
    refused = _only(answer, start, {"precision"})
    if refused is not None:
        return refused
    e, why = _try_est(answer, hw)
    if e is None:
        return Verdict(False, f"the estimator refuses precision={answer.precision!r} on a T4", (why,))
    fp32 = _est(answer.with_(precision="fp32"), hw)
    holds = e.peak_bytes < fp32.peak_bytes
    return Verdict(holds, f"precision={answer.precision!r} runs as {e.precision} on a T4"
                   + (", with a lower peak than fp32" if holds else ", no lower than fp32"),
                   (f"estimated {_mib(e.peak_bytes)} MiB against fp32's {_mib(fp32.peak_bytes)} MiB (activations "
                    f"{_mib(e.by_category['activations'])} against {_mib(fp32.by_category['activations'])})",
                    "'auto' is the setting that travels: fp16 on a T4, bf16 on Ampere and later, fp32 on a CPU"))


def _solve_04(start: Recipe, hw: str) -> Recipe:
    return start.with_(precision="auto")
_T04 = ("A free Colab T4 (compute capability {cc}) has no native bf16. Change only the precision flags (`bf16`, "
        "`fp16`) so that the estimator accepts it for a T4 (`hardware=\"t4\"`) and estimates a **lower peak** "
        "there than fp32 does ({fp32} MiB). Try `bf16=True` first, and read why it is refused.")


def tf32_summary(runs: list | None = None) -> str:
    """Notebook 04: what TF32 did in the shipped run, every figure read from it: the same bytes as fp32 (TF32
    changes how a matmul multiplies, not what is stored), the speed against fp32 and bf16, the final losses;
    and whether this machine can use it (compute capability 8.0 or more)."""

    runs = tf32_reference() if runs is None else runs
    by = _by_kind(runs)
    fp32, tf32, bf16 = by["fp32"], by["tf32"], by["bf16"]
    if not len({m.run_id for m in (fp32, tf32, bf16)}) == 1:
        raise ValueError("the TF32 reference runs come from different measurement runs: their speeds do not compare")
    gib = lambda m: m.cuda_max_allocated / GiB  # noqa: E731
    same = ("the same bytes" if tf32.cuda_max_allocated == fp32.cuda_max_allocated
            else f"x{gib(tf32) / gib(fp32):.3f} of fp32's bytes")
    cc = machine.compute_capability()
    here = ("this machine has no CUDA GPU: TF32 is a GPU setting" if machine.device_type() != "cuda" else
            f"this GPU is compute capability {cc[0]}.{cc[1]}: " +
            ("it has TF32 (Recipe(tf32=True))" if cc >= (8, 0) else "no TF32 (it needs 8.0: Ampere or later)"))
    lines = [f"On {fp32.env['device']} ({fp32.date[:10]}, run {fp32.run_id}), LoRA on {fp32.recipe['model']}, "
             f"{fp32.recipe['micro_batch']}x{fp32.recipe['grad_accum']}, sequence {fp32.recipe['max_seq_length']}:",
             f"- fp32: {gib(fp32):.2f} GiB allocated at the peak, {fp32.tokens_per_s:,.0f} tokens/s, "
             f"final loss {fp32.losses[-1]:.3f}",
             f"- fp32 + TF32: {gib(tf32):.2f} GiB ({same}), {tf32.tokens_per_s:,.0f} tokens/s "
             f"(x{tf32.tokens_per_s / fp32.tokens_per_s:.2f} of fp32), final loss {tf32.losses[-1]:.3f}",
             f"- bf16: {gib(bf16):.2f} GiB (x{gib(bf16) / gib(fp32):.2f} of fp32), {bf16.tokens_per_s:,.0f} tokens/s "
             f"(x{bf16.tokens_per_s / fp32.tokens_per_s:.2f}), final loss {bf16.losses[-1]:.3f}",
             f"Here: {here}."]
    return wrap("\n".join(lines), indent="  ")


def closing_04(before: Measurement, after: Measurement, reference) -> str:
    """Notebook 04: what the 16-bit rung did to the parameters and the peak here (or that it was not
    measured: this machine runs fp32), and fp32 against bf16 on the reference GPU."""
    skip = not_measured(before, after)  # on a T4, an 8B model's fp32 rungs do not fit
    if not skip and after.precision != before.precision:
        skip = (f"On {after.env['device']}: {before.precision} -> {after.precision} took the parameters from "
                f"{before.mib('parameters'):.1f} to {after.mib('parameters'):.1f} MiB and the peak from "
                f"{before.mib('peak'):.1f} to {after.mib('peak'):.1f} MiB ({after.peak_bytes / before.peak_bytes - 1:+.0%}).")
        skip = dated(skip, before, after)  # figures read back from the store say so, with their date
    elif not skip:
        skip = f"On {after.env['device']} mixed precision was not measured: {after.precision} is what runs here."
    fp32, bf16 = reference
    return _joined(skip, f"Reference (Llama-3.1-8B LoRA, H200): fp32 {fp32.peak_gib:.1f} GiB at "
                   f"{fp32.tokens_per_s:,.0f} tokens/s, bf16 {bf16.peak_gib:.1f} GiB at {bf16.tokens_per_s:,.0f} "
                   f"tokens/s: {1 - bf16.peak_gib / fp32.peak_gib:.0%} less memory, "
                   f"{bf16.tokens_per_s / fp32.tokens_per_s:.1f}x the speed.")


# The notebook's exercise (course_utils.chapter.exercises shows and checks it)
EXERCISE = Exercise("04_mixed_precision", "a precision a free T4 runs", _T04, _fig_04, _check_04, _solve_04,
             "precision='auto': the estimator resolves it to fp16 for a T4", hardware="t4")

# The "In your own script" cells of the notebook (kind, the rung they write, the rung they are compared with, the cell
# they follow, what the markdown above them says): `scripts/notebooks/write_notebooks.py own-script` writes them.
OWN_SCRIPT = ("ladder", "+ mixed precision", "+ paged 8-bit AdamW", "04-09",
              "Mixed precision is the weights' `dtype` and `bf16=True` (on a T4, which has no bf16: "
              "`fp16=True`, with `dtype=torch.float16`).")
