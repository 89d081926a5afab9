"""Recipe -> model, tokenizer, data and SFTTrainer. The only module that calls transformers, peft,
trl and bitsandbytes, with their current APIs. When those libraries move, this file changes.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_utils.checks import check_hardware, check_positions
from course_utils.machine import apply_profile, device_type, rank_info, resolve_precision
from course_utils.models import hub_error, no_progress_bars, resolve_model, uses_shipped_data
from course_utils.recipe import Recipe, RecipeError

@dataclass
class Built:
    """Everything a training run needs, plus what build decided on the way."""

    recipe: Recipe
    precision: str  # the resolved precision: fp32, bf16 or fp16
    model: Any
    tokenizer: Any
    trainer: Any
    notes: list[str] = field(default_factory=list)


def torch_dtype(precision: str, full_finetune: bool):
    """dtype of the base weights: bf16 stays bf16; fp16 AMP needs fp32 master weights when they train."""
    import torch

    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16":
        return torch.float32 if full_finetune else torch.float16
    return torch.float32


def offload_input_embeddings(model) -> str | None:
    """Keep the (frozen) input embedding table in CPU memory: each step looks its tokens up there and
    sends only the looked-up rows to the GPU. The table is never needed whole on the GPU: a step
    reads micro_batch x sequence rows of it (for Llama-3.1-8B, 4 MiB of its 1 GiB).

    The output is detached: the table does not train, and with non-reentrant checkpointing no
    layer needs its input to require a gradient (reentrant checkpointing does: the Trainer's
    enable_input_require_grads hook, registered when training starts, runs after this one and sets it;
    the GPU runs of 2026-12-07 trained as without it). Returns a note, or None when there is nothing
    to move (the model already runs on the CPU)."""
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings()
    if head is not None and head.weight is embedding.weight:
        raise RecipeError("offload_embeddings=True needs separate input and output embeddings; this model ties "
                          "them, and the output layer needs the whole table on the GPU. Set offload_embeddings=False.")
    device = embedding.weight.device
    if device.type == "cpu":
        return None
    embedding.to("cpu")

    def to_cpu(module, args):
        return (args[0].to("cpu"),) + tuple(args[1:])

    def to_device(module, args, output):
        return output.detach().to(device)

    embedding.register_forward_pre_hook(to_cpu)
    embedding.register_forward_hook(to_device)
    # the model now spans two devices: tell the Trainer and accelerate not to move it back whole
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    device_map = dict(getattr(inner, "hf_device_map", None) or {"": str(device)})
    for name, module in inner.named_modules():
        if module is embedding:
            device_map[name] = "cpu"
    inner.hf_device_map = device_map
    gib = embedding.weight.numel() * embedding.weight.element_size() / 2**30
    return f"input embedding table ({gib:.2f} GiB) kept in CPU memory; the looked-up rows go to the GPU"


def quantization_config(recipe: Recipe, precision: str, fsdp: bool | None = None):
    """The BitsAndBytesConfig of a 4-bit recipe (NF4, optional double quant), else None. `fsdp`: whether the
    model is sharded by FSDP (default: this process's accelerate launch says so)."""
    if not recipe.load_in_4bit:
        return None
    import torch
    from transformers import BitsAndBytesConfig

    compute = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    # FSDP shards float tensors only: under it the packed 4-bit weights are stored in the model's dtype
    # (FSDP-QLoRA); on one GPU they stay in bitsandbytes' default uint8
    sharded = fsdp_enabled() if fsdp is None else fsdp
    storage = torch_dtype(precision, full_finetune=False) if sharded else torch.uint8
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=compute,
        bnb_4bit_use_double_quant=recipe.double_quant,
        bnb_4bit_quant_storage=storage,
    )


def fsdp_enabled() -> bool:
    """True in a process that `accelerate launch` started with an FSDP config (course_utils.distributed)."""
    import os

    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def model_kwargs(recipe: Recipe, precision: str, fsdp: bool | None = None) -> dict:
    """from_pretrained's keyword arguments for the recipe: the weights' dtype, the 4-bit config, the placement."""
    import torch

    sharded = fsdp_enabled() if fsdp is None else fsdp
    # this process's GPU: under `accelerate launch` each rank has set its own (distributed_rank.py)
    device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    return dict(
        dtype=torch_dtype(precision, full_finetune=not recipe.uses_lora),
        quantization_config=quantization_config(recipe, precision, fsdp=sharded),
        device_map=None if sharded else {"": device},  # FSDP places (and shards) the weights
    )


def load_model(recipe: Recipe, precision: str, kwargs: dict | None = None):
    """from_pretrained with the recipe's dtype and quantization: the same call for tiny and 8B models.
    `kwargs`: from_pretrained's arguments as library_objects made them (default: model_kwargs)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer



    source = resolve_model(recipe.model)
    kwargs = model_kwargs(recipe, precision) if kwargs is None else kwargs
    apply_profile()  # under a device profile (COURSE_PROFILE=t4): its attention kernels and memory cap
    local = Path(source).is_dir()  # a download keeps its progress bar; a local load's bar would pile up
    try:
        with no_progress_bars() if local else contextlib.nullcontext():
            model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except OSError as exc:  # a hub id that is gated, unknown or unreachable: one line that says what to do
        if local:
            raise
        raise hub_error(recipe.model, exc) from None
    check_positions(recipe.model, recipe.max_seq_length, getattr(model.config, "max_position_embeddings", None))
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token is None:  # Llama tokenizers ship without one
        tokenizer.pad_token = tokenizer.eos_token
    model.config.use_cache = False  # the KV cache is for generation; training does not need it
    one_4bit_format_on_every_cpu(model)
    return model, tokenizer


def one_4bit_format_on_every_cpu(model) -> None:
    """Keep bitsandbytes' 4-bit weights in the format they were loaded in on any CPU. On a CPU with AVX512-BF16,
    bitsandbytes 0.50 repacks each Linear4bit weight for its own kernel at the first no-grad eval forward
    (bf16 absmax, no nested double quantization): the same model then weighs other bytes (the tiny model
    19,712 more) and computes with other kernels than on an AVX2 CPU. Training never repacks (train mode);
    generation and the merge's before/after logits did. GPUs are untouched."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):  # bitsandbytes.nn.Linear4bit
            module.support_avx512bf16_for_cpu = False


def linear_module_names(model) -> list[str]:
    """The distinct last-name parts of the model's linear layers (what LoRA can target)."""
    import torch

    names = set()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) or type(module).__name__ in ("Linear4bit", "Linear8bitLt"):
            names.add(name.rsplit(".", 1)[-1])
    return sorted(names)


def check_lora_targets(model, targets: tuple[str, ...]) -> None:
    """A LoRA target the model lacks is an error that lists the ones it has."""
    available = linear_module_names(model)
    missing = [t for t in targets if t not in available]
    if missing:
        raise RecipeError(
            f"LoRA target module(s) {missing} not found in this model. "
            f"Its linear layers are: {available}. Pick lora_targets from those."
        )


def lora_config(recipe: Recipe):
    """peft's LoraConfig for the recipe, or None for a full fine-tune."""
    if not recipe.uses_lora:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=recipe.lora_r,
        lora_alpha=recipe.lora_alpha,
        lora_dropout=recipe.lora_dropout,
        target_modules=list(recipe.lora_targets),
        bias="none",
        task_type="CAUSAL_LM",
    )


def sft_config(recipe: Recipe, precision: str, output_dir: str, config_class=None):
    """trl's SFTConfig for the recipe. Every value the chapter teaches is set explicitly. `config_class=dict`
    gives the arguments as they are passed (library_objects: an SFTConfig checks the machine, e.g. tf32's GPU).

    `bf16`/`fp16` are always passed: SFTConfig() turns bf16 on by default, which fails on a CPU.
    Sequences are packed into blocks of exactly max_seq_length tokens ('wrapped'), so every step
    sees the same number of tokens and the peak does not depend on which examples met in a batch.
    """
    import torch

    if config_class is None:
        from trl import SFTConfig
    else:
        SFTConfig = config_class

    on_cpu = not torch.cuda.is_available()
    return SFTConfig(
        output_dir=output_dir,
        max_steps=recipe.steps,
        per_device_train_batch_size=recipe.micro_batch,
        gradient_accumulation_steps=recipe.grad_accum,
        learning_rate=recipe.learning_rate,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        activation_checkpointing=recipe.gradient_checkpointing,  # transformers 5 name of gradient checkpointing
        activation_checkpointing_kwargs={"use_reentrant": recipe.reentrant_checkpointing}  # False: the course's
        if recipe.gradient_checkpointing else None,  # True: the first forward builds no graph (notebook 09)
        optim=recipe.optimizer,
        max_length=recipe.max_seq_length,
        packing=True,
        packing_strategy="wrapped",
        dataset_text_field="text",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=recipe.seed,
        data_seed=recipe.seed,
        dataloader_num_workers=0,
        dataloader_drop_last=True,  # every micro-batch holds micro_batch sequences, the last of an epoch too
        dataloader_pin_memory=not on_cpu,
        disable_tqdm=True,
        use_cpu=on_cpu,
        use_liger_kernel=recipe.liger_kernels,
        torch_compile=recipe.torch_compile,
        activation_offloading=recipe.offload_activations,
        tf32=True if recipe.tf32 else None,  # None leaves torch's default (no TF32 for matmuls)
        logging_nan_inf_filter=not recipe.lean_host,  # True: an isnan/isinf check (a GPU wait) per micro-batch
    )


def sft_config_kwargs_used() -> set[str]:
    """Names of the arguments sft_config() passes (for the API-drift test)."""
    import inspect
    import re

    body = inspect.getsource(sft_config)
    call = body[body.index("SFTConfig(") :]
    return set(re.findall(r"\n\s+(\w+)=", call))


def prepare_kbit_kwargs(recipe: Recipe) -> dict | None:
    """peft's prepare_model_for_kbit_training(model, **these) for a 4-bit recipe that asks for it, else None (not
    called: trl 1.x's SFTTrainer never calls it either)."""
    if not (recipe.load_in_4bit and recipe.prepare_kbit):
        return None
    # peft upcasts every non-quantized weight (embeddings, norms, lm_head) to fp32 here, and by
    # default turns on gradient checkpointing; we let the recipe decide that.
    return dict(use_gradient_checkpointing=recipe.gradient_checkpointing,
                activation_checkpointing_kwargs={"use_reentrant": recipe.reentrant_checkpointing})


@dataclass
class LibraryObjects:
    """What a recipe trains with, in transformers', peft's, trl's and bitsandbytes' own objects: build() uses
    exactly these, the README's field table and the notebooks' "In your own script" cells are tested against them."""

    recipe: Recipe
    precision: str  # the resolved precision: fp32, bf16 or fp16
    quantization_config: Any  # transformers.BitsAndBytesConfig, or None (no 4-bit loading)
    model_kwargs: dict  # AutoModelForCausalLM.from_pretrained(model_id, **model_kwargs)
    prepare_kbit_kwargs: dict | None  # peft.prepare_model_for_kbit_training(model, **these), or None: not called
    lora_config: Any  # peft.LoraConfig for get_peft_model, or None (a full fine-tune: every weight trains)
    sft_kwargs: dict  # trl.SFTConfig(**sft_kwargs), output_dir included
    course_steps: tuple[str, ...]  # what build does that no library argument says

    @property
    def sft_config(self):
        """trl's SFTConfig(**sft_kwargs) (made here: it checks the machine, e.g. that tf32 has its GPU)."""
        from trl import SFTConfig

        return SFTConfig(**self.sft_kwargs)


def library_objects(recipe: Recipe, precision: str | None = None, *, output_dir: str = "course-run",
                    fsdp: bool | None = None) -> LibraryObjects:
    """The library objects `recipe` trains with. `precision`: the resolved one (default: the recipe's, with 'auto'
    resolved on this machine; give 'bf16' or 'fp16' to see an 'auto' recipe as a GPU trains it). `fsdp`: whether
    FSDP shards the model (default: this process's accelerate launch says so). No hardware is checked here."""
    if precision is None:
        precision = resolve_precision(recipe.precision) if recipe.precision == "auto" else recipe.precision
    elif recipe.precision not in ("auto", precision):
        raise RecipeError(f"library_objects: the recipe says precision={recipe.precision!r}, not {precision!r}; "
                          "give precision only to resolve 'auto'.")
    kwargs = model_kwargs(recipe, precision, fsdp=fsdp)
    steps = ["packed blocks shorter than max_length are dropped",
             "the data is cut to whole optimizer steps (micro_batch x grad_accum blocks)"]
    if recipe.load_in_4bit and precision != "bf16":
        steps.append("trainable bf16 weights (trl's LoRA cast on 4-bit models) are recast to fp32")
    if recipe.offload_embeddings:
        steps.append("the input embedding table is kept in CPU memory (course hooks, build.offload_input_embeddings)")
    if recipe.fused_lora and recipe.load_in_4bit:
        steps.append("each 4-bit linear runs with its LoRA adapter as one autograd function (fused_lora.fuse_lora)")
    if recipe.compile_layers and recipe.gradient_checkpointing:
        steps.append("each decoder layer's forward is compiled inside its checkpoint (compiled_layers.callback)")
    return LibraryObjects(
        recipe=recipe, precision=precision, quantization_config=kwargs["quantization_config"], model_kwargs=kwargs,
        prepare_kbit_kwargs=prepare_kbit_kwargs(recipe), lora_config=lora_config(recipe),
        sft_kwargs=sft_config(recipe, precision, output_dir, dict),
        course_steps=tuple(steps))


def training_dataset(recipe: Recipe):
    """The chapter's data, dolly-style instructions, as one "text" column.

    The embedded tiny model and the random-weight presets always train on the shipped set (their
    tokenizer was trained on it, and their runs must not depend on the network); a hub model takes
    databricks-dolly-15k from the hub when it can, and says so when it falls back.
    """
    from course_utils.data import load_instructions, to_text_dataset

    return to_text_dataset(load_instructions("dolly", source="shipped" if uses_shipped_data(recipe.model) else "auto"))


def build(recipe: Recipe, *, callbacks: tuple = (), output_dir: str | None = None, dataset=None,
          checked: bool = False) -> Built:
    """Turn a recipe into a ready SFTTrainer on this machine's device. checked=True: the caller ran
    checks.check_runnable on it in this process (measure does), so the hardware is not checked again."""
    import torch
    from peft import get_peft_model, prepare_model_for_kbit_training
    from transformers import set_seed
    from trl import SFTTrainer

    precision = resolve_precision(recipe.precision) if checked else check_hardware(recipe)
    notes: list[str] = []
    if recipe.precision == "auto":
        notes.append(f"precision=auto resolved to {precision} on {device_type()}")
    if recipe.optimizer.startswith("paged_") and device_type() == "cpu":
        notes.append(f"{recipe.optimizer}: bitsandbytes does not page on a CPU and falls back to unpaged state")
    profile_note = apply_profile()
    if profile_note:
        notes.append(profile_note)
    objects = library_objects(recipe, precision, output_dir=output_dir or tempfile.mkdtemp(prefix="course-run-"))
    model, tokenizer = load_model(recipe, precision, objects.model_kwargs)

    if objects.prepare_kbit_kwargs is not None:
        model = prepare_model_for_kbit_training(model, **objects.prepare_kbit_kwargs)
        notes.append("prepare_model_for_kbit_training upcast the non-quantized weights to fp32")

    if recipe.offload_embeddings and not recipe.uses_lora:
        raise RecipeError("offload_embeddings=True needs a frozen embedding table (LoRA or QLoRA), not a full "
                          "fine-tune, which trains it. Set offload_embeddings=False or lora_r=16.")
    if recipe.uses_lora:
        check_lora_targets(model, recipe.lora_targets)
        set_seed(recipe.seed)  # LoRA's initial weights come from the global generator
        model = get_peft_model(model, objects.lora_config)
    else:
        for p in model.parameters():
            p.requires_grad_(True)

    import datasets

    args = objects.sft_config
    data = dataset if dataset is not None else training_dataset(recipe)
    key = _packed_key(data, tokenizer, args)
    packed = _PACKED.get(key) if key is not None else None
    if packed is not None:  # this process packed the same data with the same tokenizer before: trl would repeat it
        args.dataset_kwargs = {**(args.dataset_kwargs or {}), "skip_prepare_dataset": True}
    datasets.disable_progress_bars()  # tokenizing and packing 1,200 records takes a second
    if recipe.lean_host:  # the same training, without the host waiting for the GPU inside a micro-batch
        from course_utils.lean_trainer import LeanSFTTrainer as SFTTrainer  # noqa: N814
    try:
        trainer = SFTTrainer(
            model=model,
            args=args,
            train_dataset=data if packed is None else packed,
            processing_class=tokenizer,
            callbacks=list(callbacks),
        )
        if packed is None:
            # 'wrapped' packing leaves one short block per 1,000 records; drop them, so that every
            # micro-batch is exactly micro_batch x max_seq_length tokens, with no padding and no mask
            full = recipe.max_seq_length
            trainer.train_dataset = trainer.train_dataset.filter(lambda row: len(row["input_ids"]) == full)
            if key is not None:
                _PACKED[key] = trainer.train_dataset
    finally:
        datasets.enable_progress_bars()
    check_packed(recipe, len(trainer.train_dataset))
    kept = whole_steps(len(trainer.train_dataset), recipe)
    if kept < len(trainer.train_dataset):
        trainer.train_dataset = trainer.train_dataset.select(range(kept))
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # the losses are recorded, not printed
    if recipe.load_in_4bit and precision != "bf16":
        # trl casts LoRA weights of quantized models to bf16 (the QLoRA paper's choice). Without
        # native bf16 that is slow (CPU) or wrong for fp16 AMP (T4), so we keep them in fp32.
        for p in trainer.model.parameters():
            if p.requires_grad and p.dtype == torch.bfloat16:
                p.data = p.data.float()
        notes.append("LoRA weights kept in fp32 (trl casts them to bf16 on 4-bit models)")
    if recipe.offload_embeddings:
        note = offload_input_embeddings(trainer.model)
        notes.append(note or "offload_embeddings: the model already runs on the CPU, so the table stays where it is")
    if recipe.liger_kernels:
        notes.append("Liger kernels for RMSNorm, SwiGLU and RoPE (trl keeps its own fused, chunked loss)")
    if recipe.fused_lora and recipe.load_in_4bit:  # it acts on 4-bit linears only (TECHNIQUES' needs)
        from course_utils.fused_lora import fuse_lora

        notes.append(fuse_lora(trainer.model))
    if recipe.compile_layers and recipe.gradient_checkpointing:  # once Trainer.train has turned checkpointing on
        from course_utils.compiled_layers import callback

        trainer.add_callback(callback())
        notes.append("each decoder layer's forward compiled inside its checkpoint when training begins (torch.compile): "
                     "the peak by category misses the buffers Inductor makes inside a layer; the allocator's peak has them")
    if recipe.lean_host:
        notes.append("lean host: trl's metrics read once per log, no NaN/Inf check per micro-batch (lean_trainer.py)")
    trainer.model.train()  # from_pretrained returns eval mode, where checkpointing does nothing
    return Built(recipe=recipe, precision=precision, model=trainer.model, tokenizer=tokenizer,
                 trainer=trainer, notes=notes)


_PACKED: dict[tuple, Any] = {}  # _packed_key -> the packed, filtered blocks (a Dataset is not changed in place)


def _packed_key(data, tokenizer, args) -> tuple | None:
    """Everything trl's tokenizing and packing of `data` reads (SFTTrainer._prepare_dataset): the data's content
    fingerprint, the tokenizer's content, and the SFTConfig fields it uses. None (no reuse) when the data has no
    fingerprint (an IterableDataset) or the tokenizer is not a fast one that can be serialized."""
    import hashlib

    fingerprint = getattr(data, "_fingerprint", None)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if fingerprint is None or backend is None:
        return None
    vocab = hashlib.sha256(backend.to_str().encode()).hexdigest()
    return (fingerprint, vocab, type(tokenizer).__name__, tokenizer.eos_token, tokenizer.chat_template,
            *(str(getattr(args, name)) for name in (
                "max_length", "packing", "packing_strategy", "dataset_text_field", "shuffle_dataset", "seed",
                "truncation_mode", "assistant_only_loss", "completion_only_loss", "padding_free", "dataset_kwargs")))


def whole_steps(blocks: int, recipe: Recipe, world: int | None = None) -> int:
    """How many of `blocks` packed blocks a run trains on: whole optimizer steps (micro_batch x grad_accum blocks
    on each of the `world` processes; default: torchrun's world size, distributed_rank.rank_info) when the data holds one. With a
    remainder, 1 x 16 would end each epoch on a short step of the leftover blocks while 16 x 1 drops them
    (dataloader_drop_last), and from there on the two would train on other data; so would 2 ranks of micro-batch 2
    against one process of micro-batch 4 (another length, another shuffle)."""

    world = world if world is not None else rank_info()[1]
    per_step = recipe.micro_batch * recipe.grad_accum * max(1, world)
    return blocks - blocks % per_step if blocks >= per_step else blocks


def check_packed(recipe: Recipe, sequences: int) -> None:
    """The packed data must hold one whole micro-batch; fewer sequences would train a smaller batch than
    the one recorded (a wrong measurement)."""
    if sequences < recipe.micro_batch:
        raise RecipeError(
            f"The training data packs into {sequences} sequences of {recipe.max_seq_length} tokens, fewer than "
            f"one micro-batch of {recipe.micro_batch}. Use micro_batch <= {sequences}, or a shorter max_seq_length.")
