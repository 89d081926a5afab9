"""build: the libraries' current APIs, the tiny model in-process, the early errors, the presets."""

from __future__ import annotations

import ast
import inspect
import socket
import textwrap

import pytest
import torch

from course_utils import build as build_mod
from course_utils import checks
from course_utils import machine as hardware
from course_utils import models
from course_utils.build import build, lora_config, quantization_config, sft_config
from course_utils.machine import HardwareError
from course_utils.memtrack import model_state_tensors, tensor_bytes
from course_utils.models import ModelUnavailableError
from course_utils.recipe import Recipe, RecipeError

SMALL = dict(micro_batch=2, max_seq_length=64)


def call_keywords(func, callee: str) -> set[str]:
    """Keyword names of the call to `callee(...)` inside `func`'s source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == callee]
    assert len(calls) == 1, f"expected one {callee}(...) call in {func.__name__}"
    assert all(kw.arg is not None for kw in calls[0].keywords), "no **kwargs expected"
    return {kw.arg for kw in calls[0].keywords}


def accepted_names(cls) -> set[str]:
    """Explicit parameters of cls (a catch-all **kwargs does not count: it would swallow a typo)."""
    params = inspect.signature(cls).parameters.values()
    return {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


# --- API drift -----------------------------------------------------------------------------------


def test_sft_config_kwargs_exist_in_installed_trl():
    from trl import SFTConfig

    used = build_mod.sft_config_kwargs_used()
    assert used == call_keywords(sft_config, "SFTConfig")  # the helper sees every argument
    assert len(used) >= 20
    assert used - accepted_names(SFTConfig) == set()


def test_lora_config_kwargs_exist_in_installed_peft():
    from peft import LoraConfig

    used = call_keywords(lora_config, "LoraConfig")
    assert {"r", "lora_alpha", "lora_dropout", "target_modules"} <= used
    assert used - accepted_names(LoraConfig) == set()
    cfg = lora_config(Recipe(lora_r=8, lora_alpha=24, lora_dropout=0.1, lora_targets=("q_proj", "v_proj")))
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout) == (8, 24, 0.1)
    assert set(cfg.target_modules) == {"q_proj", "v_proj"}
    assert cfg.bias == "none"
    assert str(cfg.task_type.value if hasattr(cfg.task_type, "value") else cfg.task_type) == "CAUSAL_LM"


def test_bitsandbytes_config_kwargs_exist_in_installed_transformers():
    from transformers import BitsAndBytesConfig

    used = call_keywords(quantization_config, "BitsAndBytesConfig")
    assert used - accepted_names(BitsAndBytesConfig) == set()
    assert quantization_config(Recipe(), "fp32") is None
    cfg = quantization_config(Recipe(load_in_4bit=True, double_quant=False), "fp32")
    assert cfg.load_in_4bit is True and cfg.load_in_8bit is False
    assert cfg.bnb_4bit_quant_type == "nf4"
    assert cfg.bnb_4bit_use_double_quant is False
    assert cfg.bnb_4bit_compute_dtype == torch.float32
    cfg = quantization_config(Recipe(load_in_4bit=True), "bf16")
    assert cfg.bnb_4bit_use_double_quant is True
    assert cfg.bnb_4bit_compute_dtype == torch.bfloat16
    assert quantization_config(Recipe(load_in_4bit=True), "fp16").bnb_4bit_compute_dtype == torch.float16


def test_sft_config_carries_the_recipe(tmp_path):
    r = Recipe(micro_batch=3, grad_accum=5, max_seq_length=96, steps=7, optimizer="adamw_8bit",
               gradient_checkpointing=True, learning_rate=5e-4, seed=3)
    args = sft_config(r, "fp32", str(tmp_path))
    assert args.max_steps == 7
    assert args.per_device_train_batch_size == 3
    assert args.gradient_accumulation_steps == 5
    assert args.max_length == 96
    assert args.learning_rate == 5e-4
    assert args.gradient_checkpointing is True
    assert args.gradient_checkpointing_kwargs == {"use_reentrant": False}
    assert str(args.optim.value if hasattr(args.optim, "value") else args.optim) == "adamw_8bit"
    assert args.packing is True
    assert args.bf16 is False and args.fp16 is False
    assert args.seed == 3
    assert args.use_cpu is (not torch.cuda.is_available())


def test_torch_dtype():
    assert build_mod.torch_dtype("bf16", full_finetune=False) == torch.bfloat16
    assert build_mod.torch_dtype("fp16", full_finetune=False) == torch.float16
    assert build_mod.torch_dtype("fp16", full_finetune=True) == torch.float32  # AMP needs fp32 masters
    assert build_mod.torch_dtype("fp32", full_finetune=False) == torch.float32


# --- the tiny model, in-process ------------------------------------------------------------------


@pytest.fixture(scope="module")
def built_fp32(tiny_model):
    return build(Recipe(steps=3, warmup_steps=1, **SMALL))


def test_build_returns_a_training_lora_model(built_fp32):
    b = built_fp32
    assert b.precision == "fp32"
    assert b.model is b.trainer.model
    assert b.model.training
    assert all(m.training for m in b.model.modules())
    assert b.trainer.args.max_steps == 3
    trainable = [n for n, p in b.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert all(p.dtype == torch.float32 for p in b.model.parameters())
    assert b.notes == []


def test_every_micro_batch_is_full_of_real_tokens(built_fp32):
    """trl's wrapped packing: each row is max_seq_length tokens of text, no padding, so padding-free batching (issue
    16's last candidate) has nothing to take out of these recipes' steps."""
    b, r = built_fp32, built_fp32.recipe
    pad = b.tokenizer.pad_token_id
    for i, batch in zip(range(3), b.trainer.get_train_dataloader()):
        assert tuple(batch["input_ids"].shape) == (r.micro_batch, r.max_seq_length), i
        assert pad is None or not (batch["input_ids"] == pad).any()
        assert "attention_mask" not in batch or bool(batch["attention_mask"].all())


def test_one_x_sixteen_and_sixteen_x_one_train_on_the_same_blocks(tiny_model):
    """The data holds whole optimizer steps, so 1 x 16 and 16 x 1 put the same blocks in every step, the last of
    an epoch too (with a remainder, 1 x 16 ended the epoch on a short step that 16 x 1 dropped: the H200's 8-step
    peer run diverged from step 6 on)."""
    every = len(build(Recipe(micro_batch=1, max_seq_length=256, steps=3, warmup_steps=1)).trainer.train_dataset)
    assert every % 16, "the data packs into whole steps of 16 blocks: this test needs a remainder to mean anything"
    steps = {}
    for mb, ga in ((1, 16), (16, 1)):
        b = build(Recipe(micro_batch=mb, grad_accum=ga, max_seq_length=256, steps=3, warmup_steps=1))
        assert len(b.trainer.train_dataset) == every - every % 16
        rows = [tuple(r) for batch in b.trainer.get_train_dataloader() for r in batch["input_ids"].tolist()]
        steps[mb] = [sorted(rows[i:i + 16]) for i in range(0, len(rows), 16)]
    assert steps[1] == steps[16] and len(steps[1]) >= 5


def test_whole_steps_count_every_process_of_a_step(monkeypatch):
    from course_utils.build import whole_steps

    r = Recipe(micro_batch=2, grad_accum=4)
    assert whole_steps(100, r) == 96 and whole_steps(100, r, world=2) == 96 and whole_steps(100, r, world=3) == 96
    assert whole_steps(100, Recipe(micro_batch=4, grad_accum=4), world=2) == 96 and whole_steps(7, r) == 7
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert whole_steps(90, r) == 80  # 2 ranks x 2 x 4 blocks a step, from torchrun's WORLD_SIZE


def test_auto_precision_is_noted(tiny_model, monkeypatch):
    monkeypatch.setattr(hardware, "device_type", lambda: "cpu")
    monkeypatch.setattr(build_mod, "device_type", lambda: "cpu")
    b = build(Recipe(precision="auto", steps=3, warmup_steps=1, **SMALL))
    assert b.precision == "fp32"
    assert any("precision=auto resolved to fp32" in n for n in b.notes)


def test_full_finetune_trains_every_weight(tiny_model):
    b = build(Recipe(lora_r=None, steps=3, warmup_steps=1, **SMALL))
    params = list(b.model.parameters())
    assert params and all(p.requires_grad for p in params)
    assert not any("lora_" in n for n, _ in b.model.named_parameters())


def _attn_calls(model):
    """Count forward entries of the first decoder layer's attention (pre-hooks also fire on a recompute)."""
    calls = []
    layer = next(m for n, m in model.named_modules() if n.endswith("layers.0"))
    handle = layer.self_attn.register_forward_pre_hook(lambda *a: calls.append(1))
    return calls, handle


def _checkpointing_on(model) -> bool:
    """transformers 5.x renamed is_gradient_checkpointing to is_activation_checkpointing."""
    flag = getattr(model, "is_activation_checkpointing", None)
    return bool(model.is_gradient_checkpointing if flag is None else flag)


def _one_batch_backward(built):
    batch = next(iter(built.trainer.get_train_dataloader()))
    built.model.zero_grad(set_to_none=True)
    built.model(**batch).loss.backward()


def test_lora_with_checkpointing_on_4bit_really_trains(tiny_model):
    steps = 2
    b = build(Recipe(load_in_4bit=True, gradient_checkpointing=True, steps=steps, warmup_steps=0,
                     learning_rate=1e-3, **SMALL))
    model = b.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    calls, handle = _attn_calls(model)
    b.trainer.train()
    handle.remove()
    assert _checkpointing_on(model)
    # each step runs the layer forward twice: the forward pass, and the recompute during backward
    assert len(calls) == 2 * steps

    lora = {n for n in before if "lora_" in n}
    assert lora
    for name, p in model.named_parameters():
        changed = not torch.equal(before[name], p.detach())
        assert changed == (name in lora), name  # LoRA weights moved, base weights did not

    # and a fresh backward reaches every LoRA weight (lora_B is no longer zero) and no base weight
    _one_batch_backward(b)
    for name, p in model.named_parameters():
        if name in lora:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None, name


def test_without_checkpointing_the_layer_runs_once(built_fp32):
    calls, handle = _attn_calls(built_fp32.model)
    try:
        _one_batch_backward(built_fp32)
    finally:
        handle.remove()
    assert not _checkpointing_on(built_fp32.model)
    assert len(calls) == 1


def test_4bit_loads_bitsandbytes_layers_and_is_smaller(tiny_model, built_fp32):
    import bitsandbytes as bnb

    b = build(Recipe(load_in_4bit=True, steps=3, warmup_steps=1, **SMALL))
    assert b.precision == "fp32"
    targets = [m for n, m in b.model.named_modules() if n.endswith(("q_proj", "k_proj", "v_proj", "o_proj"))]
    assert targets
    for m in targets:
        assert isinstance(m.base_layer, bnb.nn.Linear4bit)
        assert m.base_layer.weight.dtype == torch.uint8
    mlp = [m for n, m in b.model.named_modules() if n.endswith("down_proj")]
    assert mlp and all(isinstance(m, bnb.nn.Linear4bit) for m in mlp)  # every linear layer is 4-bit
    quantized = tensor_bytes(model_state_tensors(b.model))
    full = tensor_bytes(model_state_tensors(built_fp32.model))
    assert 0 < quantized < full
    lora = [p for n, p in b.model.named_parameters() if "lora_" in n]
    assert lora and all(p.dtype == torch.float32 and p.requires_grad for p in lora)
    assert any("fp32" in n for n in b.notes)


def test_missing_lora_target_lists_the_models_linear_layers(tiny_model):
    with pytest.raises(RecipeError) as exc:
        build(Recipe(lora_targets=("q_proj", "c_attn"), steps=3, warmup_steps=1, **SMALL))
    msg = str(exc.value)
    assert "c_attn" in msg
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"):
        assert name in msg


def _no_loading(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("build should fail before loading the model")

    monkeypatch.setattr(build_mod, "load_model", fail)


@pytest.mark.parametrize("recipe, what", [
    (Recipe(load_in_4bit=True), "4-bit"),
    (Recipe(optimizer="adamw_8bit"), "adamw_8bit"),
    (Recipe(optimizer="paged_adamw_8bit"), "paged_adamw_8bit"),
])
def test_bitsandbytes_unusable_is_a_hardware_error_with_advice(monkeypatch, recipe, what):
    monkeypatch.setattr(checks, "bitsandbytes_status", lambda: (False, "simulated"))
    _no_loading(monkeypatch)
    with pytest.raises(HardwareError) as exc:
        build(recipe)
    msg = str(exc.value)
    assert what in msg
    assert "bitsandbytes" in msg and "simulated" in msg
    assert "pip install" in msg.lower() or "install bitsandbytes" in msg.lower()
    assert "load_in_4bit=False" in msg and "adamw_torch" in msg


def test_plain_recipe_does_not_need_bitsandbytes(tiny_model, monkeypatch):
    monkeypatch.setattr(checks, "bitsandbytes_status", lambda: (False, "simulated"))
    assert checks.check_hardware(Recipe()) == "fp32"


def test_bf16_forced_where_unsupported(monkeypatch):
    monkeypatch.setattr(hardware, "bf16_supported", lambda: False)
    _no_loading(monkeypatch)
    with pytest.raises(HardwareError, match="bf16"):
        build(Recipe(precision="bf16"))


def test_unreachable_hub_model_fails_at_once_with_advice(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))

    def no_network(*a, **k):
        raise AssertionError("no network lookup may happen when HF_HUB_OFFLINE is set")

    monkeypatch.setattr(socket, "create_connection", no_network)
    with pytest.raises(ModelUnavailableError) as exc:
        build(Recipe(model="meta-llama/Llama-3.1-8B"))
    msg = str(exc.value)
    assert "meta-llama/Llama-3.1-8B" in msg
    assert "tiny" in msg
    assert "llama-3.1-8b" in msg  # the presets are offered


def test_local_folder_and_tiny_resolve_without_the_hub(tiny_model, tmp_path):
    assert models.resolve_model("tiny") == str(tiny_model)
    assert models.resolve_model(str(tmp_path)) == str(tmp_path)
    with pytest.raises(ModelUnavailableError):
        models.resolve_model(str(tmp_path / "nope"))


# --- presets -------------------------------------------------------------------------------------

# name: (hidden, layers, heads, kv heads, vocab, intermediate, parameters) from each model's config.json / card
PUBLISHED = {
    "llama-3.1-8b": (4096, 32, 32, 8, 128256, 14336, 8.03e9),
    "llama-3.1-70b": (8192, 80, 64, 8, 128256, 28672, 70.55e9),
    "llama-2-7b": (4096, 32, 32, 32, 32000, 11008, 6.74e9),
    "llama-2-13b": (5120, 40, 40, 40, 32000, 13824, 13.02e9),
    "mistral-7b": (4096, 32, 32, 8, 32768, 14336, 7.25e9),
    "llama-3.2-1b": (2048, 16, 32, 8, 128256, 8192, 1.24e9),
    "smollm2-360m": (960, 32, 15, 5, 49152, 2560, 3.62e8),
}


def test_every_preset_is_checked():
    assert set(models.PRESETS) == set(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_shapes_and_size(name):
    from transformers import AutoModelForCausalLM

    hidden, layers, heads, kv, vocab, inter, size = PUBLISHED[name]
    cfg = models.preset_config(name)
    shape = (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
             cfg.vocab_size, cfg.intermediate_size)
    assert shape == (hidden, layers, heads, kv, vocab, inter)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert abs(n - size) / size < 0.01, f"{name}: {n / 1e9:.2f}B parameters, published {size / 1e9:.2f}B"
    if name.startswith("llama-3"):
        assert cfg.rope_parameters["rope_type"] == "llama3"
        assert cfg.rope_parameters["rope_theta"] == 500000.0
    assert models.is_preset(name) and models.is_preset(name.upper())


def test_preset_names_are_case_insensitive():
    assert models.preset_config("Llama-3.1-8B").hidden_size == 4096
