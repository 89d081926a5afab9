"""from_library and `course estimate --config`: the libraries' objects and trl's YAML read back into a Recipe;
what the course does not model is named (an error when it changes the memory, a warning when it cannot)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch

from course_utils.build import library_objects
from course_utils.cli import main
from course_utils.from_library import LibraryConfigError, from_library, LibraryConfigWarning, read_objects, read_trl_config
from course_utils.chapter.own_script import expected
from course_utils.recipe import Recipe, source_chapter_recipe

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXAMPLES = (("examples/smollm2-360m-t4.yaml", ["--hardware", "t4"]), ("examples/llama-3.1-8b-16gb.yaml", []))


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def block(name: str) -> str:
    text = README.read_text(encoding="utf-8")
    return text.split(f"<!-- {name} -->\n", 1)[1].split(f"\n<!-- /{name} -->", 1)[0]


def config_estimates() -> str:
    """The README block: each example's command and what it prints."""
    parts = []
    for path, flags in EXAMPLES:
        code, out, _ = run("estimate", "--config", path, *flags)
        assert code == 0
        parts.append(f"$ course estimate --config {' '.join([path, *flags])}\n{out.rstrip()}")
    return "```text\n" + "\n\n".join(parts) + "\n```"


def test_readme_config_estimates_are_printed(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert block("config-estimates") == config_estimates()


def test_example_configs_read_offline_as_presets(monkeypatch):
    import socket

    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("no network"))
    small = read_trl_config(str(ROOT / "examples/smollm2-360m-t4.yaml")).recipe
    assert (small.model, small.precision, small.micro_batch, small.grad_accum, small.max_seq_length) == (
        "smollm2-360m", "fp16", 8, 2, 1024)
    big = read_trl_config(str(ROOT / "examples/llama-3.1-8b-16gb.yaml"))
    r = big.recipe
    assert (r.model, r.load_in_4bit, r.double_quant, r.prepare_kbit, r.optimizer) == (
        "llama-3.1-8b", True, True, False, "paged_adamw_8bit")  # trl's SFTTrainer: no prepare_model_for_kbit_training
    assert big.warnings == ["not modelled, no byte of a training step depends on them: dataset_name, output_dir, "
                            "report_to"]


@pytest.mark.parametrize("recipe", [
    source_chapter_recipe(),
    Recipe(model="llama-3.1-8b"),
    Recipe(model="llama-3.1-8b", lora_r=None, precision="fp16", gradient_checkpointing=True, optimizer="adamw_8bit"),
    Recipe(model="smollm2-360m", load_in_4bit=True, double_quant=False, prepare_kbit=False, precision="bf16",
           liger_kernels=True, lora_targets=("q_proj", "v_proj"), lora_r=8, lora_alpha=16, lora_dropout=0.1,
           micro_batch=2, grad_accum=8, max_seq_length=1024, learning_rate=1e-4, seed=3),
], ids=lambda r: r.describe())
def test_round_trip(recipe):
    """library_objects(from_library(objects)) is the objects, for every argument the course models."""
    from trl import SFTConfig

    o = library_objects(recipe, output_dir="out", fsdp=False)
    with pytest.warns(LibraryConfigWarning, match="max_steps"):  # the run's plumbing, named
        back = from_library(recipe.model, args=SFTConfig(**o.sft_kwargs), peft_config=o.lora_config,
                                   quantization_config=o.quantization_config, dtype=o.model_kwargs["dtype"],
                                   prepare_kbit=o.prepare_kbit_kwargs is not None)
    assert expected(library_objects(back, output_dir="out", fsdp=False)) == expected(o)
    assert back.with_(steps=recipe.steps, label="") == recipe.with_(label="")


def test_harmless_settings_warn_by_name():
    from trl import SFTConfig

    args = SFTConfig(output_dir="x", bf16=False, max_steps=5, logging_steps=3, weight_decay=0.1, packing=True,
                     packing_strategy="wrapped", activation_checkpointing=False)
    with pytest.warns(LibraryConfigWarning, match="logging_steps, max_steps, weight_decay"):
        r = from_library("llama-3.1-8b", args=args, dtype=torch.float32)
    assert r.lora_r is None and r.precision == "fp32" and not r.gradient_checkpointing


def test_dtype_not_given_is_said():
    from trl import SFTConfig

    read = read_objects("llama-3.1-8b", SFTConfig(output_dir="x", bf16=False, packing=True, packing_strategy="wrapped"))
    assert any("dtype not given" in w for w in read.warnings)


def write(tmp_path, text: str) -> str:
    path = tmp_path / "sft.yaml"
    path.write_text("model_name_or_path: meta-llama/Llama-3.1-8B\ndtype: bfloat16\n" + text)
    return str(path)


@pytest.mark.parametrize("text, named", [
    ("per_device_batch_size: 4\n", "unknown setting 'per_device_batch_size' (did you mean 'per_device_eval_batch_size' or "
                                     "'per_device_train_batch_size'?)"),
    ("use_peft: true\nuse_dora: true\n", "use_dora"),
    ("use_peft: true\nlora_modules_to_save: [lm_head]\n", "lora_modules_to_save"),
    ("load_in_8bit: true\n", "load_in_8bit=True"),
    ("fsdp: full_shard\n", "fsdp: several GPUs"),
    ("attn_implementation: eager\n", "attn_implementation=eager"),
    ("max_grad_norm: 1.0\nneftune_noise_alpha: 5\n", "neftune_noise_alpha=5"),
    ("fp16: true\nbf16: false\n", "dtype=bfloat16 with fp16 training"),
    ("activation_checkpointing_kwargs: {use_reentrant: true, preserve_rng_state: false}\n",
     "activation_checkpointing_kwargs"),
])
def test_unmodelled_setting_is_one_error_naming_it(tmp_path, text, named):
    code, out, err = run("estimate", "--config", write(tmp_path, text))
    assert code == 2 and out == ""
    assert err.startswith("course: error: sft.yaml: ") and named in err and len(err.strip().splitlines()) == 1


def test_reentrant_checkpointing_is_the_recipe_knob(tmp_path):
    read = read_trl_config(write(tmp_path, "activation_checkpointing_kwargs: {use_reentrant: true}\n"))
    assert read.recipe.reentrant_checkpointing and read.recipe.gradient_checkpointing
    assert not read_trl_config(write(tmp_path, "")).recipe.reentrant_checkpointing


def test_trl_defaults_are_trls(tmp_path):
    """A near-empty config trains as trl would: bf16, checkpointing on, micro-batch 8, max_length 1024, no packing
    (padded batches, said), adamw_torch_fused, a full fine-tune."""
    read = read_trl_config(write(tmp_path, ""))
    r = read.recipe
    assert (r.precision, r.gradient_checkpointing, r.micro_batch, r.max_seq_length, r.optimizer, r.lora_r) == (
        "bf16", True, 8, 1024, "adamw_torch_fused", None)
    assert read.padded and any("packing is off" in w for w in read.warnings)


def test_config_and_model_together_is_an_error():
    code, _, err = run("estimate", "--config", "examples/llama-3.1-8b-16gb.yaml", "--model", "tiny")
    assert code == 2 and "drop --model" in err


def test_config_flags_apply_on_top(monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, err = run("estimate", "--config", "examples/llama-3.1-8b-16gb.yaml", "--micro-batch", "1",
                         "--grad-accum", "16")
    assert code == 0 and "1x16" in out.splitlines()[0]


def test_missing_or_bad_file_is_named(tmp_path):
    code, _, err = run("estimate", "--config", str(tmp_path / "none.yaml"))
    assert code == 2 and "none.yaml" in err and "cannot be read" in err
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    code, _, err = run("estimate", "--config", str(tmp_path / "list.yaml"))
    assert code == 2 and "YAML mapping" in err


def test_a_non_lora_peft_config_is_refused():
    from peft import IA3Config

    with pytest.raises(LibraryConfigError, match="IA3Config"):
        from_library("llama-3.1-8b", peft_config=IA3Config(task_type="CAUSAL_LM"))
