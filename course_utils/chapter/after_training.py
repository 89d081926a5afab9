"""Notebook 08 (notebooks/08_after_training.ipynb, quizzes/08_after_training.yaml): After training: save the adapter, load it back in a fresh process, generate before and after, merge it,
and read the memory a learner sees on their own card.

- `train_and_save(recipe, folder)`: build, train with build's trainer, save the LoRA adapter and tokenizer
  with `trainer.save_model` (the chapter's `model.save_pretrained("./qlora-adapter")`), plus the recipe.
- `generate_before_after(folder)`: `python -m course_utils.chapter.after_training generate --base ... --adapter ...
  --prompts-json ...` in a new process (nothing of the trained model in memory) continues the same prompts
  greedily with the base model, then with the adapter loaded onto it, and measures the responses' loss
  and the share of generated tokens that are the training data's most common ones. A random-weight
  model (the embedded default) shows only that: its continuation drifts to the data's common tokens.
- merging the adapter into its base: course_utils.merging (merge_adapter, merge_estimate, format_merge).
- `memory_stats(measurement)`: peak reserved memory and its share of the GPU, as Unsloth's notebooks print
  it, what the card holds (nvidia-smi), beside a Measurement's allocated/reserved; on a CPU, its tensor peak.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from course_utils import machine
from course_utils.build import build, load_model
from course_utils.checks import check_hardware
from course_utils.common import GiB, MiB
from course_utils.data import corpus_text, format_prompt, load_shipped
from course_utils.machine import HardwareError, release_memory
from course_utils.models import ModelUnavailableError, no_progress_bars, uses_shipped_data
from course_utils.recipe import Recipe, RecipeError
from course_utils.show.tables import WIDTH, wrap

RECIPE_FILE = "course_recipe.json"  # the recipe the adapter was trained with, beside peft's files
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
NEW_TOKENS = {"cpu": 12, "cuda": 48}  # greedy tokens per prompt: small on a CPU (4-bit decoding is slow there)
FREQUENT_TOP = 20  # "frequent tokens": the training data's 20 most common tokens


class AdapterError(ValueError):
    """A saved adapter cannot be used as asked; the message names the folder or value and the fix."""


# --- 1. train and save ---------------------------------------------------------------------------
@dataclass
class Saved:
    """What train_and_save wrote: the folder, its files, the recipe trained, its loss per step."""

    folder: Path
    recipe: Recipe
    losses: list[float]
    train_s: float
    files: list[str]


def train_and_save(recipe: Recipe, folder: str | os.PathLike, steps: int | None = None,
                   isolate: bool | None = None) -> Saved:
    """Build the recipe, train it with build's SFTTrainer (no measuring: that is measure.py's job) and save
    the LoRA adapter and tokenizer to `folder` with `trainer.save_model`, the call behind the chapter's
    `model.save_pretrained("./qlora-adapter")`. The recipe goes beside them in course_recipe.json.
    isolate=None: in a fresh process on a GPU (`python -m course_utils.chapter.after_training train`), so that nothing of the
    model stays in this kernel's CUDA memory for the measurements after it (on a T4 that is most of the
    card); in this process on a CPU."""

    if isolate or (isolate is None and machine.device_type() == "cuda"):
        cmd = ["train", "--recipe", json.dumps(recipe.to_dict()), "--folder", str(folder)]
        d = in_fresh_process(cmd + (["--steps", str(steps)] if steps is not None else []), recipe.model, "training")
        return Saved(folder=Path(d["folder"]), recipe=Recipe.from_dict(d["recipe"]), losses=d["losses"],
                     train_s=d["train_s"], files=d["files"])

    if not recipe.uses_lora:
        raise RecipeError("train_and_save saves a LoRA adapter; this recipe is a full fine-tune (lora_r=None). "
                          "Use lora_r=16 (the chapter's LoRA) or save a full model with save_pretrained.")
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
            raise RecipeError(f"steps must be a whole number of optimizer steps, 2 or more, got {steps!r}.")
        recipe = recipe.with_(steps=steps, warmup_steps=min(recipe.warmup_steps, steps - 2), label=recipe.label)
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise AdapterError(f"{folder} is a file; pass a folder (new or empty) to save the adapter in.")
    with tempfile.TemporaryDirectory(prefix="course-after-") as workdir:
        built = build(recipe, output_dir=workdir)
        t0 = time.perf_counter()
        built.trainer.train()
        train_s = time.perf_counter() - t0
        built.trainer.save_model(str(folder))  # adapter_config.json, adapter_model.safetensors, tokenizer
        losses = [round(e["loss"], 4) for e in built.trainer.state.log_history if "loss" in e]
        del built
    release_memory()  # the trained model leaves this process's GPU memory
    (folder / RECIPE_FILE).write_text(json.dumps(recipe.to_dict(), indent=1))
    return Saved(folder=folder, recipe=recipe, losses=losses, train_s=round(train_s, 2),
                 files=sorted(p.name for p in folder.iterdir()))


def saved_recipe(folder: str | os.PathLike) -> Recipe | None:
    """The recipe train_and_save stored with an adapter (None for an adapter saved some other way)."""
    path = Path(folder) / RECIPE_FILE
    return Recipe.from_dict(json.loads(path.read_text())) if path.exists() else None


def check_adapter(folder: str | os.PathLike) -> Path:
    """The folder, if it holds a saved peft adapter; else an AdapterError that says what is missing."""
    folder = Path(folder)
    missing = [f for f in ADAPTER_FILES if not (folder / f).is_file()]
    if missing:
        raise AdapterError(f"{folder} holds no saved LoRA adapter ({', '.join(missing)} missing). Pass the folder "
                           "given to train_and_save(), trainer.save_model() or model.save_pretrained().")
    return folder


# --- 2. prompts, generation and what changed -----------------------------------------------------
def instruction_prompt(record) -> str:
    """A record as the training text shows it, up to and including '### Response:' and its newline: the
    instruction (and context), with the response left open for the model to write."""

    return format_prompt({**dict(record), "response": ""})


def data_prompts(n: int = 3) -> list[dict]:
    """The first record of each of the first n categories of the shipped data (8 at most), as
    {prompt, response}: prompt + response is that record's training text."""

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise AdapterError(f"n must be a positive number of prompts, got {n!r}.")
    chosen: dict[str, dict] = {}
    for record in load_shipped():
        if record["category"] not in chosen and len(chosen) < n:
            chosen[record["category"]] = dict(prompt=instruction_prompt(record), response=record["response"])
    if len(chosen) < n:
        raise AdapterError(f"the shipped data has {len(chosen)} categories, so at most {len(chosen)} prompts; got n={n}.")
    return list(chosen.values())


def load_base(base: str, load_in_4bit: bool, precision: str = "auto"):
    """The base model as a recipe loads it (build.load_model), in eval mode with its KV cache on."""

    recipe = Recipe(model=base, load_in_4bit=load_in_4bit, precision=precision)
    with no_progress_bars():
        model, tokenizer = load_model(recipe, check_hardware(recipe))
    model.config.use_cache = True  # load_model turns it off for training; generation wants it
    return model.eval(), tokenizer


def greedy(model, tokenizer, prompt: str, max_new_tokens: int) -> list[int]:
    """The ids of the greedy continuation of `prompt` (no sampling: the same every run)."""
    import torch

    enc = tokenizer(prompt, return_tensors="pt").to(model.device)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, num_beams=1,
                             pad_token_id=tokenizer.pad_token_id)
    return out[0, enc["input_ids"].shape[1]:].tolist()


def response_loss(model, tokenizer, records: list[dict]) -> float | None:
    """Mean cross-entropy (nats per token) of the records' responses, and the end token, given their
    prompts: what training on this format lowers. None when no record has a response."""
    import torch

    total, count = 0.0, 0
    for r in [r for r in records if r.get("response")]:
        prompt = tokenizer(r["prompt"])["input_ids"]
        answer = tokenizer(r["response"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = torch.tensor([prompt + answer], device=model.device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
        total += torch.nn.functional.cross_entropy(logits, ids[0, len(prompt):], reduction="sum").item()
        count += len(answer)
    return round(total / count, 4) if count else None


def frequent_tokens(tokenizer, top: int = FREQUENT_TOP) -> tuple[set[int], float]:
    """The `top` most common token ids of the shipped training text under this tokenizer, and the share of
    all its tokens they make up (what a model that only learned the data's token frequencies would hit)."""

    counts = Counter(i for ids in tokenizer(corpus_text(), add_special_tokens=False)["input_ids"] for i in ids)
    common = counts.most_common(top)
    return {i for i, _ in common}, round(sum(c for _, c in common) / sum(counts.values()), 4)


def generate_here(base: str, adapter: str | os.PathLike, prompts: list[dict], max_new_tokens: int,
                  load_in_4bit: bool, precision: str = "auto") -> dict:
    """What the fresh process does: greedy continuations and response loss, first of the base model, then
    of the same model with the adapter loaded onto it (peft's PeftModel.from_pretrained)."""
    from peft import PeftModel


    model, tokenizer = load_base(base, load_in_4bit, precision)
    if (Path(adapter) / "tokenizer_config.json").exists():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(adapter)  # the one saved with the adapter
    frequent, coverage = frequent_tokens(tokenizer)
    rows = [dict(prompt=p["prompt"], base_ids=greedy(model, tokenizer, p["prompt"], max_new_tokens)) for p in prompts]
    loss = dict(base=response_loss(model, tokenizer, prompts))
    model = PeftModel.from_pretrained(model, str(adapter)).eval()
    for row, p in zip(rows, prompts):
        row["adapter_ids"] = greedy(model, tokenizer, p["prompt"], max_new_tokens)
    loss["adapter"] = response_loss(model, tokenizer, prompts)
    share = {}
    for who in ("base", "adapter"):
        ids = [i for row in rows for i in row[f"{who}_ids"]]
        share[who] = round(sum(i in frequent for i in ids) / len(ids), 4) if ids else None
        for row in rows:
            row[who] = tokenizer.decode(row[f"{who}_ids"], skip_special_tokens=True)
    return dict(base=base, adapter=str(adapter), load_in_4bit=load_in_4bit, device=machine.device_type(), pid=os.getpid(),
                max_new_tokens=max_new_tokens, prompts=rows, response_loss=loss,
                frequent=dict(top=FREQUENT_TOP, data_share=coverage, **share))


def generate_before_after(adapter: str | os.PathLike, prompts: list[dict] | None = None, base: str | None = None,
                          max_new_tokens: int | None = None, load_in_4bit: bool | None = None,
                          timeout_s: float = 900) -> dict:
    """Run `python -m course_utils.chapter.after_training generate` in a new process and return its JSON. base and
    load_in_4bit default to the recipe saved with the adapter; prompts to data_prompts()."""
    folder = check_adapter(adapter)
    recipe = saved_recipe(folder)
    if base is None and recipe is None:
        raise AdapterError(f"{folder} has no {RECIPE_FILE} (it was not saved by train_and_save): pass base=, "
                           "the model the adapter was trained on.")
    base = base or recipe.model
    four_bit = recipe.load_in_4bit if load_in_4bit is None and recipe else bool(load_in_4bit)
    cmd = ["generate", "--base", base, "--adapter", str(folder),
           "--prompts-json", json.dumps(prompts if prompts is not None else data_prompts()),
           "--precision", recipe.precision if recipe else "auto"]
    cmd += ["--max-new-tokens", str(max_new_tokens)] if max_new_tokens is not None else []
    cmd += ["--load-in-4bit"] if four_bit else []
    return in_fresh_process(cmd, base, "generating", timeout_s,
                            hint=" Pass fewer prompts or a smaller max_new_tokens.")


def in_fresh_process(args: list[str], base: str, what: str, timeout_s: float = 1800, hint: str = "",
                     module: str = "course_utils.chapter.after_training") -> dict:
    """`python -m <module> <args>` in a new process; its last JSON line. Its one-line `error: ...` (or the end
    of its stderr) becomes an AdapterError naming `what` it was doing."""

    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if uses_shipped_data(base):
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")  # the embedded model never needs the hub
    try:
        done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise AdapterError(f"{what} took longer than {timeout_s} s; stopped it.{hint}") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        said = [line[7:] for line in done.stderr.splitlines() if line.startswith("error: ")]
        tail = said[-1] if said else "\n".join(done.stderr.strip().splitlines()[-15:])
        raise AdapterError(f"the {what} process failed (exit code {done.returncode}): {tail}")
    return json.loads(lines[-1])


def format_generations(result: dict) -> str:
    """The continuations, then what changed (every number from the result), in lines of tables.WIDTH at most."""

    lines = [f"{result['base']} with and without the adapter, greedy, {result['max_new_tokens']} new tokens, "
             f"on {result['device']}{' (4-bit base)' if result['load_in_4bit'] else ''}, in a fresh process:"]
    for row in result["prompts"]:
        lines += ["", row["prompt"].rstrip().replace("\n", " | ")[:WIDTH]]
        for who in ("base", "adapter"):
            lines.append(wrap(f"  {who + ':':9}{json.dumps(row[who], ensure_ascii=False)}", indent=" " * 11))
    loss, freq = result["response_loss"], result["frequent"]
    if loss["base"] is not None:
        lines += ["", f"response loss (nats/token, these records): base {loss['base']:.3f} -> adapter "
                      f"{loss['adapter']:.3f} ({loss['adapter'] - loss['base']:+.3f})"]
    if freq["base"] is not None:
        lines.append(f"generated tokens among the data's {freq['top']} most common (those make up "
                     f"{freq['data_share']:.0%} of it): base {freq['base']:.0%}, adapter {freq['adapter']:.0%}")

    if uses_shipped_data(result["base"]):  # 'tiny' and the presets have random weights
        lines.append("A random-weight model learns the data's commonest tokens in a few steps, not answers.")
    return wrap("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    """`python -m course_utils.chapter.after_training generate | train`: prints generate_here's result (or what train_and_save
    wrote) as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m course_utils.chapter.after_training")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="greedy continuations of the base model and of base + adapter")
    gen.add_argument("--base", required=True, help="'tiny', a preset, a hub id or a local folder")
    gen.add_argument("--adapter", required=True, help="folder with adapter_config.json")
    gen.add_argument("--prompts-json", required=True, help="JSON list of prompts or {prompt, response}, or its file")
    gen.add_argument("--max-new-tokens", type=int, default=None)
    gen.add_argument("--load-in-4bit", action="store_true", help="load the base in NF4, as QLoRA trained it")
    gen.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"))
    train = sub.add_parser("train", help="train_and_save in this process (what train_and_save runs on a GPU)")
    train.add_argument("--recipe", required=True, help="Recipe.to_dict() as JSON")
    train.add_argument("--folder", required=True)
    train.add_argument("--steps", type=int, default=None)
    args = parser.parse_args(argv)

    try:
        if args.command == "train":
            saved = train_and_save(Recipe.from_dict(json.loads(args.recipe)), args.folder, args.steps, isolate=False)
            print(json.dumps(dict(folder=str(saved.folder), recipe=saved.recipe.to_dict(), losses=saved.losses,
                                  train_s=saved.train_s, files=saved.files)))
            return 0
        prompts = parse_prompts(args.prompts_json)
        check_adapter(args.adapter)
        tokens = args.max_new_tokens if args.max_new_tokens is not None else NEW_TOKENS[machine.device_type()]
        if tokens < 1:
            raise AdapterError(f"--max-new-tokens must be 1 or more, got {tokens}.")
        result = generate_here(args.base, args.adapter, prompts, tokens, args.load_in_4bit, args.precision)
    except (AdapterError, RecipeError, HardwareError, ModelUnavailableError) as exc:  # one line for the parent
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, ensure_ascii=False))
    return 0


def parse_prompts(text: str) -> list[dict]:
    """--prompts-json: a JSON list (or a file holding one) of prompt strings or {prompt, response} objects."""
    if not text.lstrip().startswith("[") and Path(text).is_file():
        text = Path(text).read_text(encoding="utf-8")
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AdapterError(f"--prompts-json is not JSON ({exc.msg} at character {exc.pos}): pass a list such as "
                           '\'["### Instruction:\\nName three birds.\\n\\n### Response:\\n"]\'.') from None
    if not isinstance(items, list) or not items:
        raise AdapterError("--prompts-json must be a non-empty JSON list of prompts.")
    out = []
    for i, item in enumerate(items):
        item = {"prompt": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
            raise AdapterError(f"prompt {i} is {item!r}: each prompt is a non-empty string or an object with a "
                               "'prompt' string (and optionally a 'response').")
        out.append(dict(prompt=item["prompt"], response=item.get("response") or ""))
    return out


def fmt(n: float) -> str:
    """Bytes as GiB from 1 GiB, else MiB."""
    return f"{n / GiB:,.2f} GiB" if n >= GiB else f"{n / MiB:,.1f} MiB"


# --- 4. the memory a learner can read on their own card ------------------------------------------
def memory_stats(measurement=None) -> dict:
    """This kernel's memory as Unsloth's notebooks print it (peak reserved, its share of the card), what
    the whole card holds now (what nvidia-smi and Colab's GPU RAM bar show), and a course Measurement's
    allocated/reserved figures beside them. On a CPU: this process's peak resident memory and the
    Measurement's tensor-level peak."""
    import resource

    import torch


    stats: dict = dict(device=machine.device_name(), total_bytes=machine.total_memory_bytes(), gpu=torch.cuda.is_available())
    if stats["gpu"]:
        free, card = torch.cuda.mem_get_info()
        stats.update(max_reserved=torch.cuda.max_memory_reserved(), max_allocated=torch.cuda.max_memory_allocated(),
                     reserved=torch.cuda.memory_reserved(), card_used=card - free)
    else:
        stats["max_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    if measurement is not None:
        env = measurement.env or {}
        stats["measurement"] = dict(label=measurement.label, device=env.get("device", "?"),
                                    total_bytes=int(env.get("total_memory_gib", 0) * GiB), peak=measurement.peak_bytes,
                                    allocated=measurement.cuda_max_allocated, reserved=measurement.cuda_max_reserved)
    return stats


def format_memory_stats(stats: dict) -> str:
    """memory_stats() as the lines a notebook prints (at most tables.WIDTH characters each)."""

    pct = lambda n, total: f"{n / total:.1%}" if total else "?"  # noqa: E731
    total = stats["total_bytes"]
    if stats["gpu"]:
        lines = [f"GPU = {stats['device']}. Max memory = {fmt(total)}.",
                 f"This kernel, peak: {fmt(stats['max_reserved'])} reserved ({pct(stats['max_reserved'], total)} of "
                 f"the card), {fmt(stats['max_allocated'])} allocated (torch.cuda.max_memory_reserved/allocated).",
                 f"The card now: {fmt(stats['card_used'])} used by every process and CUDA context (what nvidia-smi "
                 f"and Colab's GPU RAM bar show); this kernel's allocator holds {fmt(stats['reserved'])} of it."]
    else:
        lines = [f"No CUDA GPU here ({stats['device']}): nvidia-smi and a GPU RAM bar have nothing to show.",
                 f"This kernel's peak resident memory (what Colab's RAM bar shows): {fmt(stats['max_rss'])} of "
                 f"{fmt(total)} RAM ({pct(stats['max_rss'], total)})."]
    m = stats.get("measurement")
    if m:
        head = f"The course measured {m['label']!r} on {m['device']} in its own process (not in this kernel's figures):"
        if m["reserved"] is not None:
            lines += [head, f"  allocated {fmt(m['allocated'])} ({pct(m['allocated'], m['total_bytes'])} of its card), "
                            f"reserved {fmt(m['reserved'])} ({pct(m['reserved'], m['total_bytes'])}) (Measurement."
                            "cuda_max_allocated/_reserved); nvidia-smi shows the reserved plus the CUDA context"]
        else:
            lines += [head, f"  tensor-level peak {fmt(m['peak'])} ({pct(m['peak'], m['total_bytes'])} of its "
                            "memory): the tensors training held at its largest moment (Measurement.peak_bytes)"]
    return wrap("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
