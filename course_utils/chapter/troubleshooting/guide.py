"""The troubleshooting guide (TROUBLESHOOTING.md): the errors learners meet, each with the exact message and the fix.

Data and rendering. An Entry quotes messages, each from a source (course_utils.trouble_sources) that
tests/test_troubleshooting.py checks, so a quoted message is the real one:

  Produced(when, produce, origin)         produce() makes it with the course's own code, as the learner sees it
                                          (course_utils.trouble_sources); `elide` shows what varies as "…"
  Library(when, package, file, pieces)    each piece occurs in that file of the installed package, as raised there
  Logged(when, notebook, variant, label)  a run's error in the shipped T4 check (course_utils/reference/t4/)

An Entry's `evidence` (Library checks) backs what its prose says a library does. The prose holds no typed figure:
`{{ ... }}` placeholders render through course_utils.facts, and tables come from the estimator and the planner.

    python -m course_utils.chapter.troubleshooting.guide            rewrite the block of TROUBLESHOOTING.md
    python -m course_utils.chapter.troubleshooting.guide --check    exit 1 when the block is stale
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from course_utils.chapter import facts
from course_utils.chapter.every_notebook import release_url
from course_utils.chapter.troubleshooting import sources as S
from course_utils.chapter.troubleshooting.sources import Library, Logged, Produced, TroubleshootingError, version_of
from course_utils.cli import main as cli_main
from course_utils.common import shipped

ROOT = shipped().parent  # a checkout: TROUBLESHOOTING.md and notebooks/ live beside the package
GUIDE = ROOT / "TROUBLESHOOTING.md"
BLOCK = "troubleshooting"
ALL = tuple(sorted(p.name[:2] for p in (ROOT / "notebooks").glob("*.ipynb")))  # each has the setup cell


Message = Produced | Library | Logged


@dataclass(frozen=True)
class Entry:
    """One problem: where learners meet it, what they see, why, the fix and `course` commands to run."""

    key: str
    title: str
    where: str
    messages: tuple[Message, ...]
    why: str
    fix: str
    commands: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()
    evidence: tuple[Library, ...] = ()
    extra: Callable[[], str] | None = None  # generated Markdown: tables from the estimator or the planner
    notebooks: tuple[str, ...] = ()  # the notebooks ("00" ... "08", or ALL) whose Markdown should link here

    @property
    def anchor(self) -> str:
        """The entry's heading anchor in the guide."""
        return slug(self.title)

    @property
    def prose(self) -> str:
        """The hand-written text, placeholders unrendered: what the figure rule (facts.unsourced) reads."""
        return "\n\n".join([self.title, self.where, self.why, self.fix] + [m.when for m in self.messages])

    def command_lines(self) -> tuple[str, ...]:
        """The `course` commands of the fix (some are generated from the recipe they describe)."""
        return self.commands() if callable(self.commands) else self.commands


# --- quoted library messages that producers and entries share -------------------------------------
TRANSFORMERS_GATED = Library(
    "transformers itself (your own `from_pretrained`) raises, with huggingface_hub's error after it:",
    "transformers", "utils/hub.py", ("You are trying to access a gated repo.\nMake sure to have access to it at ",),
    shown=f"OSError: You are trying to access a gated repo.\nMake sure to have access to it at "
          f"https://huggingface.co/{S.GATED_MODEL}.\n…",
    backing=("if isinstance(e, GatedRepoError):", "raise OSError("))
OOM_TRAINING = Logged("A step that outgrows the card (notebook 06's largest micro-batch, under the T4 profile):",
                      "06", "small", "micro_batch=8")


# --- the entries, in the order a learner meets them -----------------------------------------------
_SETUP = "the setup cell's own code (`course_utils.chapter.every_notebook.setup_cell`), run with pip faked"
ENTRIES: tuple[Entry, ...] = (
    Entry(
        "no-course", "`No module named 'course_utils'`: the setup cell has not run",
        "Colab, the first cell after the setup cell of any notebook (the one that imports `course_utils`).",
        (Produced("Its traceback ends with:", S.without_the_course,
                  "Python's import system, in an interpreter without the course "
                  "(`trouble_sources.without_the_course`)"),),
        why="Colab starts every session from its own image, without this course. The notebook's first code cell, "
            "the setup cell, installs it; a cell run before it, or a new session (a new runtime, or one Colab "
            "recycled while you were away) in which it was skipped, has nothing to import.",
        fix="Run the setup cell (the notebook's first code cell), wait for it to print what it installed (next "
            "entry), then run the notebook from the top. Outside Colab the setup cell does nothing: install the "
            "course once as README.md shows (`python -m pip install -e .` in a checkout).",
        notebooks=ALL),
    Entry(
        "restart", "Restart the runtime after the setup cell",
        "Colab, the output of every notebook's setup cell.",
        (Produced("When pip replaced a package the kernel had already imported, the setup cell ends with (names and "
                  "versions vary with Colab's image):", lambda: S.setup_cell_run(changed=True), _SETUP),
         Produced("Otherwise:", S.setup_cell_run, _SETUP)),
        why="A running kernel keeps every module it has imported in memory. When pip replaces one of them (the "
            "distributions named in brackets), the kernel goes on running the old version while the files on disk "
            "are the new one, and later imports mix the two. The setup cell holds Colab's own torch, numpy and "
            "ipywidgets as they are, so those are never the ones replaced. Skip the restart and nothing fails at "
            "once: a later cell fails inside one of the named packages, with an error that does not mention the "
            "course and differs from package to package, or runs on with the old version's behaviour. The notice is "
            "the message to act on.",
        fix="Runtime > Restart session, then run the notebook from the cell after the setup cell, as the notice says: "
            "the installed packages stay, only the kernel's memory is cleared. If a cell failed strangely after a "
            "notice you skipped, restart and run from the cell after the setup cell again.",
        notebooks=ALL),
    Entry(
        "pip-failed", "`pip failed` in the setup cell",
        "Colab, the setup cell.",
        (Produced("The setup cell shows pip's lines as pip runs; when pip fails it prints pip's own error lines "
                  "again (from its first line that starts with `error`), then raises with the first of them:",
                  lambda: S.setup_cell_run(pip_returncode=1), _SETUP),),
        why="pip could not install the course at its release tag, and its error lines say why. The usual causes: the "
            "release tag is not on GitHub yet (git's `error: pathspec 'v…' did not match`: the course is not "
            "published at that tag, README.md \"Publishing the course\"); PyPI or GitHub did not answer; or the "
            "course's pins cannot be met together with the torch, numpy and ipywidgets Colab has (the cell keeps "
            "those, so that Colab's CUDA build of torch stays: `ERROR: Cannot install … conflicting dependencies`).",
        fix="Read pip's error lines under the cell's output. A missing tag: the course is not published at that tag "
            "yet (README.md, \"Publishing the course\"); until it is, run the notebooks locally (README.md's first "
            "command). A network error: run the cell again. A conflict: report it, with those lines, on the course "
            "repository's issues page.",
        notebooks=ALL),
    Entry(
        "gated", "A gated model: 401, the licence and `HF_TOKEN`",
        "Any notebook or `course run` with `MODEL` (or `--model`) set to a gated hub model such as Meta's Llama "
        "models. The notebooks' own choices are not gated: a small open model, or `USE_LLAMA_8B = True`, the "
        "Llama-3.1-8B shape with random weights.",
        (Produced("The course checks the model before it starts anything, and says:",
                  lambda: S.gated_error(TRANSFORMERS_GATED.shown),
                  "`course_utils.models.hub_error`, from the error transformers raises"),
         TRANSFORMERS_GATED,
         Library("huggingface_hub's part of it (the line after it is the hub's own words: not signed in, or signed in "
                 "without access):", "huggingface_hub", "utils/_http.py",
                 ("Client Error.", "Cannot access gated repo for url "),
                 shown=f"401 Client Error. …\n\nCannot access gated repo for url "
                       f"https://huggingface.co/{S.GATED_MODEL}/….",
                 backing=('elif error_code == "GatedRepo":',)),
         Library("On Colab, when a `HF_TOKEN` secret exists but this notebook was not given access to it:",
                 "huggingface_hub", "utils/_auth.py",
                 ("\nAccess to the secret `HF_TOKEN` has not been granted on this notebook.",
                  "\nYou will not be requested again.",
                  "\nPlease restart the session if you want to be prompted again."),
                 shown="UserWarning: \nAccess to the secret `HF_TOKEN` has not been granted on this notebook.\n"
                       "You will not be requested again.\n"
                       "Please restart the session if you want to be prompted again.")),
        why="A gated model's files go only to a signed-in account that has accepted its licence on the model's page: "
            "without a token the hub answers 401, and a token whose account has no access is refused too. On Colab "
            "huggingface_hub reads a `HF_TOKEN` secret by itself, but only inside the notebook's kernel (it looks for "
            "Colab's IPython shell). The course measures every recipe in a fresh Python process, which is not that "
            "kernel: the secret reaches the notebook's own check of the model, not the run, which takes the token from "
            "the environment.",
        fix="Open the model's page on huggingface.co with the account you will use, and accept the licence. Create a "
            "token with read access (Settings > Access Tokens). On Colab: the key icon in the left bar > add a secret "
            "`HF_TOKEN` with the token as its value, switch on its notebook access, and hand it to the course's "
            "processes in a cell before the model is used:\n\n```python\nimport os\nfrom google.colab import userdata\n"
            "os.environ[\"HF_TOKEN\"] = userdata.get(\"HF_TOKEN\")\n```\n\nElsewhere: `hf auth login`, or export "
            "`HF_TOKEN`. Or leave the download out: the preset `llama-3.1-8b` has the same shape with random weights, "
            "so the same memory and speed (not the same losses).",
        commands=("course estimate --model llama-3.1-8b --source --precision auto --hardware t4",),
        evidence=(Library("", "huggingface_hub", "utils/_runtime.py", ('"google.colab" in str(get_ipython())',)),
                  Library("", "huggingface_hub", "utils/_auth.py",
                          ('userdata.get("HF_TOKEN")', "_get_token_from_environment()")),
                  Library("", "course_utils", "launch.py", ("env = dict(os.environ,",))),
        notebooks=("00", "07")),
    Entry(
        "hub", "The hub does not answer",
        "A GPU notebook's choice of model, and any hub id given as `MODEL` or `--model`.",
        (Produced("A GPU notebook whose kernel cannot reach huggingface.co prints this, and goes on:",
                  S.hub_unreachable_notice, "`course_utils.chapter.every_notebook.choose_model`"),
         Produced("A hub id that is neither a local folder nor in the hub cache, offline:", S.hub_offline_error,
                  "`course_utils.models.load_config`"),
         Produced("A hub that accepts the connection, then does not answer within the course's deadline:",
                  S.hub_silent_error, "`course_utils.models._with_deadline`", elide=(r"within (\d+) s",))),
        why="The course asks the hub once, with a deadline, instead of waiting through the libraries' retries. A "
            "notebook then falls back to the same architecture with random weights (the same memory and speed, losses "
            "that mean nothing); a recipe that names a hub id stops with one line before any process starts.",
        fix="Check the connection (on Colab, the runtime's). `course env` says whether huggingface.co answers. Set "
            "`HF_HUB_OFFLINE=1` to use the embedded default without waiting; give a slow hub more time with "
            "`COURSE_HUB_TIMEOUT` (seconds); or download the model once and give its local folder as the model.",
        commands=("course env",),
        notebooks=("00",)),
    Entry(
        "gpu-preset", "A GPU preset on a CPU",
        "`USE_LLAMA_8B = True`, or `course run --model llama-3.1-8b`, on a machine without CUDA (Colab's default "
        "runtime has no GPU).",
        (Produced("A notebook says this, and goes on with the embedded tiny model:", S.llama_on_cpu_notice,
                  "`course_utils.chapter.every_notebook.choose_model`"),
         Produced("A recipe is refused before anything starts:", S.gpu_preset_on_cpu,
                  "`course_utils.checks.check_machine`")),
        why="A preset has a real model's shape with random weights, and an 8B model trained in fp32 on a CPU takes "
            "hours per step.",
        fix="On Colab: Runtime > Change runtime type > T4 GPU, then run the setup cell again (a new runtime is a new "
            "machine). Without a GPU the estimator and the planner still show the preset's memory.",
        commands=("course estimate --model llama-3.1-8b --hardware t4",
                  "course plan --model llama-3.1-8b --hardware t4"),
        notebooks=("00", "01", "02", "03", "04", "05")),
    Entry(
        "bf16", "bf16 on a T4",
        "Notebook 04 (mixed precision), and any recipe with `precision='bf16'` on Colab's free T4.",
        (Produced("The course refuses it before anything starts:", S.bf16_on_a_t4,
                  "`course_utils.machine.resolve_precision`, with the course's view of the machine set to a T4"),
         Produced("and so does the estimator, anywhere:",
                  lambda: S.cli_error(cli_main, "estimate", "--model", "llama-3.1-8b", "--precision", "bf16",
                                      "--hardware", "t4"),
                  "`course estimate --model llama-3.1-8b --precision bf16 --hardware t4`"),
         Library("transformers' `TrainingArguments(bf16=True)` raises this where torch says the GPU has no bf16 "
                 "at all:", "transformers", "training_args.py",
                 ("Your setup doesn't support bf16/gpu. You need to assign use_cpu if you want to train the model "
                  "on CPU.", " You need Ampere+ GPU with cuda>=11.0."),
                 shown="ValueError: Your setup doesn't support bf16/gpu. You need to assign use_cpu if you want to "
                       "train the model on CPU. You need Ampere+ GPU with cuda>=11.0.",
                 backing=("not is_torch_bf16_gpu_available()", "raise ValueError(error_message)"))),
        why="Native bf16 needs the tensor cores NVIDIA GPUs have from compute capability 8.0 (Ampere) on; a T4 has "
            "fp16 tensor cores. transformers asks torch, and torch counts emulation as support: "
            "`is_bf16_supported()` is true wherever a bf16 tensor can be made on the GPU. So on a T4 transformers may "
            "take `bf16=True` and train on emulated bf16 instead of refusing. The course reads the compute "
            "capability, and refuses.",
        fix="Use `precision='auto'`: fp16 mixed precision on a T4, bf16 where the GPU has it, fp32 on a CPU. In your "
            "own `SFTConfig` (or `TrainingArguments`), `bf16=False, fp16=True` on a T4 (say both: `SFTConfig()` turns "
            "bf16 on by default), and with 4-bit loading `bnb_4bit_compute_dtype=torch.float16`. With a 4-bit model "
            "and `SFTTrainer`, also put the adapters back in fp32 after the trainer is built, or the loss scaler stops "
            "at the first step (next entry). `course env` prints what `auto` resolves to on the machine in front of "
            "you.",
        commands=("course env", "course estimate --model llama-3.1-8b --source --precision auto --hardware t4"),
        evidence=(Library("", "torch", "cuda/__init__.py", ("def is_bf16_supported(including_emulation: bool = True):",
                                                           "torch.tensor([1.0], dtype=torch.bfloat16, device=device)")),
                  Library("", "transformers", "utils/import_utils.py", ("return torch.cuda.is_bf16_supported()",)),
                  Library("", "course_utils", "machine.py", ("return cc >= (8, 0)",))),
        notebooks=("04", "07")),
    Entry(
        "fp16-bf16-adapters", "`\"_amp_foreach_non_finite_check_and_unscale_cuda\" not implemented for 'BFloat16'`",
        "Your own QLoRA script on a GPU without bf16 (Colab's free T4): a 4-bit model, `SFTTrainer` and `fp16=True`. "
        "Notebook 07's script shows the fix.",
        (Library("The first optimizer step (after the first `gradient_accumulation_steps` micro-batches) stops in "
                 "the loss scaler's unscaling, with an error from torch's CUDA kernel:", "torch", "amp/grad_scaler.py",
                 ("_amp_foreach_non_finite_check_and_unscale_",),
                 shown="RuntimeError: \"_amp_foreach_non_finite_check_and_unscale_cuda\" not implemented for "
                       "'BFloat16'",
                 backing=("torch._amp_foreach_non_finite_check_and_unscale_(",)),),
        why="On a quantized model trl's `SFTTrainer` casts every trainable parameter (the LoRA adapters) to bf16, as "
            "the QLoRA paper does, whatever `bf16` and `fp16` say. `fp16=True` makes the Trainer scale the loss with "
            "a `GradScaler`, which unscales the gradients before the optimizer steps; its CUDA kernel has no bf16 "
            "version, and the adapters' gradients are bf16. (It refuses fp16 gradients too: fp16 mixed precision "
            "wants fp32 trainable weights and fp16 compute.) bf16 training needs no loss scaler, so where the GPU has "
            "bf16 the cast does no harm. The message comes from the GPU kernel, so a CPU run never shows it.",
        fix="After `SFTTrainer(...)` is built and before `trainer.train()`, put the trainable parameters back in "
            "fp32, as notebook 07's script does:\n\n```python\nfor p in trainer.model.parameters():\n"
            "    if p.requires_grad:\n        p.data = p.data.float()\n```\n\nThe adapters are small, so fp32 costs "
            "little. Where the GPU has bf16 (compute capability 8.0 or later), train with `bf16=True` instead and "
            "keep trl's cast. `course env` says which the machine in front of you has.",
        commands=("course env",),
        evidence=(Library("", "trl", "trainer/sft_trainer.py",
                          ("if _is_quantized_model:", "param.data = param.data.to(torch.bfloat16)")),
                  Library("", "torch", "amp/grad_scaler.py", ('raise ValueError("Attempting to unscale FP16 gradients.")',))),
        notebooks=("05", "07")),
    Entry(
        "bitsandbytes", "bitsandbytes without CUDA",
        "Notebooks 03 and 05 (8-bit optimizers, 4-bit weights) on a machine without CUDA, or on a GPU whose CUDA "
        "version bitsandbytes has no library for.",
        (Produced("Without CUDA, `course env` says:", S.bnb_env_line,
                  "`course_utils.machine.bitsandbytes_status`, in `course env` on a CPU"),
         Library("and a paged optimizer warns once (the course hides this warning; the run is simply unpaged):",
                 "bitsandbytes", "optim/optimizer.py",
                 ("Paged optimizers are not supported on CPU. Falling back to non-paged optimizer behavior.",),
                 shown="UserWarning: Paged optimizers are not supported on CPU. Falling back to non-paged optimizer "
                       "behavior."),
         Library("Where something asks bitsandbytes' CPU-only library for a function only its GPU libraries have "
                 "(the course's recipes do not), it says:", "bitsandbytes", "cextension.py",
                 ("not available in CPU-only version of bitsandbytes.\n",
                  "Reinstall with GPU support or use CUDA-enabled hardware."),
                 shown="RuntimeError: Method '…' not available in CPU-only version of bitsandbytes.\n"
                       "Reinstall with GPU support or use CUDA-enabled hardware.", backing=("Method '{name}' ",)),
         Library("On a GPU whose CUDA library bitsandbytes cannot load, it imports, then fails at the first 4-bit load "
                 "or 8-bit step, with a long explanation that holds:", "bitsandbytes", "cextension.py",
                 ("Attempted to use bitsandbytes native library functionality but it's not available.",),
                 shown="RuntimeError: …\nAttempted to use bitsandbytes native library functionality but it's not "
                       "available.\n…", backing=("Native code method attempted to call: lib.{name}()",)),
         Produced("Where bitsandbytes does not import at all, the course says, before anything starts:",
                  S.bnb_missing_error, "`course_utils.checks.check_hardware`",
                  elide=(r"does not import here \((.*?)\)\. Install",))),
        why="The bitsandbytes this course installs has a CPU backend: without CUDA it imports, loads 4-bit NF4 weights "
            "and steps 8-bit AdamW on the CPU (slowly). Only paging, which moves optimizer state between GPU and CPU "
            "memory, has nothing to do there. The old warning tutorials still show, `The installed version of "
            "bitsandbytes was compiled without GPU support`, is gone from it. On a GPU it loads the library built for "
            "torch's CUDA version, and says so only at first use when it cannot.",
        fix="On a CPU nothing needs fixing: 4-bit and 8-bit recipes run there. On a GPU with the native-library error, "
            "run `python -m bitsandbytes` (its diagnostics, as its message says) and compare torch's CUDA version with "
            "the builds bitsandbytes ships, listed below: torch built for another CUDA needs a bitsandbytes built for "
            "it. Where bitsandbytes does not import, `course env` shows why; reinstall it, or use "
            "`load_in_4bit=False` and `optimizer='adamw_torch'`.",
        commands=("course env",),
        extra=lambda: (f"bitsandbytes {version_of('bitsandbytes')} ships CUDA libraries for CUDA "
                       f"{S.bnb_cuda_builds()}; "
                       "`python -c \"import torch; print(torch.version.cuda)\"` prints torch's."),
        evidence=(Library("", "bitsandbytes", "", ("compiled without GPU support",), present=False),
                  Library("", "bitsandbytes", "cextension.py", ("only when a native method is called",))),
        notebooks=("03", "05")),
    Entry(
        "oom", "CUDA out of memory on a T4",
        "Colab's free T4: notebook 06's sweeps (the longer sequences and larger micro-batches), the runs without "
        "4-bit weights of the other notebooks with `USE_LLAMA_8B = True` (the course reports each as `does not fit` "
        "and goes on), and your own `Trainer`.",
        (OOM_TRAINING,
         Logged("A model whose weights alone do not fit (Llama-3.1-8B in fp32, `USE_LLAMA_8B = True`), while loading:",
                "00", "llama-8b", "baseline (LoRA, fp32)")),
        why="The rest of each message names the card's total and free memory and what PyTorch holds; the shipped log "
            "was made under the T4 profile on a bigger GPU, so its totals are that GPU's and only its cap (`… "
            "allowed`) is the T4's. The step needs more than the card has, and what needs the most is what to turn "
            "down first: the estimator says what that is for your recipe, term by term, without a GPU.",
        fix="Estimate your recipe on a T4 (`course estimate`, with your recipe's flags and `--hardware t4`) and change "
            "what holds its peak; the planner lists what fits the card, fastest first. In your own notebook code the "
            "kernel keeps what the failed step still references: restart the runtime, or delete the model and the "
            "trainer and call `course_utils.machine.release_memory()`, which returns the bytes still held. The course "
            "measures every recipe in a fresh process, so one that does not fit leaves nothing behind.",
        commands=lambda: S.oom_commands(OOM_TRAINING.run().recipe_obj),
        extra=lambda: S.oom_extra(OOM_TRAINING.run()),
        notebooks=("06", "07", "08", "09")),
    Entry(
        "reentrant", "`element 0 of tensors does not require grad and does not have a grad_fn`",
        "Your own training loop or `Trainer`, with LoRA and reentrant gradient checkpointing "
        "(`use_reentrant=True`). Notebook 01 shows it on purpose.",
        (Produced("The first `loss.backward()` (a `Trainer` calls it) stops with:", S.reentrant_error,
                  "`course_utils.chapter.gradient_checkpointing.lora_grads_under_checkpointing('tiny', use_reentrant=True, input_grads=False)`: "
                  "one forward and backward of the tiny model"),
         Library("Before it, on the forward pass, torch warns:", "torch", "utils/checkpoint.py",
                 ("None of the inputs have requires_grad=True. Gradients will be None",),
                 shown="UserWarning: None of the inputs have requires_grad=True. Gradients will be None")),
        why="Reentrant checkpointing builds a backward graph for a checkpointed layer only if one of the layer's "
            "inputs requires a gradient. With LoRA the base model is frozen, so nothing entering the first layer "
            "does: no gradient reaches the LoRA weights inside the layers, and the loss has no graph at all. "
            "transformers turns input gradients on whenever checkpointing is enabled through it, and picks the "
            "non-reentrant kind unless told otherwise; you meet this error when checkpointing is switched on some "
            "other way with `use_reentrant=True`, or input gradients are switched off.",
        fix="Use `use_reentrant=False`, as the course does: `activation_checkpointing=True, "
            "activation_checkpointing_kwargs={\"use_reentrant\": False}` in `SFTConfig` (or `TrainingArguments`; "
            "transformers 5 still takes the old names `gradient_checkpointing` and `gradient_checkpointing_kwargs`, "
            "with a FutureWarning), or the same keyword argument to `model.activation_checkpointing_enable`. To keep "
            "the reentrant kind, call `model.enable_input_require_grads()` before training.",
        evidence=(Library("", "transformers", "modeling_utils.py",
                          ('activation_checkpointing_kwargs = {"use_reentrant": False}',
                           "self.enable_input_require_grads()")),
                  Library("", "transformers", "training_args.py", ("activation_checkpointing_kwargs",
                                                                   "gradient_checkpointing_kwargs"))),
        notebooks=("01",)),
    Entry(
        "data", "A micro-batch the shipped data cannot fill",
        "Sweeps and exercises that raise `micro_batch` or `max_seq_length` on the embedded default or a preset "
        "(notebook 06).",
        (Produced("The course refuses the recipe before any process starts:", S.data_error,
                  "`course_utils.checks.check_data`"),),
        why="The embedded default and the presets train on the shipped instruction records, packed into sequences of "
            "`max_seq_length` tokens. A step takes `micro_batch` of them; with fewer, the run would train a smaller "
            "batch than it records.",
        fix="Use a micro-batch within what the message names, or a shorter sequence. To keep the effective batch, "
            "accumulate: the same sequences per optimizer step, and the same gradients (notebook 02).",
        commands=S.data_commands,
        notebooks=("02", "06")),
    Entry(
        "positions", "A sequence longer than the model's positions",
        "`max_seq_length` (or `--seq`) beyond the model's `max_position_embeddings`.",
        (Produced("`course estimate`, `course plan`, `course run` and the notebooks refuse it up front:",
                  lambda: S.positions_error(cli_main),
                  "`course_utils.checks.check_positions`, through `course estimate`"),),
        why="A model's config says how many positions it takes (`max_position_embeddings`); the course refuses more "
            "rather than train on positions the model was not built for.",
        fix="Use a `max_seq_length` within what the message names. A longer context is a property of the model: "
            "choose one whose config allows it.",
        commands=S.positions_commands,
        notebooks=("06",)),
)


# --- rendering ------------------------------------------------------------------------------------
def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def entry(key: str) -> Entry:
    """The entry with this key; a KeyError naming the keys otherwise."""
    found = [e for e in ENTRIES if e.key == key]
    if not found:
        raise KeyError(f"no troubleshooting entry {key!r}; there are: {[e.key for e in ENTRIES]}")
    return found[0]


def link(key: str) -> str:
    """The address of an entry at this release, for a notebook's Markdown (GitHub renders the guide)."""

    return release_url(GUIDE.name, entry(key).anchor)


def links_by_notebook() -> dict[str, list[str]]:
    """For each notebook ("00" ... "08"), the addresses of the entries its Markdown should link to."""
    out: dict[str, list[str]] = {}
    for e in ENTRIES:
        for nb in e.notebooks:
            out.setdefault(nb, []).append(link(e.key))
    return dict(sorted(out.items()))


def render_entry(e: Entry) -> str:
    """One entry as Markdown."""
    parts = [f"## {e.title}", "", facts.render(e.where), ""]
    for m in e.messages:
        parts += [facts.render(m.when), "", "```text", m.text(), "```", f"<sub>{m.cite()}</sub>", ""]
    parts += [f"**Why.** {facts.render(e.why)}", "", f"**Fix.** {facts.render(e.fix)}", ""]
    if e.extra is not None:
        parts += [e.extra(), ""]
    if e.command_lines():
        parts += ["```bash", *e.command_lines(), "```", ""]
    if e.evidence:
        parts += ["<sub>Checked against " + "; ".join(x.cite() for x in e.evidence) + ".</sub>", ""]
    return "\n".join(parts).rstrip() + "\n"


@functools.lru_cache(maxsize=None)
def render() -> str:
    """The guide's block: a list of the entries, then each of them."""
    toc = [f"- [{e.title}](#{e.anchor})" for e in ENTRIES]
    return "\n".join(toc) + "\n\n" + "\n".join(render_entry(e) for e in ENTRIES).rstrip()


def _block(text: str) -> re.Match:
    """The guide's marker block in `text` (group 1: what stands between the markers)."""
    found = re.search(rf"<!-- {BLOCK} -->\n(.*?)\n?<!-- /{BLOCK} -->", text, re.S)
    if found is None:
        raise TroubleshootingError(f"{GUIDE.name} has no `<!-- {BLOCK} -->` ... `<!-- /{BLOCK} -->` block")
    return found


def block_of(text: str) -> str:
    """What stands between the guide's marker comments."""
    return _block(text).group(1)


def write(path: Path = GUIDE) -> bool:
    """Put the rendering between the markers of `path`; True when that changed it."""
    text = path.read_text(encoding="utf-8")
    found, new = _block(text), render()
    if found.group(1) == new:
        return False
    path.write_text(text[:found.start()] + f"<!-- {BLOCK} -->\n{new}\n<!-- /{BLOCK} -->" + text[found.end():],
                    encoding="utf-8")
    return True


def main(argv: list[str]) -> int:
    """`--check`: 1 when TROUBLESHOOTING.md's block differs from the rendering; else rewrite it."""
    if "--check" in argv:
        stale = block_of(GUIDE.read_text(encoding="utf-8")) != render()
        print(f"{GUIDE.name}: " + ("stale, run python -m course_utils.chapter.troubleshooting.guide" if stale else "up to date"))
        return 1 if stale else 0
    print(f"{GUIDE.name}: " + ("rewritten" if write() else "already up to date"))
    return 0


def notebook_markdown(nb: str) -> str:
    """The Markdown cell a notebook ("00" ... "08") carries near its top: the guide's entries for the trouble
    learners meet in it, linked (`scripts/notebooks/write_notebooks.py troubleshooting` writes it; a test keeps it equal to this)."""
    found = [e for e in ENTRIES if nb in e.notebooks]
    items = "\n".join(f"- [{e.title}]({link(e.key)})" for e in found)
    return f"**If a cell fails**, the troubleshooting guide has the message you see and its fix:\n{items}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
