"""Unsloth beside the course's recipes: its QLoRA on the same model, data, batching, step counts and timing
rule, measured in a process and environment of its own (Unsloth 2026.10.9 pins transformers <= 5.17, trl <= 1.15
and datasets < 5, older than the course's).

    PYTHONPATH=/tmp/unsl-site:$PWD python scripts/gpu/peer_unsloth.py --micro-batch 16 --grad-accum 1 --out peers.jsonl

scripts/gpu/beyond_recipe.py --peers unsloth runs it after its own recipes, at 16x1 and 1x16. The site directory
comes from .whl-unsloth/ (scripts/device/peer_wheels.py says how it is made and installed); it must come first on
PYTHONPATH, and the course's own site directory must not be on it. One JSON line per run is added to --out, in the
shape of course_utils.results.Measurement, with the versions of this environment (Unsloth's among them, so its
environment key is never one of ours and no store takes the run for ours), the date and the command.

The same as course_utils.measure: the random-weight preset folder that models.preset_path built (this script
builds nothing), the shipped data tokenized and packed as build() has trl do it ('wrapped' blocks of exactly
max_seq_length tokens, the short block of each 1,000 records dropped), the source recipe's LoRA (r, alpha,
dropout, targets), learning rate, seed and sequence length, trl's SFTTrainer with the same data settings, and
measure.py's own probe: one warm-up step, then the tracked step (CUDA's peak counters reset at its start), then
the timed steps (tokens/s of the median step). Unsloth's own: the 4-bit load (NF4, double quant, bf16 compute),
its LoRA, attention and loss kernels, its gradient checkpointing ("unsloth", which offloads the checkpoints to
CPU memory), its LoRA weights in fp32, and adamw_8bit. No tensor-level tracking: the peaks are CUDA's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # course_utils from this checkout, after the peer's site directory
    sys.path.append(str(ROOT))

PEER = "unsloth"
PEER_DISTRIBUTIONS = ("unsloth", "unsloth_zoo", "xformers", "flash_attn")  # recorded where installed
PACK_BATCH = 1000  # datasets.map's default batch: trl's 'wrapped' packing chunks each batch of records on its own


def setup_environment() -> None:
    """Offline, no usage statistics, Unsloth's compiled trainer cache outside the checkout."""
    for name, value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("UNSLOTH_DISABLE_STATISTICS", "1"),
                        ("TOKENIZERS_PARALLELISM", "false"),
                        ("UNSLOTH_COMPILE_LOCATION", str(Path(tempfile.gettempdir()) / "unsloth_compiled_cache"))):
        os.environ.setdefault(name, value)


def peer_version() -> str:
    """The installed Unsloth's version (read from its metadata: nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PEER)
    except PackageNotFoundError:
        raise SystemExit("unsloth is not installed here. Put the peer's site directory first on PYTHONPATH "
                         "(PYTHONPATH=/tmp/unsl-site:$PWD); scripts/device/peer_wheels.py says how to make it.") from None


def peer_recipe(model: str, micro_batch: int, grad_accum: int, steps: int, version: str):
    """What the peer trains (course_utils.chapter.toward_the_limit.peer_recipe), labelled with Unsloth's version and the batching."""
    from course_utils.chapter.toward_the_limit import peer_recipe as recipe_of

    return recipe_of(model, micro_batch, grad_accum, steps, label=f"Unsloth {version} ({micro_batch}x{grad_accum})")


def peer_environment():
    """course_utils.results.environment() with the peer's own packages in its versions (and so in its key)."""
    from course_utils.machine import installed
    from course_utils.results import environment

    env = environment()
    extra = {k: v for k, v in installed(PEER_DISTRIBUTIONS).items() if v != "missing"}
    return dataclasses.replace(env, versions={**env.versions, **extra})


def default_model_dir(model: str) -> Path:
    """Where models.preset_path writes a preset's random weights ($COURSE_HOME/models/random-<name>)."""
    from course_utils.common import course_home

    return course_home() / "models" / f"random-{model.lower()}"


def training_texts() -> list[str]:
    """The shipped records as build() trains on them for a preset: one formatted text per record."""
    import datasets

    from course_utils.data import load_instructions, to_text_dataset

    datasets.disable_progress_bars()  # formatting 1,200 records takes a second
    return list(to_text_dataset(load_instructions("dolly", source="shipped"))["text"])


def packed_rows(tokenizer, texts: list[str], seq: int, batch: int = PACK_BATCH) -> list[list[int]]:
    """The token rows build()'s SFTTrainer trains on: each text with the EOS token appended (unless it ends with
    it), tokenized, each batch of `batch` records concatenated and cut into blocks of `seq` tokens, and the
    shorter last block of each batch dropped (build() filters it out)."""
    eos = tokenizer.eos_token
    ids = [tokenizer(t if t.endswith(eos) else t + eos)["input_ids"] for t in texts]
    rows: list[list[int]] = []
    for start in range(0, len(ids), batch):
        flat = [token for record in ids[start:start + batch] for token in record]
        rows += [flat[i:i + seq] for i in range(0, len(flat), seq)]
    return [row for row in rows if len(row) == seq]


def training_rows(tokenizer, recipe) -> list[list[int]]:
    """The rows the peer trains on: packed_rows of the shipped data, then whole optimizer steps only, as build()
    keeps them (build.whole_steps), so that 1x16 and 16x1 see the same blocks in every step."""
    from course_utils.build import whole_steps

    rows = packed_rows(tokenizer, training_texts(), recipe.max_seq_length)
    return rows[:whole_steps(len(rows), recipe)]


def sft_kwargs(recipe, output_dir: str, on_cuda: bool) -> dict:
    """trl's SFTConfig for the peer: build.sft_config's values for everything both stacks have (batching,
    steps, learning rate, seeds, data loading, logging). The rows come tokenized and packed, so trl packs
    nothing; padding_free=False keeps every batch [micro_batch, max_seq_length], as ours (full rows: there is
    no padding to remove). Gradient checkpointing is Unsloth's, set in get_peft_model."""
    return dict(
        output_dir=output_dir, max_steps=recipe.steps, per_device_train_batch_size=recipe.micro_batch,
        gradient_accumulation_steps=recipe.grad_accum, learning_rate=recipe.learning_rate,
        bf16=recipe.precision == "bf16", fp16=recipe.precision == "fp16", optim=recipe.optimizer,
        max_length=recipe.max_seq_length, packing=False, padding_free=False, logging_steps=1,
        save_strategy="no", report_to="none", seed=recipe.seed, data_seed=recipe.seed, dataloader_num_workers=0,
        dataloader_pin_memory=on_cuda, dataloader_drop_last=True, disable_tqdm=True, use_cpu=not on_cuda,
    )


class NullTracker:
    """What measure's probe calls on its tensor tracker, doing nothing: the peer's tensors are not classified."""

    phase = "idle"
    peak = 0
    peak_by_category: dict = {}

    def classify(self, tensors, category) -> None:
        pass

    def reset_peak(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def load_unsloth(model_dir: Path, recipe):
    """FastLanguageModel's 4-bit load of the local folder, and its LoRA with its own checkpointing:
    (model, tokenizer)."""
    import torch
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=str(model_dir), max_seq_length=recipe.max_seq_length, dtype=torch.bfloat16, load_in_4bit=True,
        local_files_only=True, use_exact_model_name=True)
    model = FastLanguageModel.get_peft_model(
        model, r=recipe.lora_r, lora_alpha=recipe.lora_alpha, lora_dropout=recipe.lora_dropout,
        target_modules=list(recipe.lora_targets), bias="none", use_gradient_checkpointing="unsloth",
        random_state=recipe.seed)
    return model, tokenizer


def train(model, tokenizer, rows: list[list[int]], recipe, output_dir: str):
    """trl's SFTTrainer over `rows` with measure.py's probe: (probe, trainer, status, error, the time training
    started)."""
    import datasets
    import torch
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    from course_utils.child import is_out_of_memory
    from course_utils.child import Probe, callback

    on_cuda = torch.cuda.is_available()
    probe = Probe(recipe, NullTracker(), "cuda" if on_cuda else "cpu")
    trainer = SFTTrainer(model=model, args=SFTConfig(**sft_kwargs(recipe, output_dir, on_cuda)),
                         train_dataset=datasets.Dataset.from_dict({"input_ids": rows}), processing_class=tokenizer,
                         callbacks=[callback(probe)])
    trainer.remove_callback(PrinterCallback)  # the losses are recorded, not printed
    trainer.model.register_forward_pre_hook(probe.forward_pre, with_kwargs=True)
    trainer.model.register_forward_hook(probe.forward_post, with_kwargs=True)
    for p in trainer.model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(probe.grad_ready)
    status, error, started = "ok", "", time.perf_counter()
    try:
        trainer.train()
    except Exception as exc:  # running out of memory is a result; anything else is not
        if not is_out_of_memory(exc):
            raise
        status, error = "does_not_fit", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        if probe.tracking:
            probe.stop_tracking()
    return probe, trainer, status, error, started


def run_notes(model, trainer) -> list[str]:
    """What Unsloth chose on this machine: attention kernels, where the embeddings live, LoRA dtype, batching."""
    import unsloth.models._utils as unsloth_utils

    lora = next((p for p in model.parameters() if p.requires_grad), None)
    notes = [
        f"{PEER} {peer_version()}: FastLanguageModel.from_pretrained(load_in_4bit=True) and get_peft_model("
        "use_gradient_checkpointing='unsloth'), trl SFTTrainer over the course's packed rows",
        f"attention: flash-attn {getattr(unsloth_utils, 'HAS_FLASH_ATTENTION', '?')}, xformers "
        f"{getattr(unsloth_utils, 'xformers_version', None) or 'not installed'} (else PyTorch SDPA)",
        f"input embeddings on {model.get_input_embeddings().weight.device}; LoRA weights in "
        f"{str(lora.dtype).replace('torch.', '') if lora is not None else '?'}; padding_free="
        f"{getattr(trainer.args, 'padding_free', None)}",
    ]
    if os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):
        notes.append(f"allocator settings (unsloth_zoo's): "
                     f"{os.environ.get('PYTORCH_ALLOC_CONF') or os.environ.get('PYTORCH_CUDA_ALLOC_CONF')}")
    return notes


def to_measurement(recipe, env, probe, model, status: str, error: str, **extra):
    """A Measurement in the course's shape from the probe's figures (median step, CUDA peaks after warm-up)."""
    import torch

    from course_utils.child import _command, _env_dict, _now
    from course_utils.memtrack import model_state_tensors, tensor_bytes
    from course_utils.results import Measurement

    cuda = torch.cuda.is_available()
    rate = statistics.median(probe.step_rates) if probe.step_rates and status == "ok" else None
    return Measurement(
        recipe=recipe.to_dict(), recipe_key=recipe.key, env=_env_dict(env), env_key=env.key, status=status,
        error=error, cuda_max_allocated=torch.cuda.max_memory_allocated() if cuda else None,
        cuda_max_reserved=torch.cuda.max_memory_reserved() if cuda else None,
        tokens_per_s=round(rate, 1) if rate else None, losses=probe.losses, precision=recipe.precision,
        trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        model_bytes=tensor_bytes(model_state_tensors(model)), date=_now(), command=_command(),
        run_id=os.environ.get("COURSE_RUN_ID", ""), **extra)


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.1-8b", help="the preset whose random weights to load")
    parser.add_argument("--model-dir", default=None, help="its folder (default: where models.preset_path puts it)")
    parser.add_argument("--micro-batch", type=int, required=True)
    parser.add_argument("--grad-accum", type=int, required=True)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps (1 warm-up, 1 tracked, the rest timed)")
    parser.add_argument("--out", required=True, help="results file (JSON lines); a run already in it is not repeated")
    parser.add_argument("--force", action="store_true", help="measure again even when --out has this run")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_environment()
    model_dir = Path(args.model_dir) if args.model_dir else default_model_dir(args.model)
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"no model in {model_dir}: the peer loads the folder the course built. Build it first in "
                         f"the course's environment: python -c \"from course_utils.models import preset_path; "
                         f"preset_path('{args.model}')\" (scripts/gpu/beyond_recipe.py does).")
    version = peer_version()
    # first, before anything touches CUDA: unsloth_zoo sets the allocator's options, and it patches transformers,
    # trl and peft, which must not be imported before it
    import unsloth  # noqa: F401
    from transformers import AutoTokenizer

    from course_utils.child import _startup_s, check_sane
    from course_utils.results import ResultStore

    startup, t0 = _startup_s(), time.perf_counter()  # as measure.py: start-up (imports), then the run itself
    recipe = peer_recipe(args.model, args.micro_batch, args.grad_accum, args.steps, version)
    store, env = ResultStore(args.out), peer_environment()
    done = [m for m in store.load() if m.recipe_key == recipe.key and m.env_key == env.key]
    if done and not args.force:
        print(f"{recipe.label}: already in {args.out} ({done[-1].date}); --force measures it again", flush=True)
        return 0
    rows = training_rows(AutoTokenizer.from_pretrained(model_dir), recipe)
    t_build = time.perf_counter()
    model, tokenizer = load_unsloth(model_dir, recipe)
    with tempfile.TemporaryDirectory(prefix="peer-unsloth-") as out_dir:
        probe, trainer, status, error, started = train(model, tokenizer, rows, recipe, out_dir)
    if status == "ok" and not probe.tokens:
        raise SystemExit(f"{recipe.label}: the probe saw no forward pass of the trainer's model, so no tokens/s; "
                         "nothing was stored. Unsloth's trainer must call the model it was given.")
    if status == "ok":
        check_sane(recipe, probe)
    notes = run_notes(model, trainer) + [f"peer process: {shlex.join(['peer_unsloth.py'] + (argv or sys.argv[1:]))}",
                                         "no tensor-level tracking: peak_bytes is 0, the peaks are CUDA's"]
    m = to_measurement(recipe, env, probe, model, status, error, notes=notes, startup_s=startup,
                       build_s=round(started - t_build, 2), duration_s=round(time.perf_counter() - t0, 2))
    store.add(m)
    gib = (m.cuda_max_allocated or 0) / 2**30
    print(f"{recipe.label}: {m.status}, {gib:.2f} GiB allocated, {m.tokens_per_s or 0:.0f} tokens/s, "
          f"{m.duration_s:.0f} s, losses {[round(x, 3) for x in m.losses]}", flush=True)
    return 0 if m.fits else 3


if __name__ == "__main__":
    sys.exit(main())
