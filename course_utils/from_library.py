"""The libraries' objects read back into a Recipe: a learner's own SFTConfig / LoraConfig / BitsAndBytesConfig, or a
`trl sft --config` YAML file, become the recipe the course estimates, checks and (on a GPU) measures.

    from_library("meta-llama/Llama-3.1-8B", args=SFTConfig(...), peft_config=LoraConfig(...),
                 quantization_config=BitsAndBytesConfig(...), dtype=torch.bfloat16)
    course estimate --config sft.yaml

Both read one flat set of settings named as trl's CLI names them (ModelConfig, SFTConfig, ScriptArguments). Every
setting is either modelled (a Recipe field: build.library_objects turns it back into the same argument), harmless
(no byte of a training step depends on it: one warning names them all), or refused: one error names every setting
the course does not model whose value would change the memory, and says what to do.
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from typing import Any

from course_utils.models import PRESETS, load_config
from course_utils.recipe import DEFAULT_TARGETS, Recipe, RecipeError

class LibraryConfigError(RecipeError):
    """A library setting the course does not model, or an unknown one: the message names each."""


class LibraryConfigWarning(UserWarning):
    """Settings read but not modelled, because no byte of a training step depends on them."""


# settings that change no byte of one training step: output, logging, saving, evaluation, the hub, the run's length,
# the schedule, the data's source and the loader's plumbing
HARMLESS_PREFIXES = ("logging_", "save_", "eval_", "hub_", "push_to_hub", "report_to", "run_name", "output_dir",
                     "overwrite_output_dir", "dataset_", "num_train_epochs", "max_steps", "warmup_", "lr_scheduler",
                     "weight_decay", "adam_", "max_grad_norm", "data_seed", "resume_from_checkpoint", "do_train",
                     "do_eval", "do_predict", "per_device_eval_batch_size", "model_revision", "trust_remote_code",
                     "use_cpu", "dataloader_", "disable_tqdm", "completion_only_loss", "assistant_only_loss",
                     "ignore_bias_buffers", "datasets", "chat_template_path", "eos_token", "pad_token",
                     "shuffle_dataset", "label_names", "log_level", "remove_unused_columns", "env", "streaming",
                     "include_", "seed")
MULTI_GPU = ("fsdp", "fsdp_config", "deepspeed", "accelerator_config", "parallelism_config")
FLASH = ("flash_attention_2", "flash_attention_3", "kernels-community/flash-attn", "kernels-community/vllm-flash-attn3")
# LoraConfig fields as trl's ModelConfig names them
LORA_NAMES = {"r": "lora_r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout",
              "target_modules": "lora_target_modules", "task_type": "lora_task_type", "use_rslora": "use_rslora",
              "use_dora": "use_dora", "modules_to_save": "lora_modules_to_save",
              "target_parameters": "lora_target_parameters"}
BNB_NAMES = {"load_in_4bit": "load_in_4bit", "load_in_8bit": "load_in_8bit", "bnb_4bit_quant_type": "bnb_4bit_quant_type",
             "bnb_4bit_use_double_quant": "use_bnb_nested_quant", "bnb_4bit_quant_storage": "bnb_4bit_quant_storage",
             "bnb_4bit_compute_dtype": "bnb_4bit_compute_dtype"}
SFT_READ = ("bf16", "fp16", "per_device_train_batch_size", "gradient_accumulation_steps", "max_length", "optim",
            "learning_rate", "seed", "packing", "packing_strategy", "padding_free", "activation_checkpointing",
            "gradient_checkpointing", "activation_checkpointing_kwargs", "gradient_checkpointing_kwargs",
            "use_liger_kernel", "torch_compile", "activation_offloading", "tf32")


@dataclasses.dataclass
class ReadBack:
    """A recipe read from library settings, with what was said on the way."""

    recipe: Recipe
    warnings: list[str]
    padded: bool  # batches are padded (no packing): the estimate gives attention a mask


def trl_fields() -> dict[str, Any]:
    """{field: default} of everything `trl sft --config` reads: ScriptArguments, SFTConfig, ModelConfig,
    DatasetMixtureConfig (the dataclasses trl's sft script parses), and TrlParser's `env`."""
    from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, SFTConfig

    out: dict[str, Any] = {"env": None}
    for cls in (ScriptArguments, DatasetMixtureConfig, ModelConfig, SFTConfig):
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else None
            out.setdefault(f.name, default)
    return out


def dtype_name(value) -> str | None:
    """'bfloat16' for torch.bfloat16 or 'bfloat16'; None stays None."""
    if value is None:
        return None
    return str(value).removeprefix("torch.")


def preset_for(model_id: str) -> str:
    """The course's preset of a hub id (its shapes are known offline), or the id itself."""

    for name, spec in PRESETS.items():
        if spec.get("hub_id", "").lower() == str(model_id).lower() or name == str(model_id).lower():
            return name
    return model_id


def lora_targets(model: str, targets) -> tuple[str, ...]:
    """LoRA's target modules as the course names them: peft's default for the architecture when None, every
    linear layer but the output layer for 'all-linear'."""
    model_type = "llama"
    try:

        model_type = PRESETS[model]["model_type"] if model in PRESETS else load_config(model).model_type
    except Exception:  # an unknown model fails later, in the estimate, with its own message
        pass
    if targets is None:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

        return tuple(DEFAULTS.get(model_type, DEFAULT_TARGETS))
    if isinstance(targets, str):
        if targets == "all-linear":
            # the Llama family's linear layers but lm_head (peft leaves the output layer out): attention and MLP
            return ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
        return (targets,)
    if isinstance(targets, (set, frozenset)):  # peft keeps a set: the course's order (a recipe's key depends on it)
        order = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
        return tuple(sorted(targets, key=lambda t: (order.index(t) if t in order else len(order), t)))
    return tuple(targets)


def read_settings(model_id: str, settings: dict[str, Any], source: str, *, dtype_given: bool = True,
                  prepare_kbit: bool = False) -> ReadBack:
    """The recipe of `settings` (trl CLI names, only the ones set; the rest take trl's defaults). `prepare_kbit`:
    the script calls peft's prepare_model_for_kbit_training (trl's SFTTrainer never does)."""
    s = dict(settings)
    defaults = trl_fields()
    errors: list[str] = []
    said: list[str] = []

    def take(name: str, default=None):
        return s.pop(name) if name in s else defaults.get(name, default)

    model = preset_for(model_id)
    use_peft = bool(take("use_peft", False))
    load4 = bool(take("load_in_4bit", False))
    if take("load_in_8bit", False):
        errors.append("load_in_8bit=True (LLM.int8 weights): the course models 4-bit NF4 or 16/32-bit weights; use "
                      "load_in_4bit")
    fp16 = bool(take("fp16", False))
    bf16 = take("bf16", None)
    bf16 = (not fp16) if bf16 is None else bool(bf16)  # trl: bf16 unless fp16
    if bf16 and fp16:
        errors.append("bf16=True and fp16=True: pick one")
    precision = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    want_weights = {"bf16": "bfloat16", "fp16": "float16" if use_peft else "float32", "fp32": "float32"}[precision]
    dtype = dtype_name(take("dtype", "float32"))
    if not dtype_given:
        said.append(f"dtype not given: read as {want_weights}, the weights' dtype the course loads for {precision} "
                    "training (pass dtype= as your from_pretrained does)")
    elif dtype != want_weights:
        errors.append(f"dtype={dtype} with {precision} training: the course trains {precision} with the weights "
                      f"loaded in {want_weights} (build.torch_dtype); set dtype: {want_weights}")
    compute = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[precision]
    quant_type = take("bnb_4bit_quant_type", "nf4")
    double = bool(take("use_bnb_nested_quant", False))
    storage = dtype_name(take("bnb_4bit_quant_storage", None))
    given_compute = dtype_name(s.pop("bnb_4bit_compute_dtype", None)) or (dtype if dtype_given else compute)
    if load4:
        if quant_type == "fp4":
            said.append("bnb_4bit_quant_type=fp4: the same 4 bits and scales per weight as NF4; estimated as NF4")
        elif quant_type != "nf4":
            errors.append(f"bnb_4bit_quant_type={quant_type!r}: 4-bit types are nf4 or fp4")
        if storage not in (None, "uint8"):
            errors.append(f"bnb_4bit_quant_storage={storage} (FSDP-QLoRA's storage): estimate it per GPU with "
                          "course estimate --gpus N --strategy fsdp, without this setting")
        if given_compute != compute:
            errors.append(f"bnb_4bit_compute_dtype={given_compute} with {precision} training: the course computes "
                          f"in {compute} (build.quantization_config)")
    lora = dict(r=take("lora_r", 16), alpha=take("lora_alpha", 32), dropout=take("lora_dropout", 0.05),
                targets=take("lora_target_modules", None))
    task = take("lora_task_type", "CAUSAL_LM")
    for name, why in (("use_dora", "DoRA adds a magnitude vector and its own temporaries"),
                      ("lora_modules_to_save", "whole trained copies of modules"),
                      ("lora_target_parameters", "LoRA on parameters, not modules")):
        if take(name, None):
            errors.append(f"{name}: {why}; the course models plain LoRA")
    if take("use_rslora", False):
        said.append("use_rslora=True scales the adapter by alpha/sqrt(r): the same bytes, estimated as LoRA")
    if use_peft and str(getattr(task, "value", task)) != "CAUSAL_LM":
        errors.append(f"lora_task_type={task}: the course trains causal language models (CAUSAL_LM)")
    new_name, old_name = take("activation_checkpointing", None), take("gradient_checkpointing", True)
    ckpt = old_name if new_name is None else new_name  # transformers 5: the old name is an alias
    new_name, old_name = take("activation_checkpointing_kwargs", None), take("gradient_checkpointing_kwargs", None)
    ckpt_kwargs = new_name or old_name
    if ckpt_kwargs and set(ckpt_kwargs) - {"use_reentrant"}:
        errors.append(f"activation_checkpointing_kwargs={ckpt_kwargs}: the course models checkpointing of every "
                      "layer, reentrant or not ({'use_reentrant': False} or True)")
    max_length = take("max_length", 1024)
    if max_length is None:
        errors.append("max_length=None (no truncation): the memory depends on the longest example; give a length")
        max_length = 1024
    packing = bool(take("packing", False))
    strategy = take("packing_strategy", "bfd")
    padding_free = bool(take("padding_free", False))
    padded = not packing
    if not packing:
        said.append("packing is off: each batch is padded to its longest example; estimated with every example "
                    f"{max_length} tokens long (the most a batch can hold) and an attention mask")
    elif strategy != "wrapped" or padding_free:
        said.append(f"packing_strategy={strategy}{', padding_free' if padding_free else ''}: rows of at most "
                    f"{max_length} tokens with no padding; estimated as the course's 'wrapped' rows of exactly "
                    f"{max_length}")
    attention = take("attn_implementation", None)
    if attention in FLASH:
        said.append(f"attn_implementation={attention}: estimated as SDPA's flash kernel (the same bytes)")
    elif attention not in (None, "sdpa"):
        errors.append(f"attn_implementation={attention}: the course models SDPA attention (None or 'sdpa')")
    tf32 = take("tf32", None)
    optim = take("optim", "adamw_torch_fused")
    model_init = take("model_init_kwargs", None)
    if model_init:
        errors.append(f"model_init_kwargs={model_init}: the course loads the model as build does; give dtype and "
                      "attn_implementation as settings of their own")
    if not use_peft:
        ignored = [n for n in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules") if n in settings]
        if ignored:
            said.append(f"{', '.join(ignored)} have no effect: use_peft is false (a full fine-tune)")

    fields = dict(
        model=model, load_in_4bit=load4,
        double_quant=double if load4 else Recipe.double_quant,  # without 4-bit: the Recipe's defaults (its key)
        lora_r=lora["r"] if use_peft else None, lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
        lora_targets=lora_targets(model, lora["targets"]) if use_peft else DEFAULT_TARGETS,
        precision=precision, gradient_checkpointing=bool(ckpt),
        micro_batch=number(take("per_device_train_batch_size", 8), int),
        grad_accum=number(take("gradient_accumulation_steps", 1), int),
        optimizer=str(getattr(optim, "value", optim)), max_seq_length=number(max_length, int),
        learning_rate=number(take("learning_rate", 2e-5), float), seed=take("seed", 42),
        prepare_kbit=prepare_kbit if load4 else Recipe.prepare_kbit, liger_kernels=bool(take("use_liger_kernel", False)),
        torch_compile=bool(take("torch_compile", False)), offload_activations=bool(take("activation_offloading", False)),
        tf32=bool(tf32), reentrant_checkpointing=(ckpt_kwargs or {}).get("use_reentrant") is True,
        label=f"from {source}")

    multi = [n for n in s if n in MULTI_GPU and s[n] not in (None, "", [], {})]
    if multi:
        errors.append(f"{', '.join(multi)}: several GPUs; estimate per GPU with course estimate --gpus N "
                      "--strategy ddp|fsdp, without these settings")
    unknown = [n for n in s if n not in defaults and not n.startswith(("LoraConfig.", "BitsAndBytesConfig."))]
    for name in unknown:
        close = " or ".join(repr(c) for c in difflib.get_close_matches(name, list(defaults), n=2))
        errors.append(f"unknown setting {name!r}" + (f" (did you mean {close}?)" if close else "") +
                      ": not an option of trl sft (ScriptArguments, SFTConfig, ModelConfig)")
    rest = [n for n in s if n not in unknown and n not in multi]
    harmless = sorted(n for n in rest if n.startswith(HARMLESS_PREFIXES))
    refused = [n for n in rest if n not in harmless]
    if refused:
        errors.append("not modelled by the course, and they can change the memory: " +
                      ", ".join(f"{n}={s[n]!r}" for n in refused) + " (remove them to estimate without them)")
    if harmless:
        said.append("not modelled, no byte of a training step depends on them: " + ", ".join(harmless))
    if errors:
        raise LibraryConfigError(f"{source}: " + "; ".join(errors) + ".")
    try:
        recipe = Recipe(**fields)
    except RecipeError as exc:
        raise LibraryConfigError(f"{source}: {exc}") from None
    return ReadBack(recipe, said, padded)


def number(value, kind):
    """A YAML number (PyYAML reads '2e-4' as a string): as `kind` when it is one; else as it is, for Recipe's
    own message."""
    try:
        return kind(value) if isinstance(value, str) else value
    except ValueError:
        return value


def _set_fields(obj, reference, names: dict[str, str] | None, prefix: str) -> dict[str, Any]:
    """The dataclass fields of `obj` that differ from `reference`, named as trl's CLI names them (`names`), or
    '<prefix>.<field>' for the ones trl has no name for."""
    out = {}
    for f in dataclasses.fields(obj):
        value, default = getattr(obj, f.name), getattr(reference, f.name, None)
        if value != default:
            key = (names or {}).get(f.name, f"{prefix}.{f.name}" if names is not None else f.name)
            out[key] = value
    return out


def settings_of(args=None, peft_config=None, quantization_config=None) -> dict[str, Any]:
    """The settings of a learner's library objects, named as trl's CLI names them (only what differs from the
    libraries' defaults, and every setting the course reads)."""
    s: dict[str, Any] = {}
    if args is not None:
        from trl import SFTConfig

        reference = SFTConfig(output_dir=args.output_dir, bf16=False, fp16=False, use_cpu=args.use_cpu)
        s.update(_set_fields(args, reference, None, "SFTConfig"))
        for name in SFT_READ:
            s[name] = getattr(args, name)
        s.pop("gradient_checkpointing", None) if args.activation_checkpointing is not None else None
        s.pop("gradient_checkpointing_kwargs", None)
        s.pop("use_cpu", None)
    if peft_config is not None:
        from peft import LoraConfig

        if not isinstance(peft_config, LoraConfig):
            raise LibraryConfigError(f"peft_config is a {type(peft_config).__name__}: the course models LoRA "
                                     "(peft.LoraConfig)")
        s["use_peft"] = True
        lora = _set_fields(peft_config, LoraConfig(), LORA_NAMES, "LoraConfig")
        lora.setdefault("lora_r", peft_config.r)
        lora.setdefault("lora_alpha", peft_config.lora_alpha)
        lora.setdefault("lora_dropout", peft_config.lora_dropout)
        lora.setdefault("lora_target_modules", peft_config.target_modules)
        s.update(lora)
    if quantization_config is not None:
        from transformers import BitsAndBytesConfig

        reference = BitsAndBytesConfig()
        q = {}
        for key, value in quantization_config.to_dict().items():
            if key.startswith("_") or key == "quant_method" or reference.to_dict().get(key) == value:
                continue
            q[BNB_NAMES.get(key, f"BitsAndBytesConfig.{key}")] = value
        if quantization_config.load_in_4bit:
            q["bnb_4bit_quant_type"] = quantization_config.bnb_4bit_quant_type
            q["bnb_4bit_compute_dtype"] = dtype_name(quantization_config.bnb_4bit_compute_dtype)
        s.update(q)
    return s


def read_objects(model_id: str, args=None, peft_config=None, quantization_config=None, *, dtype=None,
                 prepare_kbit: bool = False) -> ReadBack:
    """ReadBack of a learner's library objects (see from_library)."""
    settings = settings_of(args, peft_config, quantization_config)
    if dtype is not None:
        settings["dtype"] = dtype_name(dtype)
    return read_settings(model_id, settings, "your library objects", dtype_given=dtype is not None,
                         prepare_kbit=prepare_kbit)


def from_library(model_id: str, args=None, peft_config=None, quantization_config=None, *, dtype=None,
                 prepare_kbit: bool = False) -> Recipe:
    """The Recipe a script with these library objects trains: `args` a trl SFTConfig, `peft_config` a peft
    LoraConfig (None: a full fine-tune), `quantization_config` a transformers BitsAndBytesConfig, `dtype` what the
    script passes to from_pretrained, `prepare_kbit` whether it calls peft's prepare_model_for_kbit_training.
    Settings the course does not model raise LibraryConfigError naming each; harmless ones warn
    (LibraryConfigWarning)."""
    read = read_objects(model_id, args, peft_config, quantization_config, dtype=dtype, prepare_kbit=prepare_kbit)
    for text in read.warnings:
        warnings.warn(text, LibraryConfigWarning, stacklevel=2)
    return read.recipe


def read_trl_config(path: str) -> ReadBack:
    """ReadBack of a `trl sft --config` YAML file: its model_name_or_path and settings, as trl's sft script uses
    them (SFTTrainer(model=..., peft_config=get_peft_config(...), quantization_config=get_quantization_config(...)),
    which calls no prepare_model_for_kbit_training)."""
    from pathlib import Path

    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise LibraryConfigError(f"--config {path}: cannot be read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise LibraryConfigError(f"--config {path}: not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise LibraryConfigError(f"--config {path}: a trl config is a YAML mapping of settings, e.g. "
                                 "'model_name_or_path: HuggingFaceTB/SmolLM2-360M'")
    model_id = data.pop("model_name_or_path", None)
    if not model_id:
        raise LibraryConfigError(f"--config {path}: no model_name_or_path (the model to train)")
    return read_settings(str(model_id), data, Path(path).name)
