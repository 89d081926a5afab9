"""Exercise answers in the libraries' own code: the answer cell a "Try it" gives the learner (answer_code: the
objects of the rung the task starts from, the lines to change marked `# <- ?`), and a learner's answer read onto
the exercise's starting recipe through course_utils/from_library.py and checked by the estimator as a Recipe is.

An answer is a trl SFTConfig, a peft LoraConfig, a transformers BitsAndBytesConfig, a tuple of them, or a dict of
from_library's arguments: model_id, args, peft_config (None: a full fine-tune), quantization_config, dtype,
prepare_kbit (whether the script calls peft's prepare_model_for_kbit_training), and offload_embeddings (the course's
own hook, course_utils.build.offload_input_embeddings). Each object given is taken whole, as the script would pass
it (an SFTConfig's defaults included: SFTConfig() turns bf16 and checkpointing on); what is not given stays the
starting recipe's. The weights' dtype and the 4-bit compute dtype follow the precision unless given. Notebook 11's
answer is an accelerate config's YAML text (accelerate_answer: its num_processes, under FSDP without offload).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from course_utils import build
from course_utils.chapter.library_map import flat, show
from course_utils.from_library import LibraryConfigError, dtype_name, read_settings, settings_of
from course_utils.machine import HardwareError, get_hardware, resolve_precision
from course_utils.models import PRESETS
from course_utils.recipe import Recipe

BY_TYPE = {"SFTConfig": "args", "LoraConfig": "peft_config", "BitsAndBytesConfig": "quantization_config"}
KEYS = ("model_id", "args", "peft_config", "quantization_config", "dtype", "prepare_kbit", "offload_embeddings")


def library_answer(value) -> dict | None:
    """The answer as from_library's arguments, or None when it is not a library answer."""
    if isinstance(value, dict):
        return dict(value) if value and set(value) <= set(KEYS) else None
    items = value if isinstance(value, (tuple, list)) else (value,)
    if not items or not all(type(v).__name__ in BY_TYPE for v in items):
        return None
    return {BY_TYPE[type(v).__name__]: v for v in items}


def is_library_answer(value) -> bool:
    return library_answer(value) is not None


def answer_recipe(value, start: Recipe, hardware: str) -> Recipe:
    """The recipe a library answer trains, read onto `start` for the estimator's `hardware`."""

    given = library_answer(value)
    hw = get_hardware(hardware)
    try:
        precision = resolve_precision(start.precision, hw)
    except HardwareError:  # a start this hardware cannot train (the exercise is to change it)
        precision = resolve_precision("auto", hw)
    o = build.library_objects(start.with_(precision="auto"), precision, fsdp=False)
    s = settings_of(args=given["args"]) if "args" in given else dict(o.sft_kwargs)
    lora = given.get("peft_config", o.lora_config)
    bnb = given.get("quantization_config", o.quantization_config)
    s.update(settings_of(peft_config=lora, quantization_config=bnb))
    if "quantization_config" not in given:
        s.pop("bnb_4bit_compute_dtype", None)  # follows the precision, as build makes it
    if given.get("dtype") is not None:
        s["dtype"] = dtype_name(given["dtype"])
    read = read_settings(str(given.get("model_id", start.model)), s, "your answer",
                         dtype_given=given.get("dtype") is not None,
                         prepare_kbit=given.get("prepare_kbit", start.prepare_kbit))
    recipe = read.recipe.with_(steps=start.steps, warmup_steps=start.warmup_steps,
                               offload_embeddings=given.get("offload_embeddings", start.offload_embeddings))
    if recipe.precision == precision and start.precision in ("auto", precision):
        recipe = recipe.with_(precision=start.precision)  # 'auto' stays 'auto'
    return recipe


# Recipe fields as the answer cell names them (the checks' messages)
LIBRARY_NAMES = {"micro_batch": "per_device_train_batch_size", "grad_accum": "gradient_accumulation_steps",
                 "max_seq_length": "max_length", "optimizer": "optim",
                 "gradient_checkpointing": "activation_checkpointing",
                 "lora_r": "peft_config (LoraConfig r)", "lora_alpha": "LoraConfig lora_alpha",
                 "lora_dropout": "LoraConfig lora_dropout", "lora_targets": "LoraConfig target_modules",
                 "precision": "bf16/fp16", "load_in_4bit": "BitsAndBytesConfig load_in_4bit",
                 "double_quant": "BitsAndBytesConfig bnb_4bit_use_double_quant", "liger_kernels": "use_liger_kernel",
                 "offload_activations": "activation_offloading", "model": "model_id"}


def library_name(field: str) -> str:
    """A Recipe field as the libraries' code names it (the field itself where the course names it)."""
    return LIBRARY_NAMES.get(field, field)


# --- the answer cell: what the learner edits, in the libraries' own code ------------------------------------------
LLAMA = "llama-3.1-8b"
START_GPUS = 2  # exercise 11's cell starts from the notebook's runs: two processes
MARK = "# <- ?"  # the lines the learner changes; a worked solution keeps their comment without the "?"
HEAD = {False: "# Your answer, in the libraries' own code: the rung you start from. Change the lines marked <- ?",
        True: "# The worked solution: the answer cell, filled in (the lines marked <-)"}
ANSWER_TYPES = ("an SFTConfig, a LoraConfig, a BitsAndBytesConfig, a tuple or dict of them (the answer cell), or an "
                "accelerate config's YAML text (notebook 11)")


@dataclasses.dataclass(frozen=True)
class Cell:
    """One exercise's answer cell: the libraries' objects of the rung it starts from, with the lines the learner
    changes marked `# <- ?` and what goes there."""

    args: tuple[str, ...]  # SFTConfig's arguments shown, in order (the marked ones last)
    blanks: dict  # a marked name (an SFTConfig argument, peft_config, bnb_config, prepare_kbit...) -> what goes there
    objects: tuple[str, ...] = ()  # more lines: "model_id", "peft_config", "bnb_config", "prepare_kbit", ...
    start: Callable[[Recipe], Recipe] = lambda s: s  # the cell's rung, from the exercise's start
    by_base: bool = True  # the committed cell writes max_length=base.max_seq_length (256 on a CPU, 512 on a GPU)


_COMMON = ("bf16", "fp16", "activation_checkpointing", "optim", "max_length", "gradient_accumulation_steps")
CELLS = {
    "00_where_memory_goes": Cell(_COMMON[:4] + _COMMON[5:] + ("per_device_train_batch_size", "max_length"),
                                 {"peft_config": "a LoraConfig, or None: every weight trains",
                                  "per_device_train_batch_size": "sequences per micro-batch",
                                  "max_length": "tokens per sequence"}, ("peft_config",)),
    "01_gradient_checkpointing": Cell(("bf16", "fp16", "optim", "activation_checkpointing_kwargs",
                                       "activation_checkpointing", "per_device_train_batch_size", "max_length"),
                                      {"per_device_train_batch_size": "sequences per micro-batch",
                                       "max_length": "tokens per sequence"},
                                      start=lambda s: s.with_(gradient_checkpointing=True)),
    "02_gradient_accumulation": Cell(_COMMON[:5] + ("per_device_train_batch_size", "gradient_accumulation_steps"),
                                     {"per_device_train_batch_size": "the micro-batch",
                                      "gradient_accumulation_steps": "micro-batches per optimizer step"},
                                     start=lambda s: s.with_(micro_batch=1, grad_accum=16)),
    "03_efficient_optimizers": Cell(_COMMON[:3] + _COMMON[4:] + ("per_device_train_batch_size", "optim"),
                                    {"peft_config": "a LoraConfig, or None: every weight trains",
                                     "optim": "the optimizer"}, ("peft_config",)),
    "04_mixed_precision": Cell(_COMMON[2:] + ("per_device_train_batch_size", "bf16", "fp16"),
                               {"bf16": "bf16 mixed precision", "fp16": "or fp16"}),
    "05_qlora_4bit": Cell(("max_length", "bf16", "fp16", "activation_checkpointing", "activation_checkpointing_kwargs",
                           "per_device_train_batch_size", "gradient_accumulation_steps", "optim"),
                          {"bnb_config": "a BitsAndBytesConfig(...)", "bf16": "bf16", "fp16": "or fp16",
                           "activation_checkpointing": "checkpointing", "per_device_train_batch_size": "micro-batch",
                           "gradient_accumulation_steps": "accumulation", "optim": "the optimizer"},
                          ("model_id", "bnb_config"), start=lambda s: s.with_(model=LLAMA)),
    "06_sequence_length_and_batch": Cell(("bf16", "fp16", "optim", "per_device_train_batch_size",
                                          "activation_checkpointing_kwargs", "activation_checkpointing", "max_length"),
                                         {"max_length": "tokens per sequence"},
                                         start=lambda s: s.with_(gradient_checkpointing=True)),
    "07_complete_recipe": Cell(("activation_checkpointing", "activation_checkpointing_kwargs", "optim", "max_length",
                                "bf16", "fp16", "per_device_train_batch_size", "gradient_accumulation_steps"),
                               {"bf16": "bf16 (a T4 has none)", "fp16": "or fp16",
                                "per_device_train_batch_size": "the micro-batch",
                                "gradient_accumulation_steps": "micro-batches per optimizer step"}, by_base=False),
    "09_beyond_the_recipe": Cell(("bf16", "fp16", "activation_checkpointing", "activation_checkpointing_kwargs",
                                  "optim", "max_length", "use_liger_kernel", "activation_offloading",
                                  "per_device_train_batch_size", "gradient_accumulation_steps"),
                                 {"use_liger_kernel": "Liger's kernels", "activation_offloading": "activations on CPU",
                                  "per_device_train_batch_size": "the micro-batch",
                                  "gradient_accumulation_steps": "accumulation",
                                  "prepare_kbit": "do you call prepare_model_for_kbit_training(model)?",
                                  "offload_embeddings": "course_utils.build.offload_input_embeddings(model)?"},
                                 ("prepare_kbit", "offload_embeddings"), by_base=False),
}


def _precision(recipe: Recipe, hardware: str) -> str:
    """The precision a cell writes for `recipe`: its own, or 'auto' resolved on `hardware`."""
    if recipe.precision != "auto":
        return recipe.precision
    return resolve_precision("auto", get_hardware(hardware))


def _pack(parts: list[str], indent: str = "    ", width: int = 96) -> list[str]:
    """`a=1, b=2, ...` over as few lines as fit `width`, each ending in a comma."""
    lines, line = [], ""
    for part in parts:
        if line and len(indent + line + " " + part + ",") > width:
            lines.append(indent + line)
            line = ""
        line = f"{line} {part}," if line else f"{part},"
    return lines + ([indent + line] if line else [])


def _mark(cell: Cell, name: str, solved: bool) -> str:
    what = cell.blanks.get(name)
    return "" if what is None else f"  {MARK.removesuffix(' ?') if solved else MARK} {what}"


def answer_code(notebook: str, recipe, hardware: str, *, committed: bool = False) -> str:
    """The answer cell for `recipe` (the cell's start: what the notebook holds, committed=True; a worked solution:
    the same cell filled in). Exercise 11's is an accelerate config with `recipe` processes."""
    if notebook == "11_more_than_one_gpu":
        return accelerate_code(recipe, solved=not committed)
    cell, solved = CELLS[notebook], not committed
    o = build.library_objects(recipe.with_(precision="auto"), _precision(recipe, hardware), fsdp=False)
    lines = [HEAD[solved], "import torch"]
    uses = ["SFTConfig"] + [k for k, n in (("LoraConfig", "peft_config"), ("BitsAndBytesConfig", "bnb_config"))
                            if n in cell.objects]
    lines += [f"from {m} import {n}" for n, m in (("BitsAndBytesConfig", "transformers"), ("LoraConfig", "peft"),
                                                   ("SFTConfig", "trl")) if n in uses]
    lines.append("")
    if "model_id" in cell.objects:
        lines.append(f'model_id = "{PRESETS.get(recipe.model, {}).get("hub_id", recipe.model)}"')
    if "bnb_config" in cell.objects:
        bnb = flat(o)
        kw = [f"{n}={show(bnb[('BitsAndBytesConfig', n)])}" for c, n in bnb if c == "BitsAndBytesConfig" and n
              and not (n == "bnb_4bit_quant_storage" and str(bnb[(c, n)]) == "torch.uint8")]
        if not kw:
            lines.append(f"bnb_config = None{_mark(cell, 'bnb_config', solved)}")
        else:
            lines += [f"bnb_config = BitsAndBytesConfig({_mark(cell, 'bnb_config', solved)}", *_pack(kw), ")"]
    if "peft_config" in cell.objects:
        lora = o.lora_config
        if lora is None:
            lines.append(f"peft_config = None{_mark(cell, 'peft_config', solved)}")
        else:
            kw = [f"r={lora.r}", f"lora_alpha={lora.lora_alpha}", f"lora_dropout={lora.lora_dropout}",
                  f"target_modules={show(sorted(lora.target_modules, key=list(recipe.lora_targets).index))}",
                  'task_type="CAUSAL_LM"']
            lines += [f"peft_config = LoraConfig({_mark(cell, 'peft_config', solved)}", *_pack(kw), ")"]
    for name in ("prepare_kbit", "offload_embeddings"):
        if name in cell.objects:
            lines.append(f"{name} = {getattr(recipe, name)}{_mark(cell, name, solved)}")
    sft = dict(o.sft_kwargs)
    sft["activation_checkpointing_kwargs"] = {"use_reentrant": False}  # build passes it with checkpointing on
    given = lambda n: "base.max_seq_length" if committed and cell.by_base and n == "max_length" else show(sft.get(n))
    plain = [f"{n}={given(n)}" for n in cell.args if n not in cell.blanks]
    lines += ["args = SFTConfig(", *_pack(['output_dir="try-it"', "use_cpu=not torch.cuda.is_available()", *plain]),
              *(f"    {n}={given(n)},{_mark(cell, n, solved)}" for n in cell.args if n in cell.blanks), ")"]
    given_objects = {"model_id": "model_id", "peft_config": "peft_config", "bnb_config": "quantization_config",
                     "prepare_kbit": "prepare_kbit", "offload_embeddings": "offload_embeddings"}
    extra = [f"{given_objects[n]}={n}" for n in cell.objects]
    lines.append(f"answer = dict(args=args, {', '.join(extra)})" if extra else "answer = args")
    return "\n".join(lines)


def accelerate_code(gpus: int, solved: bool = False) -> str:
    """Exercise 11's answer cell: the FSDP launch config (accelerate_configs/fsdp_qlora.yaml's settings) with
    `gpus` processes."""
    mark = f"  # <- {'' if solved else '? '}how many 24 GiB GPUs"
    return "\n".join([
        HEAD[solved].replace("the libraries' own code", "accelerate's own config")
                    .replace("the rung you start from", f"{START_GPUS} GPUs"),
        "# (accelerate launch --config_file fsdp.yaml train.py: this notebook's FSDP-QLoRA launch config)",
        'accelerate_config = """',
        "compute_environment: LOCAL_MACHINE",
        "distributed_type: FSDP",
        f"num_processes: {gpus}{mark}",
        "fsdp_config:",
        "  fsdp_version: 1",
        "  fsdp_sharding_strategy: FULL_SHARD",
        "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP",
        "  fsdp_offload_params: false  # no CPU offload",
        "  fsdp_cpu_ram_efficient_loading: true",
        "  fsdp_use_orig_params: false",
        "mixed_precision: 'no'",
        '"""',
        "answer = accelerate_config"])


def accelerate_answer(text: str) -> tuple[int | None, str | None]:
    """(the number of GPUs, None) an accelerate config's YAML text launches, or (None, what is wrong with it)."""
    import yaml
    from accelerate.commands.config.config_args import ClusterConfig

    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return None, f"your accelerate config is not YAML ({str(exc).splitlines()[0]})"
    if not isinstance(config, dict):
        return None, "your accelerate config is a YAML mapping of settings, such as 'num_processes: 2'"
    known = {f.name for f in dataclasses.fields(ClusterConfig)}
    unknown = [k for k in config if k not in known]
    if unknown:
        return None, f"unknown accelerate setting {', '.join(map(repr, unknown))}: not a field of accelerate's config"
    fsdp = config.get("fsdp_config") or {}
    if config.get("distributed_type") != "FSDP":
        return None, f"distributed_type: {config.get('distributed_type')}: this exercise shards with FSDP"
    if fsdp.get("fsdp_offload_params"):
        return None, "fsdp_offload_params: true puts the parameters in CPU memory; the exercise is without CPU offload"
    strategy = fsdp.get("fsdp_sharding_strategy", "FULL_SHARD")
    if strategy not in ("FULL_SHARD", 1) or fsdp.get("fsdp_reshard_after_forward") is False:
        return None, (f"fsdp_sharding_strategy: {strategy}: the course estimates FULL_SHARD (weights, gradients "
                      "and optimizer state divided, each unit gathered just before it computes)")
    gpus = config.get("num_processes")
    if isinstance(gpus, bool) or not isinstance(gpus, int):
        return None, (f"num_processes: {gpus!r} is not a whole number of GPUs (a YAML comment needs a space before "
                      "its #)")
    return gpus, None


def read_answer(notebook: str, value, start: Recipe, hardware: str, gpus: bool = False):
    """(what the check reads: a Recipe, or a number of GPUs, None) from a learner's answer, or (None, why it cannot
    be read: the message from_library gives, naming the setting). Anything else is returned as it is."""
    if gpus:
        return accelerate_answer(value) if isinstance(value, str) else (value, None)
    if not is_library_answer(value):
        return value, None
    try:
        return answer_recipe(value, start, hardware), None
    except LibraryConfigError as exc:
        return None, str(exc)


def cell_start(notebook: str, start: Recipe):
    """The rung the answer cell starts from (exercise 11: the number of GPUs)."""
    return START_GPUS if notebook == "11_more_than_one_gpu" else CELLS[notebook].start(start)
