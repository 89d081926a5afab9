"""Demonstrations that one notebook each needs, run in the notebook's own process. Each loads what it
shows, returns plain numbers, and gives the memory back before it returns: on a T4 the notebook's
kernel shares 14.75 GiB with the measuring processes that start after it.
"""

from __future__ import annotations

import functools

from .hardware import release_memory
from .recipe import Recipe
from .tables import wrap
from .common import GiB, MiB


def releases_memory(fn):
    """Run fn, then give the GPU memory its models held back to the card."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            release_memory()

    return wrapper


def weights_of(model: str, load_in_4bit: bool = False, double_quant: bool = True) -> dict[str, dict]:
    """Notebook 00 and 05: the model's weights by group (parameters, bytes, how stored, bits per parameter).
    4-bit weights are loaded and counted as stored; full-precision weights are counted on a weightless
    (meta) copy in the dtype a recipe loads them in (fp32), so an 8B model needs no 32 GB to count."""
    from .lessons_quant import quantized_weights, weight_groups

    if load_in_4bit:
        return quantized_weights(model, double_quant)[0]
    return weight_groups(skeleton(model))


def skeleton(model: str, dtype=None):
    """The model on the meta device: every shape and dtype, no memory (fp32 unless told)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from .models import resolve_model

    config = AutoConfig.from_pretrained(resolve_model(model))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)


def needs_4bit_here(model: str) -> bool:
    """True when the model's fp32 weights (and as much again for one step) do not fit what this
    process may use: a demonstration then loads it in 4-bit NF4 instead, and says so."""
    from .hardware import available_bytes

    weights = sum(p.numel() for p in skeleton(model).parameters()) * 4
    needed = 1.2 * weights
    if needed <= available_bytes():
        return False
    print(wrap(f"({model} in fp32 needs about {needed / GiB:.1f} GiB, more than this card leaves this process "
               f"({available_bytes() / GiB:.1f} GiB): this demonstration loads it in 4-bit NF4 instead.)"))
    return True


def lora_trainable(model: str, recipe: Recipe) -> dict[str, int]:
    """Notebooks 00 and 03: parameters of the whole model, of the LoRA adapters the recipe adds (r x (in +
    out) per adapted layer) and of the input embedding, counted on a weightless (meta) copy."""
    shape = skeleton(model)
    lora = sum(recipe.lora_r * (m.in_features + m.out_features) for name, m in shape.named_modules()
               if name.rsplit(".", 1)[-1] in recipe.lora_targets)
    return {"all": sum(p.numel() for p in shape.parameters()), "lora": lora,
            "embedding": shape.get_input_embeddings().weight.numel()}


def paging(model: str = "llama-3.1-8b") -> str:
    """Notebook 03: which optimizer states bitsandbytes pages (tensors of at least estimate.BNB_PAGE_MIN elements:
    none of LoRA's, nearly all of a full fine-tune's), and the H200 pair that shows what paging does to the
    measured peak (paged buffers live outside PyTorch's allocator). Lines are at most 100 characters."""
    from .estimate import BNB_PAGE_MIN, lora_shapes, model_shapes
    from .facts import ref
    from .recipe import source_chapter_recipe

    s, recipe, least = model_shapes(model), source_chapter_recipe(model), BNB_PAGE_MIN
    lora = [n for _, i, o in lora_shapes(recipe, s) for n in (recipe.lora_r * i, recipe.lora_r * o)] * s.layers
    full = [i * o for _, i, o in s.layer_linears] * s.layers + [s.embed_params] + (
        [s.lm_head_params] if s.lm_head_params else []) + [n for _, n, count in s.small_tensors for _ in range(count)]
    paged_full = [n for n in full if n >= least]
    lines = [f"bitsandbytes pages the optimizer state of tensors with at least {least:,} elements ({model}):",
             f"  LoRA r={recipe.lora_r} on q/k/v/o: {len(lora)} tensors of {min(lora):,} to {max(lora):,} elements: "
             f"{sum(n >= least for n in lora)} paged",
             f"  a full fine-tune: {len(paged_full)} of {len(full)} tensors paged, "
             f"{sum(paged_full) / sum(full):.4%} of the parameters"]
    unpaged, paged = ref("full FT bf16, ckpt, 1x16, adamw_8bit", model), ref("full FT bf16, ckpt, 1x16, paged 8-bit", model)
    if unpaged.run_id != paged.run_id:
        raise ValueError("the paged and unpaged reference runs come from different measurement runs")
    lines += [f"Measured on the {paged.env['device']} (run {paged.run_id}), a full fine-tune, 8-bit AdamW:",
              f"  unpaged: optimizer state {unpaged.mib('optimizer'):,.0f} MiB in PyTorch's allocator, "
              f"allocated peak {unpaged.cuda_max_allocated / 2**30:.1f} GiB",
              f"  paged:   {paged.mib('optimizer'):,.0f} MiB there, allocated peak {paged.cuda_max_allocated / 2**30:.1f} GiB: "
              "the rest is in unified memory, which PyTorch does not count",
              f"  same training: final loss {unpaged.final_loss:.3f} and {paged.final_loss:.3f}; "
              f"{unpaged.tokens_per_s:,.0f} and {paged.tokens_per_s:,.0f} tokens/s"]
    return wrap("\n".join(lines))


def sweep_base(base: Recipe) -> Recipe:
    """Notebook 06: the recipe its sweeps start from, with 1 warm-up, 1 tracked and 2 timed steps (enough for
    the bytes). A GPU-sized preset sweeps in 4-bit at the device's precision: in fp32 LoRA not one point of
    the Llama-3.1-8B sweep fits a free T4, so the picture would be empty there."""
    short = base.with_(steps=4, warmup_steps=1)
    if needs_4bit_here(base.model):
        short = short.with_(load_in_4bit=True, precision="auto")
    return short


def sweep_values(model: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Notebook 06: the sequence lengths and micro-batches it sweeps, each twice the one before. On a CPU (the
    tiny model) three of each, which shows each doubling twice; on a GPU a fourth, the longest and largest."""
    from .hardware import device_type

    if device_type() == "cpu":
        return (64, 128, 256), (1, 2, 4)
    return (64, 128, 256, 512), (1, 2, 4, 8)


def growth(measurements, category: str) -> str:
    """Notebook 06: how much a category grows each time the knob doubles, point to point ('x1.98 x2.01 ...');
    a point that did not fit has no figure and is left out."""
    values = [m.peak_by_category[category] for m in measurements if m.fits]
    return " ".join(f"x{b / a:.2f}" for a, b in zip(values, values[1:]))


def load_for_inspection(model: str, load_in_4bit: bool, double_quant: bool = True, precision: str = "fp32"):
    """Notebooks 00, 01, 02 and 05: load a model as a recipe would (quantization included), without LoRA
    or a trainer."""
    from .build import check_hardware, load_model
    from .models import no_progress_bars

    recipe = Recipe(model=model, load_in_4bit=load_in_4bit, double_quant=double_quant, precision=precision)
    with no_progress_bars():  # a second-long load: no bar in a notebook's checked output
        loaded, _ = load_model(recipe, check_hardware(recipe))
    return loaded


@releases_memory
def lora_grads_under_checkpointing(model: str, use_reentrant: bool, input_grads: bool,
                                   seq: int = 64) -> tuple[int, int, str]:
    """Notebook 01: one forward and backward of a LoRA model with gradient checkpointing on: (LoRA tensors that
    got a gradient, LoRA tensors in all, the error backward raised or ""). Shows why reentrant
    checkpointing needs input gradients: it only back-propagates through a checkpointed layer if one of
    the layer's inputs requires grad, and with a frozen base model none does, so the loss has no graph at
    all and `loss.backward()`, which a Trainer calls, stops with a RuntimeError."""
    import warnings

    import torch
    from peft import get_peft_model

    from .build import lora_config

    recipe = Recipe(model=model, gradient_checkpointing=True)
    loaded = load_for_inspection(model, load_in_4bit=needs_4bit_here(model))
    set_seed_all(recipe.seed)
    peft_model = get_peft_model(loaded, lora_config(recipe))
    inner = peft_model.get_base_model()
    inner.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": use_reentrant})
    if not input_grads:  # transformers 5 turns input gradients on by itself; undo it to see why it does
        inner.disable_input_require_grads()
    peft_model.train()  # from_pretrained returns eval mode, where checkpointing does nothing
    ids = torch.randint(0, loaded.config.vocab_size, (1, seq), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that no input requires grad: that is the point
        loss = peft_model(input_ids=ids.to(loaded.device), labels=ids.to(loaded.device)).loss
        try:
            loss.backward()
            error = ""
        except RuntimeError as exc:  # what a learner's Trainer shows
            error = f"RuntimeError: {str(exc).splitlines()[0]}"
    lora = [p for n, p in peft_model.named_parameters() if "lora_" in n]
    with_grad = sum(1 for p in lora if p.grad is not None)  # lora_B starts at 0, so lora_A's first grad is 0
    return with_grad, len(lora), error


def set_seed_all(seed: int) -> None:
    """Notebooks 01 and 02: seed python, numpy and torch (transformers' set_seed)."""
    from transformers import set_seed

    set_seed(seed)


@releases_memory
def accumulated_gradients_match(model: str, micro_batch: int, grad_accum: int, seq: int = 64) -> tuple[bool, float]:
    """Notebook 02: gradients of one batch of micro_batch x grad_accum sequences, computed whole and computed by
    accumulation over micro-batches of `micro_batch`: (equal within 1e-5 relative, largest relative gap)."""
    import torch
    from peft import get_peft_model

    from .build import lora_config
    recipe = Recipe(model=model)
    loaded = load_for_inspection(model, load_in_4bit=needs_4bit_here(model))
    set_seed_all(recipe.seed)
    peft_model = get_peft_model(loaded, lora_config(recipe))
    peft_model.eval()  # no dropout: the two ways must see the same function
    batch = micro_batch * grad_accum
    ids = torch.randint(0, loaded.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    ids = ids.to(loaded.device)
    lora = [p for n, p in peft_model.named_parameters() if "lora_" in n]

    def grads() -> list:
        out = [p.grad.detach().clone() for p in lora]
        peft_model.zero_grad(set_to_none=True)
        return out

    peft_model(input_ids=ids, labels=ids).loss.backward()  # the whole batch at once
    whole = grads()
    for chunk in ids.split(micro_batch):  # the same batch, accumulated: each loss / grad_accum
        (peft_model(input_ids=chunk, labels=chunk).loss / grad_accum).backward()
    accumulated = grads()
    gap = max(((a - w).norm() / w.norm().clamp(min=1e-12)).item() for a, w in zip(accumulated, whole))
    return gap < 1e-5, gap


def trainable_table(model: str, recipe: Recipe):
    """Notebook 00: what a full fine-tune and the recipe's LoRA train (parameters, share of the model) and
    the fp32 gradients and AdamW state that costs: a tables.Table, counted by lora_trainable."""
    from .tables import Column, Table

    counts = lora_trainable(model, recipe)
    total = counts["all"]
    trained = (("full fine-tune", total), (f"LoRA r={recipe.lora_r} on {'/'.join(recipe.lora_targets)}", counts["lora"]))
    return Table([Column("what is trained", wrap=True), Column("trainable", fmt=",d"), Column("share", fmt=".2%"),
                  Column("gradients", "MiB", ".2f"), Column("AdamW state", "MiB", ".2f")],
                 [(what, n, n / total, n * 4 / MiB, n * 8 / MiB) for what, n in trained],
                 notes=["gradients: 4 B (fp32) per trainable parameter; AdamW state: exp_avg and exp_avg_sq, "
                        "2 x 4 B each."])


def checkpointed_inputs(model: str, recipe: Recipe) -> str:
    """Notebook 01: what checkpointing keeps, from the model's config: one layer's input (micro-batch x
    sequence x hidden size, fp32) and that for every layer."""
    from transformers import AutoConfig

    from .models import resolve_model

    config = AutoConfig.from_pretrained(resolve_model(model))
    hidden, layers = config.hidden_size, config.num_hidden_layers
    per_layer = recipe.micro_batch * recipe.max_seq_length * hidden * 4  # fp32: 4 bytes per number
    return (f"one layer's input: {recipe.micro_batch} x {recipe.max_seq_length} x {hidden} x 4 B = "
            f"{per_layer / MiB:.2f} MiB\nkept with checkpointing, {layers} layers: {layers * per_layer / MiB:.2f} MiB")


def optimizer_states(model: str, recipe: Recipe) -> str:
    """Notebook 03: AdamW's state (2 x 4 B a trainable parameter) against 8-bit AdamW's (about 2 x 1 B) for
    the recipe's LoRA and a full fine-tune, and with the embedding kept at 32-bit as bitsandbytes does."""
    counts = lora_trainable(model, recipe)  # counted on a weightless (meta) copy of the model
    every, lora, embedding = counts["all"], counts["lora"], counts["embedding"]
    adapted = "/".join(t.removesuffix("_proj") for t in recipe.lora_targets)
    lines = [f"{what:22} {n:>12,} trainable: AdamW {n * 8 / MiB:8.2f} MiB, 8-bit AdamW about {n * 2 / MiB:7.2f} MiB"
             for what, n in ((f"LoRA r={recipe.lora_r} on {adapted}", lora), ("full fine-tune", every))]
    eight_bit = (every - embedding) * 2 + embedding * 8
    return "\n".join(lines + [f"full fine-tune, embedding ({embedding:,}) kept at 32-bit: 8-bit AdamW about "
                              f"{eight_bit / MiB:.2f} MiB"])


def precision_points(measured: list, skipped: dict) -> list:
    """Notebook 04: the ladder's rungs that ran, and on a CPU with native bf16 the last of them again in
    bf16 (precision='auto' is fp32 on a CPU, so the ladder alone shows no 16-bit bytes there)."""
    from .hardware import bf16_supported, device_type
    from .measure import measure

    shown = [m for i, m in enumerate(measured) if i not in skipped]
    if device_type() == "cpu" and bf16_supported():
        shown.append(measure(shown[-1].recipe_obj.with_(precision="bf16", label="bf16 (this CPU, for the bytes)")))
    return shown


def tf32_reference() -> list:
    """Notebook 04: the shipped TF32 run (course_utils/reference/tf32, scripts/reference_runs.py --set
    tf32-llama-3.1-8b): LoRA on the Llama-3.1-8B architecture in fp32, fp32 with TF32 matmuls, and bf16,
    measured in one run on one GPU, so their speeds can be compared."""
    from .results import shipped_results

    return shipped_results("tf32", "llama-3.1-8b.jsonl")


def _by_kind(runs: list) -> dict:
    """{'fp32' | 'tf32' | 'bf16': Measurement} of the TF32 runs."""
    return {("tf32" if m.recipe.get("tf32") else m.precision): m for m in runs}


def tf32_run(kind: str):
    """Notebook 04 and its quiz: the shipped TF32 run's 'fp32', 'tf32' or 'bf16' Measurement."""
    by = _by_kind(tf32_reference())
    if kind not in by:
        raise KeyError(f"no TF32 reference run {kind!r}; there are: {sorted(by)}")
    return by[kind]


def tf32_summary(runs: list | None = None) -> str:
    """Notebook 04: what TF32 did in the shipped run, every figure read from it: the same bytes as fp32 (TF32
    changes how a matmul multiplies, not what is stored), the speed against fp32 and bf16, the final losses;
    and whether this machine can use it (compute capability 8.0 or more)."""
    from .hardware import compute_capability, device_type

    runs = tf32_reference() if runs is None else runs
    by = _by_kind(runs)
    fp32, tf32, bf16 = by["fp32"], by["tf32"], by["bf16"]
    if not len({m.run_id for m in (fp32, tf32, bf16)}) == 1:
        raise ValueError("the TF32 reference runs come from different measurement runs: their speeds do not compare")
    gib = lambda m: m.cuda_max_allocated / GiB  # noqa: E731
    same = ("the same bytes" if tf32.cuda_max_allocated == fp32.cuda_max_allocated
            else f"x{gib(tf32) / gib(fp32):.3f} of fp32's bytes")
    cc = compute_capability()
    here = ("this machine has no CUDA GPU: TF32 is a GPU setting" if device_type() != "cuda" else
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
