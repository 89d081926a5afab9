"""Where the troubleshooting guide's messages come from (course_utils.troubleshooting quotes them): the three kinds
of source (Produced, Library, Logged); the producers, which make the course's own messages the way a learner meets
them (no training, seconds at most); and the guide's generated parts: what to turn down first on a T4, read from
the estimator and the planner.

Where a message depends on the machine (the device, the installed Colab image), the producer fixes the course's
view of it (course_utils.hardware's device functions, a faked pip), so the guide renders the same everywhere.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata as md
import io
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from unittest import mock

from course_utils import machine as hardware, models
from course_utils.chapter import t4
from course_utils.chapter.every_notebook import (SMALL_HUB_MODEL, choose_model, lora_grads_under_checkpointing,
                                               setup_cell)
from course_utils.chapter.t4 import VARIANTS, defect, record_for
from course_utils.checks import check_data, check_hardware, check_machine
from course_utils.cli_env import env_report
from course_utils.cli_recipe import FLAGS, estimate_base, flag_for
from course_utils.common import GiB, __version__
from course_utils.estimate.peak import estimate
from course_utils.estimate.plan import MARGIN_FACTOR, MARGIN_GIB, needed_bytes
from course_utils.estimate.planner import plan as planner_plan
from course_utils.machine import PROFILES, get_hardware, resolve_precision
from course_utils.models import TINY_CONFIG, _with_deadline, hub_error, shipped_token_count
from course_utils.recipe import Recipe

GATED_MODEL = "meta-llama/Llama-3.1-8B"  # a gated hub model (the chapter's); its shape ships as the preset llama-3.1-8b
T4_NAME = "Tesla T4"  # what torch.cuda.get_device_name says on Colab's T4
DATA_RECIPE = dict(model="tiny", micro_batch=64, max_seq_length=1024)  # a sweep asking more than the data holds


class TroubleshootingError(RuntimeError):
    """A message source that no longer gives its message: names what changed and how to re-render the guide."""


# --- where a message comes from ---------------------------------------------------------------
@dataclass(frozen=True)
class Produced:
    """A message the course's code makes: produce() returns it as the learner sees it."""

    when: str
    produce: Callable[[], str]
    origin: str
    elide: tuple[str, ...] = ()  # regexes of what varies by machine (their group 1, or all of it), shown as "…"

    @functools.cached_property
    def raw(self) -> str:
        """The message as produced (once per process: some producers build the tiny model)."""
        try:
            return self.produce()
        except TroubleshootingError:
            raise
        except Exception as exc:  # a producer that broke means a stale guide
            raise TroubleshootingError(f"{self.origin} no longer gives its message ({type(exc).__name__}: {exc}); "
                                       "update course_utils/chapter/troubleshooting/sources.py") from exc

    def text(self) -> str:
        """The message as the guide shows it: what varies elided."""
        shown = self.raw
        for pattern in self.elide:
            shown = re.sub(pattern, _elided, shown)
        return shown

    def cite(self) -> str:
        """Where it comes from, for the guide's small print."""
        return f"Made by {self.origin}."


@dataclass(frozen=True)
class Library:
    """Text in an installed package's source: every piece occurs in `file` as written there (`\\n` as in a
    string literal), and, for a quoted message, in `shown` too."""

    when: str
    package: str
    file: str  # inside the package's folder; "" with present=False
    pieces: tuple[str, ...]
    shown: str = ""  # as the learner sees it (what the library fills in typed, or "…"); "" for evidence only
    backing: tuple[str, ...] = ()  # more of the source the prose relies on (the raise, the condition)
    present: bool = True  # False: no .py file of the package says it any more (an old message tutorials show)

    def source(self) -> str:
        """The installed source the pieces are looked for in: `file`, or every .py file for present=False."""
        folder = package_folder(self.package)
        files = [folder / self.file] if self.present else sorted(folder.rglob("*.py"))
        return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)

    def text(self) -> str:
        """The message as the learner sees it."""
        return self.shown

    def cite(self) -> str:
        """The package, its installed version and the file, for the guide's small print."""
        if not self.present:
            return f"{self.package} {version_of(self.package)}, no file of which says `{self.pieces[0]}`"
        return f"{self.package} {version_of(self.package)}, `{self.package}/{self.file}`"


@dataclass(frozen=True)
class Logged:
    """A run's error in the shipped T4 check, to the end of its first `sentences` sentences, then "…"."""

    when: str
    notebook: str
    variant: str
    label: str
    sentences: int = 2

    def run(self):
        """The logged Measurement (t4.run_of: the newest record of that notebook and variant)."""
        return t4.run_of(self.notebook, self.label, self.variant)

    def text(self) -> str:
        """The run's error to the end of its first `sentences` sentences; what follows names that GPU's totals."""
        full = self.run().error
        ends = [m.start() + 1 for m in re.finditer(r"(?<=\S)\. (?=[A-Z])", full)]
        return full[:ends[self.sentences - 1]] + " …" if len(ends) >= self.sentences else full

    def cite(self) -> str:
        """The log, the notebook, the run and its device, for the guide's small print."""

        rec = record_for(self.notebook, self.variant)
        return (f"torch's CUDA allocator, logged by the shipped T4 check: notebook {self.notebook}, run "
                f"{self.label!r} ({self.run().env.get('device')}, {rec['run_id']}), "
                "`course_utils/reference/t4/t4-check.jsonl`.")


def _elided(m: re.Match) -> str:
    """An elide pattern's match with its group 1 (or all of it) as "…"."""
    if not m.re.groups:
        return "…"
    return m.group(0)[:m.start(1) - m.start()] + "…" + m.group(0)[m.end(1) - m.start():]


def version_of(package: str) -> str:
    """The installed version without its local part: torch's '+cpu' or '+cu128' would make the guide differ by
    machine."""
    try:
        return md.version(package).split("+")[0]
    except md.PackageNotFoundError:

        return __version__  # course_utils itself, from a checkout


def raised(call: Callable[[], object]) -> str:
    """'ExceptionName: message' of what call() raises: the last line of the traceback a learner sees."""
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    raise TroubleshootingError(f"{call} raised nothing; the guide expects an error there")


def printed(call: Callable[[], object]) -> str:
    """What call() prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        call()
    return out.getvalue().strip()


@contextlib.contextmanager
def on(device: str, capability: tuple[int, int] | None = None, name: str = "CPU"):
    """The course's view of the machine fixed: a CPU, or a GPU of this compute capability and name (torch itself
    is left as it is), without a device profile or COURSE_CPU_BIG_MODELS."""

    env = {k: v for k, v in os.environ.items() if k not in (hardware.PROFILE_ENV, "COURSE_CPU_BIG_MODELS")}
    with mock.patch.dict(os.environ, env, clear=True), \
            mock.patch.object(hardware, "device_type", lambda: device), \
            mock.patch.object(hardware, "compute_capability", lambda: capability), \
            mock.patch.object(hardware, "device_name", lambda: name):
        yield


def package_folder(package: str) -> Path:
    """An installed package's folder, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise TroubleshootingError(f"{package} is not installed here, and the guide quotes its source")
    return Path(list(spec.submodule_search_locations)[0])


# --- the Colab setup cell -------------------------------------------------------------------------
def setup_cell_run(pip_returncode: int = 0, changed: bool = False) -> str:
    """What the notebooks' setup cell (notebook.setup_cell) prints, or raises, on Colab: the cell's own code run
    here with pip faked. Colab's torch, numpy and ipywidgets versions, and the distribution pip changed
    (changed=True: one whose module the kernel has imported), show as '…': they vary with Colab's image."""
    import subprocess
    from types import SimpleNamespace


    state = {"torch": "…", "numpy": "…", "ipywidgets": "…", "…": "old"}

    def pip(cmd, **kwargs):  # stands in for subprocess.Popen: pip's answer, and the change it made
        Path(cmd[cmd.index("-c") + 1]).unlink(missing_ok=True)  # the constraints file the cell wrote
        if changed:
            state["…"] = "new"
        return SimpleNamespace(stdout=iter(["ERROR: …\n"] if pip_returncode else []),
                               wait=lambda: pip_returncode, returncode=pip_returncode)

    def distributions():  # stands in for importlib.metadata.distributions: this fake image
        return [SimpleNamespace(metadata={"Name": n}, version=v) for n, v in state.items()]

    out = io.StringIO()
    with mock.patch.dict(os.environ, {"COLAB_RELEASE_TAG": "…"}), mock.patch.object(subprocess, "Popen", pip), \
            mock.patch.object(md, "distributions", distributions), \
            mock.patch.object(md, "packages_distributions", lambda: {"json": ["…"]}), contextlib.redirect_stdout(out):
        try:
            exec(compile(setup_cell(), "<setup cell>", "exec"), {"__name__": "__main__"})  # noqa: S102 (our cell)
        except RuntimeError as exc:
            return f"RuntimeError: {exc}"
    return out.getvalue().strip()


def without_the_course() -> str:
    """The last line of a notebook's first course import where the course is not installed (a Colab kernel before
    the setup cell ran): a fresh interpreter without site-packages (-S) or the current folder (-I)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as empty:
        run = subprocess.run([sys.executable, "-S", "-I", "-c", "from course_utils.measure import run_ladder"],
                             cwd=empty, capture_output=True, text=True, timeout=120)
    return run.stderr.strip().splitlines()[-1]


# --- the hub --------------------------------------------------------------------------------------
def gated_error(transformers_error: str) -> str:
    """The course's error (models.hub_error) for the error transformers raises on a gated model."""

    exc = hub_error(GATED_MODEL, OSError(transformers_error))
    return f"{type(exc).__name__}: {exc}"


def hub_unreachable_notice() -> str:
    """What notebook.choose_model prints on a GPU when huggingface.co does not accept a connection."""
    from course_utils import data

    with on("cuda", (7, 5), T4_NAME), mock.patch.object(hardware, "apply_profile", lambda: None), \
            mock.patch.object(data, "hub_reachable", lambda timeout=2.0: False):
        return printed(choose_model)


def hub_offline_error() -> str:
    """models.load_config of a hub id that is not in the local hub cache, with HF_HUB_OFFLINE set."""

    with mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1"}), \
            mock.patch.object(models, "_in_hub_cache", lambda m: False):
        return raised(lambda: models.load_config(SMALL_HUB_MODEL))


def hub_silent_error() -> str:
    """models._with_deadline's error when the hub accepts the connection and never answers (a short deadline
    here: the guide elides the seconds)."""
    import threading


    answered = threading.Event()
    try:
        return raised(lambda: _with_deadline(f"the config of {SMALL_HUB_MODEL!r}", lambda: answered.wait(5), 0.05))
    finally:
        answered.set()


# --- the hardware ---------------------------------------------------------------------------------
def bf16_on_a_t4() -> str:
    """hardware.resolve_precision('bf16') on a T4 (the T4 profile's compute capability)."""

    with on("cuda", PROFILES["t4"].compute_capability, T4_NAME):
        return raised(lambda: resolve_precision("bf16"))


def cli_error(main: Callable, *argv: str) -> str:
    """What `course <argv>` writes to stderr: its one-line error (`main`: course_utils.cli.main, which the guide
    passes in, so that these sources stay below the CLI)."""

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        main(list(argv))
    return err.getvalue().strip()


def bnb_env_line() -> str:
    """The bitsandbytes line of `course env` on a machine without CUDA."""

    with on("cpu"), mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1"}):
        report, _ = env_report()
    return next(line for line in report.splitlines() if "through bitsandbytes" in line)


def bnb_missing_error() -> str:
    """build.check_hardware's error for a 4-bit recipe where bitsandbytes does not import."""

    with on("cpu"), mock.patch.dict(sys.modules, {"bitsandbytes": None}):
        return raised(lambda: check_hardware(Recipe(model="tiny", load_in_4bit=True)))


def bnb_cuda_builds() -> str:
    """The CUDA versions bitsandbytes ships libraries for, read from its installed files."""
    import re

    found = sorted((int(m.group(1)[:2]), int(m.group(1)[2:])) for p in package_folder("bitsandbytes").glob("*")
                   if (m := re.fullmatch(r"libbitsandbytes_cuda(\d{3})\.so", p.name)))
    return ", ".join(f"{a}.{b}" for a, b in found)


def gpu_preset_on_cpu() -> str:
    """checks.check_machine's error for the Llama-3.1-8B preset on a machine without CUDA."""

    with on("cpu"):
        return raised(lambda: check_machine(Recipe(model="llama-3.1-8b")))


def llama_on_cpu_notice() -> str:
    """What notebook.choose_model(use_llama_8b=True) prints on a machine without CUDA."""

    with on("cpu"):
        return printed(lambda: choose_model(True))


# --- training -------------------------------------------------------------------------------------
def reentrant_error() -> str:
    """loss.backward()'s error under reentrant checkpointing with LoRA and no input gradients (the tiny model)."""

    return lora_grads_under_checkpointing("tiny", use_reentrant=True, input_grads=False)[2]


def data_error() -> str:
    """checks.check_data's error for a micro-batch the shipped data cannot fill."""

    return raised(lambda: check_data(Recipe(**DATA_RECIPE)))


def positions_error(main: Callable) -> str:
    """`course estimate`'s error for a sequence twice as long as the tiny model's position table."""

    return cli_error(main, "estimate", "--model", "tiny", "--seq", str(2 * TINY_CONFIG["max_position_embeddings"]))


# --- generated parts: what to turn down, from the estimator and the planner -------------------------
def estimate_command(recipe, hardware: str = "t4") -> str:
    """The `course estimate` command for `recipe`: the CLI's own estimate flags (cli_recipe.FLAGS, derived from
    TECHNIQUES), each where the recipe differs from the CLI's plain LoRA base, spelled as the parser reads it."""

    base = estimate_base(recipe.model)
    flags = [f"--model {recipe.model}"]
    flags += [flag_for(name, getattr(recipe, name)) for name in FLAGS["estimate"]
              if getattr(recipe, name) != getattr(base, name)]
    return f"course estimate {' '.join(flags)} --hardware {hardware}"


def single_changes(recipe) -> list[tuple[str, object]]:
    """The recipe as it ran, then each one-knob change a learner can make (the effective batch kept)."""
    half = max(1, recipe.micro_batch // 2)
    accum = recipe.effective_batch // half
    return [("as it ran", recipe),
            ("gradient checkpointing on", recipe.with_(gradient_checkpointing=True)),
            (f"micro-batch {half}, {accum} accumulation steps", recipe.with_(micro_batch=half, grad_accum=accum)),
            ("precision auto (fp16 on a T4)", recipe.with_(precision="auto")),
            ("8-bit AdamW", recipe.with_(optimizer="adamw_8bit")),
            ("4-bit NF4 base weights", recipe.with_(load_in_4bit=True)),
            (f"sequence {recipe.max_seq_length // 2} (half the tokens of a step)",
             recipe.with_(max_seq_length=recipe.max_seq_length // 2))]


def turn_down_table(recipe, hardware: str = "t4") -> str:
    """Markdown: each single change's estimated peak, what the planner's rule needs for it, whether that fits."""

    hw = get_hardware(hardware)
    budget = int(hw.memory_gib * GiB)
    rows = [(name, estimate(r, hardware=hw)) for name, r in single_changes(recipe)]
    first = rows[0][1]
    share = first.by_category["activations"] / first.peak_bytes
    lines = [f"What the estimator says of that run (`{estimate_command(recipe, hardware)}`): activations are "
             f"{100 * share:.0f}% of its peak, so what shrinks them comes first. One change at a time; needed is "
             f"the planner's rule, peak x {MARGIN_FACTOR} + {MARGIN_GIB} GiB, against {budget / GiB:.2f} "
             "GiB:", "",
             "| change | estimated peak (GiB) | needed (GiB) | fits |", "|---|---:|---:|---|"]
    for name, e in rows:
        need = needed_bytes(e)
        lines.append(f"| {name} | {e.peak_bytes / GiB:.2f} | {need / GiB:.2f} | "
                     f"{'yes' if need <= budget else 'no'} |")
    return "\n".join(lines)


def plan_summary(model: str = "llama-3.1-8b", hardware: str = "t4") -> str:
    """One sentence from the planner: how many candidates fit the card, how many of them are 4-bit, its pick."""
    plan = planner_plan(model, None, hardware=hardware)
    fit = plan.fitting
    four_bit = sum(bool(r.recipe.load_in_4bit) for r in fit)
    pick = plan.pick
    return (f"`course plan --model {model} --hardware {hardware}` finds {len(fit)} of its {len(plan.rows)} "
            f"candidates within {plan.budget / GiB:.2f} GiB, {four_bit} of them with 4-bit NF4 weights"
            + (f"; its pick: {pick.recipe.describe()}, needing {pick.needed / GiB:.2f} GiB." if pick else "."))


def t4_misfits() -> str:
    """Where runs did not fit in the shipped T4 check: each notebook's newest record, by variant (of the records
    not known to be wrong: t4check.DEFECTS)."""

    parts = {}
    for rec in t4.records(usable=lambda r: not defect(r)):
        if rec["does_not_fit"]:
            parts.setdefault(rec["variant"], []).append(
                f"notebook {rec['notebook'][:2]} ({len(rec['does_not_fit'])} of {len(rec['runs'])})")
    shown = {v: f"`{VARIANTS[v]}`" if "=" in VARIANTS[v] else VARIANTS[v] for v in parts}
    return ("Runs that did not fit in the shipped T4 check, out of each notebook's runs (its newest record): "
            + "; ".join(f"{shown[v]}: {', '.join(p)}" for v, p in parts.items()) + ".")


def oom_extra(run) -> str:
    """The out-of-memory entry's generated part, for the logged run: the table, what its message says of
    fragmentation, and the plan for the model that did not load."""
    import re

    found = re.search(r"Of the allocated memory (\S+ \S+) is allocated by PyTorch, and (\S+ \S+) is reserved",
                      run.error)
    frag = (f"In that run {found.group(2)} was reserved but unallocated against {found.group(1)} allocated: "
            "fragmentation was not the cause, so `expandable_segments` would not have saved it.\n\n") if found else ""
    return (t4_misfits() + "\n\n" + turn_down_table(run.recipe_obj) + "\n\n" + frag
            + "When the model alone does not fit (the second message), only smaller weights help: " + plan_summary())


def oom_commands(recipe) -> tuple[str, ...]:
    """The out-of-memory entry's commands: the logged recipe's estimate, and the planner for both models."""
    return (estimate_command(recipe), "course plan --model smollm2-360m --hardware t4",
            "course plan --model llama-3.1-8b --hardware t4")


def data_commands() -> tuple[str, ...]:
    """DATA_RECIPE's effective batch in micro-batches the data fills (the largest power of two), accumulated."""

    r = Recipe(**DATA_RECIPE)
    micro = 2 ** ((shipped_token_count() // r.max_seq_length).bit_length() - 1)
    return (estimate_command(r.with_(micro_batch=micro, grad_accum=-(-r.micro_batch // micro)), "cpu"),)


def positions_commands() -> tuple[str, ...]:
    """The tiny model's longest sequence, estimated."""

    return (f"course estimate --model tiny --seq {TINY_CONFIG['max_position_embeddings']} --hardware cpu",)
