"""What the chapter notebooks share: which model to use here, the base recipe for this hardware,
the shipped GPU reference points, the figures every notebook ends with, and the learner's prediction before a run.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
import os
import sys
from string import Template

from course_utils import build, machine
from course_utils.checks import check_hardware
from course_utils.common import GiB, MiB, __version__
from course_utils.estimate import comparison_header, comparison_lines, estimate, lora_shapes
from course_utils.machine import apply_profile, release_memory
from course_utils.models import no_progress_bars, resolve_model
from course_utils.recipe import Recipe, base_recipe_for
from course_utils.results import reference_results
from course_utils.show.plots import technique_figure as figure
from course_utils.show.report import not_measured
from course_utils.show.tables import wrap, wrap_parts

def releases_memory(fn):
    """Run fn, then give the GPU memory its models held back to the card."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            release_memory()

    return wrapper


def skeleton(model: str, dtype=None):
    """The model on the meta device: every shape and dtype, no memory (fp32 unless told)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM


    config = AutoConfig.from_pretrained(resolve_model(model))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)


def needs_4bit_here(model: str) -> bool:
    """True when the model's fp32 weights (and as much again for one step) do not fit what this
    process may use: a demonstration then loads it in 4-bit NF4 instead, and says so."""

    weights = sum(p.numel() for p in skeleton(model).parameters()) * 4
    needed = 1.2 * weights
    if needed <= machine.available_bytes():
        return False
    print(wrap(f"({model} in fp32 needs about {needed / GiB:.1f} GiB, more than this card leaves this process "
               f"({machine.available_bytes() / GiB:.1f} GiB): this demonstration loads it in 4-bit NF4 instead.)"))
    return True


def _paged_all_linear(recipe, s, least: int) -> str:
    """paging()'s line for LoRA on every linear layer of a block (target_modules="all-linear", as the HF LLM
    course and Unsloth's notebooks adapt): the MLP's wide side puts some adapters above the threshold."""

    every = recipe.with_(lora_targets=tuple(name for name, _, _ in s.layer_linears))
    lora = [n for _, i, o in lora_shapes(every, s) for n in (every.lora_r * i, every.lora_r * o)] * s.layers
    return (f"  LoRA r={every.lora_r} on every linear layer (MLP too): {len(lora)} tensors of {min(lora):,} to "
            f"{max(lora):,} elements: {sum(n >= least for n in lora)} paged")


def load_for_inspection(model: str, load_in_4bit: bool, double_quant: bool = True, precision: str = "fp32"):
    """Notebooks 00, 01, 02 and 05: load a model as a recipe would (quantization included), without LoRA
    or a trainer."""

    recipe = Recipe(model=model, load_in_4bit=load_in_4bit, double_quant=double_quant, precision=precision)
    with no_progress_bars():  # a second-long load: no bar in a notebook's checked output
        loaded, _ = build.load_model(recipe, check_hardware(recipe))
    return loaded

# The one place the repository's address lives: `write_notebooks.py setup` writes it into every
# notebook's "Open in Colab" badge and Colab setup cell. Both name the release tag RELEASE_TAG, a fixed
# version, not a moving branch: the badge opens the release's notebook and the setup cell installs the
# release's course_utils, so a learner never runs a notebook from main against an older package.
REPOSITORY = "github.com/llm-course/memory-efficient-training"
RELEASE_TAG = f"v{__version__}"  # from the one version number, course_utils.__version__

# Every notebook's first code cell, written by `write_notebooks.py setup` (its --check fails on a stale
# one). It imports nothing heavy: torch and the course are not importable before it has run. It fits one
# screen (at most 25 lines of at most 100 characters), and Colab shows it folded to its #@title line
# (SETUP_CELL_METADATA: Colab's "form" view).
# On Colab it installs the course at RELEASE_TAG with a pip constraints file that pins Colab's own
# torch, numpy and ipywidgets to the versions installed, so pip cannot replace them; it prints pip's
# output line by line while pip runs (its progress); when pip fails, it prints pip's own error lines
# again, from its first `error` line, and raises with the first of them (no guessed cause); and it says
# whether the runtime needs a restart: it does when pip changed a distribution whose module this
# kernel has already imported.
SETUP_CELL = Template(r"""#@title Setup: on Colab, install the course (release $tag); elsewhere this cell does nothing
# It keeps Colab's torch, numpy and ipywidgets as they are (a pip constraint); README.md says more.
import os, subprocess, sys, tempfile
from importlib import metadata as md
if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ:
    url = "$install_url"
    have = lambda: {str(d.metadata["Name"]).lower(): d.version for d in [*md.distributions()][::-1]}
    before = have()
    keep = [f"{n}=={before[n]}" for n in ("torch", "numpy", "ipywidgets") if n in before]
    with tempfile.NamedTemporaryFile("w", suffix="-constraints.txt", delete=False) as constraints:
        constraints.write("\n".join(keep) + "\n")
    pip = subprocess.Popen([sys.executable, "-m", "pip", "install", "-c", constraints.name,
                            f"memory-efficient-training[colab] @ {url}"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = [print(line, end="") or line.strip() for line in pip.stdout]  # pip's progress, live
    if pip.wait():
        out = out[next((i for i, s in enumerate(out) if s[:5].lower() == "error"), -9):] or [""]
        print("\npip's own error lines:", *out, sep="\n")
        raise RuntimeError(f"pip failed (exit {pip.returncode}): {out[0]} (see pip's lines above)")
    changed = {n for n, v in have().items() if before.get(n) != v}
    stale = sorted({d for m, ds in md.packages_distributions().items() if m in sys.modules
                    for d in ds if d.lower() in changed})
    note = (".\nRestart the runtime (Runtime > Restart session), then run the notebook from "
            f"the next cell ({', '.join(stale)} changed).") if stale else "; no restart needed."
    print(f"installed memory-efficient-training $tag, keeping {', '.join(keep)}" + note)""")
SETUP_CELL_METADATA = {"cellView": "form"}  # Colab folds the cell to its #@title line
# Every notebook's metadata asks Colab for a GPU runtime, a T4 (the free one), as Unsloth's notebooks do;
# without it Colab opens a CPU runtime. `write_notebooks.py setup` writes it.
COLAB_METADATA = {"accelerator": "GPU", "colab": {"gpuType": "T4", "provenance": []}}


def install_url() -> str:
    """What the Colab setup cell pip-installs: this repository at its release tag."""
    return f"git+https://{REPOSITORY}@{RELEASE_TAG}"


def setup_cell() -> str:
    """The source of every notebook's Colab setup cell (its first code cell)."""
    return SETUP_CELL.substitute(install_url=install_url(), tag=RELEASE_TAG)

SMALL_HUB_MODEL = "HuggingFaceTB/SmolLM2-360M"  # ungated, Llama architecture, fits a free T4 easily
SMALL_PRESET = "smollm2-360m"  # its shape with random weights (models.PRESETS), when the hub cannot be reached
REFERENCE_MODEL = "llama-3.1-8b"


def release_url(path: str, anchor: str = "") -> str:
    """A file of this repository as GitHub shows it at the release tag (the glossary's and the troubleshooting
    guide's links), with `#anchor` when one is given."""
    return f"https://{REPOSITORY}/blob/{RELEASE_TAG}/{path}" + (f"#{anchor}" if anchor else "")


def colab_url(notebook_path: str) -> str:
    """The Colab address of a notebook of this repository, e.g. notebooks/01_x.ipynb."""
    return f"https://colab.research.google.com/{REPOSITORY.replace('github.com', 'github')}/blob/{RELEASE_TAG}/{notebook_path}"


def choose_model(use_llama_8b: bool = False) -> str:
    """The model for this machine: the embedded tiny model on a CPU; on a GPU a small ungated hub
    model (or, offline, its shape with random weights), or the Llama-3.1-8B architecture (random
    weights, no download) when asked. On a GPU it also applies the device profile, if one is set
    (COURSE_PROFILE=t4), to this notebook's own process."""
    from course_utils.data import hub_reachable

    if machine.device_type() == "cpu":
        if use_llama_8b:
            print("No GPU here: Llama-3.1-8B needs one, so this run uses the embedded tiny model.")
        return "tiny"
    note = apply_profile()
    if note:
        print(wrap(note))
    if use_llama_8b:
        return REFERENCE_MODEL
    if hub_reachable():
        return SMALL_HUB_MODEL
    print(wrap(f"The hub is not reachable, so {SMALL_HUB_MODEL} cannot be downloaded: using its architecture with "
               f"random weights ({SMALL_PRESET}); memory and speed are the same, the losses are not."))
    return SMALL_PRESET


def base_recipe(model: str) -> Recipe:
    """The chapter's starting point for this model and machine: plain LoRA, no memory technique yet.

    On a CPU: micro-batch 4 x 256 tokens, 6 steps (2 warm-up, 1 tracked, 3 timed), learning rate
    1e-3 (the tiny model has random weights; LoRA needs bigger steps to show learning quickly).
    On a GPU: micro-batch 4 x 512 tokens, the chapter's 2e-4: sized so a free T4 (machine.T4_CARD_GIB) holds
    the small hub model's baseline; on Llama-3.1-8B the fp32 baseline is expected not to fit.
    """

    return base_recipe_for(model, machine.device_type())


def reference_points(*labels: str, model: str = REFERENCE_MODEL) -> list:
    """Shipped GPU reference measurements of `model` with these labels, in the order given."""

    ref = {m.label: m for m in reference_results() if m.recipe.get("model") == model}
    missing = [label for label in labels if label not in ref]
    if missing:
        raise KeyError(f"no reference run labelled {missing}; available: {sorted(ref)}")
    return [ref[label] for label in labels]


def describe_reference(ms, prefix: str = "") -> str:
    """The provenance of reference points: GPU, driver, versions, and each measurement run shown (its id, date
    and command): ratios between points are only meaningful within one run. `prefix` starts the first line
    ("reference: "); lines are at most 100 characters, broken between its parts."""

    if not ms:
        return prefix + "no reference points"
    env = ms[0].env
    v = env["versions"]
    runs: dict[str, list] = {}
    for m in ms:
        runs.setdefault(m.run_id or f"{m.date[:10]}, {m.command}", []).append(m)
    shown = [f"run {key} ({group[0].date[:10]}, `{_base_command(group[0].command)}`)" if group[0].run_id
             else f"`{key}`" for key, group in runs.items()]
    versions = [f"torch {v['torch']}", f"transformers {v['transformers']}", f"peft {v['peft']}", f"trl {v['trl']}",
                f"bitsandbytes {v['bitsandbytes']}"] + ([f"liger-kernel {v['liger-kernel']}"] if "liger-kernel" in v else [])
    env_parts = [f"{env['device']} (driver {env.get('driver')}, CUDA {env.get('cuda')})"] + versions
    pieces = [p + "," for p in env_parts[:-1]] + [env_parts[-1] + ";"] + [p + ";" for p in shown[:-1]] + shown[-1:]
    return wrap_parts(pieces, " ", first=prefix)


def _base_command(command: str) -> str:
    """A reference run's command without the parts that split one run over several calls (--first, --only)."""
    import re

    return re.sub(r" --(?:first \S+|only '[^']*'|only \S+)", "", command).replace("/root/out/", "$OUT/")


def technique_figure(mine, reference=(), title: str = "Memory against speed, every technique so far"):
    """Your points (joined in the order you added the techniques) on the left and the shipped GPU reference
    points (if any) on the right, each panel on its own axes, its points named in a key under it
    (course_utils.show.plots). Returns the figure."""

    return figure([m for m in mine if m is not None], reference, title=title)


def estimate_for(recipe: Recipe):
    """The estimator's prediction for `recipe` on this kind of device (CPU, T4-class or bf16 GPU)."""

    hardware = "cpu" if machine.device_type() == "cpu" else ("gpu" if machine.bf16_supported() else "t4")
    return estimate(recipe.with_(label=recipe.label), hardware=hardware)


def estimate_vs_measured(measurements) -> str:
    """A table: for each measurement, estimated against measured MiB per category and at the peak."""

    lines = [comparison_header(34)]
    for m in measurements:
        lines += comparison_lines(m.label, estimate_for(m.recipe_obj), m, 34)
    return "\n".join(lines)


# --- predict, then measure (issue 30): notebooks 00-06 ---------------------------------------------------------
@dataclass(frozen=True)
class Prediction:
    """Notebooks 00-06: the learner's guess of what the next run will show, compared after the run with the
    measurement and with the course's estimator's figure (shown only then, so it does not give the answer away).

    unit "MiB": what one category (or the peak) falls from `before` to `after` (a saving, in MiB);
    unit "x": how many times it grows from `before` to `after`."""

    what: str  # e.g. "activations saved by checkpointing"
    category: str  # a Measurement category, or "peak"
    estimate: float  # the estimator's figure, in `unit`
    guess: float | None = None
    unit: str = "MiB"
    keys: tuple[str, ...] = ()  # the predicted recipes' keys: against() compares only the same recipes' runs

    def figure(self, before, after) -> float:
        """The figure this prediction is about, from two Estimates or two Measurements."""
        def mib(x) -> float:
            parts = x.peak_by_category if hasattr(x, "peak_by_category") else x.by_category
            return (x.peak_bytes if self.category == "peak" else parts.get(self.category, 0)) / MiB

        return mib(after) / mib(before) if self.unit == "x" else mib(before) - mib(after)

    def _fmt(self, value: float) -> str:
        return f"x{value:.2f}" if self.unit == "x" else f"{value:,.1f} MiB"

    def __str__(self) -> str:
        """Before the run: the guess only. The estimator's figure waits for the comparison after the run, so that
        it does not answer the question before the learner does."""
        if self.guess is None:
            return wrap(f"{self.what}: no guess yet (write one above and run this cell again); the estimator's "
                        "figure shows beside the measurement after the run.")
        return wrap(f"{self.what}: your guess {self._fmt(self.guess)}; after the run, the measurement and the "
                    "estimator's figure show beside it.")

    def against(self, before, after) -> str:
        """One line: the measured figure against the guess (or the estimate), from the two measurements."""
        skip = not_measured(before, after)
        if skip:
            return skip
        if self.keys and self.keys != (before.recipe_obj.key, after.recipe_obj.key):
            return wrap(f"{self.what}: the run measured other recipes than the prediction's ({before.label}, "
                        f"{after.label}), so there is nothing to compare.")
        got = self.figure(before, after)
        off = lambda x: f"{x - got:+,.2f}" if self.unit == "x" else f"{x - got:+,.1f} MiB"  # noqa: E731
        mine = "no guess" if self.guess is None else f"your guess {self._fmt(self.guess)} ({off(self.guess)})"
        return wrap(f"{self.what}: measured {self._fmt(got)}; {mine}; the estimator {self._fmt(self.estimate)} "
                    f"({off(self.estimate)}).")


def predict(guess, before: Recipe, after: Recipe, category: str, what: str, unit: str = "MiB") -> Prediction:
    """Notebooks 00-06, the cell before a run: the learner's `guess` (a number in `unit`, or None) and the
    estimator's figure for the same recipes (estimate_for), as a Prediction to print and to compare after it."""
    if guess is not None and (isinstance(guess, bool) or not isinstance(guess, (int, float))):
        raise ValueError(f"your guess should be a number ({'a factor' if unit == 'x' else 'MiB'}) or None, "
                         f"not {guess!r}")
    figure = Prediction(what, category, 0.0, unit=unit).figure(estimate_for(before), estimate_for(after))
    return Prediction(what, category, figure, None if guess is None else float(guess), unit, (before.key, after.key))
