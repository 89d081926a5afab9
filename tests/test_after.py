"""after: save the adapter, reload it in a fresh process and generate, merge it (4-bit and fp32), memory stats.

One tiny LoRA run of 4 steps is shared by every test (module fixture); one subprocess generates.
"""

from __future__ import annotations

import json
import math
import os

import pytest

from course_utils.chapter import after_training as after
from course_utils.chapter import merging
from course_utils.chapter.after_training import AdapterError
from course_utils.recipe import Recipe, RecipeError
from course_utils.show.tables import WIDTH

RECIPE = Recipe(model="tiny", micro_batch=2, max_seq_length=128, steps=4, warmup_steps=0, learning_rate=1e-3,
                label="after test")


def folded(text: str) -> str:
    """The text on one line (the formatters wrap at tables.WIDTH), after checking that it does."""
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    return " ".join(text.split())


@pytest.fixture(scope="module")
def saved(tiny_model, tmp_path_factory):
    """The tiny model, LoRA-trained for 4 steps and saved as the chapter's script saves it."""
    return after.train_and_save(RECIPE, tmp_path_factory.mktemp("adapter") / "qlora-adapter")


@pytest.fixture(scope="module")
def generated(saved):
    """Before/after continuations from `python -m course_utils.chapter.after_training generate` (a fresh process)."""
    return after.generate_before_after(saved.folder, max_new_tokens=8)


# --- 1. save -------------------------------------------------------------------------------------
def test_train_and_save_writes_the_adapter_the_tokenizer_and_the_recipe(saved):
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", after.RECIPE_FILE} <= set(saved.files)
    config = json.loads((saved.folder / "adapter_config.json").read_text())
    assert config["r"] == RECIPE.lora_r and sorted(config["target_modules"]) == sorted(RECIPE.lora_targets)
    assert after.saved_recipe(saved.folder) == RECIPE
    assert len(saved.losses) == RECIPE.steps and all(math.isfinite(x) for x in saved.losses)
    assert saved.losses[-1] < saved.losses[0]  # lr 1e-3 on a random-weight model: the loss falls at once


def test_train_and_save_refuses_what_it_cannot_save(tmp_path):
    with pytest.raises(RecipeError, match="full fine-tune"):
        after.train_and_save(RECIPE.with_(lora_r=None), tmp_path / "a")
    with pytest.raises(RecipeError, match="2 or more"):
        after.train_and_save(RECIPE, tmp_path / "a", steps=1)
    (tmp_path / "file").write_text("x")
    with pytest.raises(AdapterError, match="is a file"):
        after.train_and_save(RECIPE, tmp_path / "file")


def test_check_adapter_names_what_is_missing(tmp_path):
    with pytest.raises(AdapterError, match="adapter_config.json, adapter_model.safetensors missing"):
        after.check_adapter(tmp_path)
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "adapter_model.safetensors").write_text("")
    with pytest.raises(AdapterError, match="pass base="):
        after.generate_before_after(tmp_path)


# --- 2. prompts and generation -------------------------------------------------------------------
def test_prompts_are_the_training_format_with_the_response_open():
    from course_utils.data import corpus_text

    prompts, texts = after.data_prompts(3), set(corpus_text())
    assert len(prompts) == 3
    for p in prompts:
        assert p["prompt"].startswith("### Instruction:\n") and p["prompt"].endswith("### Response:\n")
        assert p["response"] and p["prompt"] + p["response"] in texts  # a training text, cut at its response
    assert len({p["prompt"] for p in prompts}) == 3
    with pytest.raises(AdapterError, match="positive number"):
        after.data_prompts(0)


def test_generation_runs_in_a_fresh_process_on_the_same_prompts(generated, saved):
    assert generated["pid"] != os.getpid()
    assert [r["prompt"] for r in generated["prompts"]] == [p["prompt"] for p in after.data_prompts()]
    for row in generated["prompts"]:
        assert 1 <= len(row["base_ids"]) <= 8 and 1 <= len(row["adapter_ids"]) <= 8  # fewer if it ends the text
        assert isinstance(row["base"], str) and isinstance(row["adapter"], str)
    assert any(r["base_ids"] != r["adapter_ids"] for r in generated["prompts"])  # training changed the continuation


def test_training_moves_the_continuation_toward_the_data(generated):
    """What a random-weight model can show after a few steps: the data's responses get likelier and the
    generated tokens are more often the data's common ones. Not sensible answers."""
    loss, freq = generated["response_loss"], generated["frequent"]
    assert loss["adapter"] < loss["base"]
    assert freq["adapter"] > freq["base"]
    assert 0 < freq["data_share"] < 1
    text = folded(after.format_generations(generated))
    assert f"base {loss['base']:.3f} -> adapter {loss['adapter']:.3f}" in text
    assert "in a fresh process" in text and "random-weight model" in text


def test_the_fresh_process_matches_greedy_decoding_here(generated):
    model, tokenizer = after.load_base("tiny", load_in_4bit=False, precision="fp32")
    first = generated["prompts"][0]
    assert after.greedy(model, tokenizer, first["prompt"], 8) == first["base_ids"]


def test_prompts_json_errors_say_what_to_pass(tmp_path, capsys):
    with pytest.raises(AdapterError, match="not JSON"):
        after.parse_prompts("[oops")
    with pytest.raises(AdapterError, match="non-empty JSON list"):
        after.parse_prompts("[]")
    with pytest.raises(AdapterError, match="prompt 1"):
        after.parse_prompts('["ok", {"response": "no prompt"}]')
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps([{"prompt": "### Instruction:\nHi\n\n### Response:\n", "response": "Hello"}]))
    assert after.parse_prompts(str(path))[0]["response"] == "Hello"
    assert after.main(["generate", "--base", "tiny", "--adapter", str(tmp_path), "--prompts-json", "[1]"]) == 2
    assert "prompt 0" in capsys.readouterr().err


def test_a_model_that_cannot_load_is_one_line_from_the_child(saved, capsys):
    args = ["generate", "--base", "no-such-user/no-such-model", "--adapter", str(saved.folder), "--prompts-json", '["x"]']
    assert after.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ModelUnavailableError:") and len(err.strip().splitlines()) == 1


# --- 3. merging ----------------------------------------------------------------------------------
def test_merging_into_a_4bit_base_requantizes_and_rounds(saved):
    merged = merging.merge_adapter(saved.folder, load_in_4bit=True)
    estimate = merging.merge_estimate("tiny", load_in_4bit=True, weight_bytes=4)
    assert any("rounding errors" in w for w in merged.warnings)  # peft 0.21's warning
    assert merged.stored_as.startswith("Linear4bit: torch.uint8")  # re-quantized: still NF4
    assert merged.bytes_after == estimate["merged"]
    assert merged.bytes_before - merged.bytes_after == estimate["lora"]
    assert merged.peak_bytes == pytest.approx(estimate["peak"], rel=0.02)
    change = merged.logit_change
    assert change["merge"] > 0.1 * change["adapter"]  # re-quantizing changed the function the adapter made


def test_merging_into_an_fp32_base_keeps_the_adapter_exactly(saved):
    merged = merging.merge_adapter(saved.folder, load_in_4bit=False)
    estimate = merging.merge_estimate("tiny", load_in_4bit=False, weight_bytes=4)
    assert not merged.warnings and merged.stored_as == "Linear: torch.float32"
    assert merged.bytes_after == estimate["merged"]
    assert merged.peak_bytes == pytest.approx(estimate["peak"], rel=0.02)
    assert merged.logit_change["merge"] < 1e-4 * merged.logit_change["adapter"]
    text = folded(merging.format_merge([merged], [estimate, merging.merge_estimate("llama-3.1-8b", False, 2)]))
    assert "32-bit base of tiny" in text and "16-bit base of llama-3.1-8b" in text


def test_merge_estimate_is_the_shapes_arithmetic():
    from course_utils.estimate import model_shapes

    s = model_shapes("llama-3.1-8b")
    bf16 = merging.merge_estimate("llama-3.1-8b", load_in_4bit=False, weight_bytes=2)
    nf4 = merging.merge_estimate("llama-3.1-8b", load_in_4bit=True, weight_bytes=2)
    assert bf16["merged"] == 2 * s.total_params + s.buffer_bytes
    assert bf16["lora"] == 4 * s.layers * 16 * sum(i + o for n, i, o in s.layer_linears if n.endswith(
        ("q_proj", "k_proj", "v_proj", "o_proj")))
    assert nf4["merged"] < bf16["merged"] / 2
    with pytest.raises(AdapterError, match="none of the LoRA targets"):
        merging.merge_estimate("tiny", True, 4, targets=("nope",))


def test_a_merge_whose_estimate_does_not_fit_the_card_is_not_started(saved, monkeypatch):
    from course_utils import machine as hardware

    monkeypatch.setattr(hardware, "device_type", lambda: "cuda")  # a GPU with less free than the merge needs
    estimate = merging.merge_estimate("tiny", load_in_4bit=False)
    monkeypatch.setattr(hardware, "available_bytes", lambda: estimate["peak"] - 1)
    merged = merging.merge_adapter(saved.folder, load_in_4bit=False)
    assert merged.skipped.startswith("not run here: its estimated peak") and merged.peak_bytes == 0
    text = folded(merging.format_merge([merged], [estimate]))
    assert "not run here" in text and f"peak {merging.fmt(estimate['peak'])}" in text


def test_what_a_gpu_runs_in_a_fresh_process_is_the_same_call(saved, tmp_path, capsys, monkeypatch):
    """On a GPU train_and_save and merge_adapter run `python -m course_utils.chapter.after_training train` and `python -m
    course_utils.merging` (so the kernel keeps no CUDA memory); their commands, run here in this process,
    print what the in-process calls return."""
    assert after.main(["train", "--recipe", json.dumps(RECIPE.to_dict()), "--folder", str(tmp_path / "a"),
                       "--steps", "2"]) == 0
    d = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert d["folder"] == str(tmp_path / "a") and len(d["losses"]) == 2 and after.RECIPE_FILE in d["files"]
    assert merging.main(["--adapter", str(saved.folder), "--base", "tiny"]) == 0
    m = merging.Merged(**json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    here = merging.merge_adapter(saved.folder, load_in_4bit=False, isolate=False)
    assert (m.bytes_after, m.peak_bytes, m.stored_as) == (here.bytes_after, here.peak_bytes, here.stored_as)
    seen = []  # and on a GPU, isolate=None takes the fresh-process path
    monkeypatch.setattr(after, "in_fresh_process", lambda args, *a, **k: seen.append(args) or {**d, "folder": args[4]})
    from course_utils import machine as hardware
    monkeypatch.setattr(hardware, "device_type", lambda: "cuda")
    assert after.train_and_save(RECIPE, tmp_path / "b").folder == tmp_path / "b" and seen[-1][0] == "train"


# --- 4. memory stats -----------------------------------------------------------------------------
def measurement(**fields):
    from course_utils.results import Measurement

    env = dict(device="NVIDIA T4", total_memory_gib=16.0)
    return Measurement(recipe=RECIPE.to_dict(), recipe_key=RECIPE.key, env=env, env_key="e", status="ok", **fields)


def test_memory_stats_on_a_cpu_show_the_tensor_level_peak():
    stats = after.memory_stats(measurement(peak_bytes=512 * 2**20))
    assert not stats["gpu"] and stats["max_rss"] > 0
    text = folded(after.format_memory_stats(stats))
    assert text.startswith("No CUDA GPU here")
    assert "tensor-level peak 512.0 MiB (3.1% of its memory)" in text  # 0.5 of 16 GiB


def test_memory_stats_on_a_gpu_read_reserved_and_the_card(monkeypatch):
    import torch

    from course_utils import machine as hardware

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (12 * 2**30, 16 * 2**30))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 2 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 2**30)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 3 * 2**30)
    monkeypatch.setattr(hardware, "device_name", lambda: "NVIDIA T4")
    monkeypatch.setattr(hardware, "total_memory_bytes", lambda: 16 * 2**30)
    m = measurement(peak_bytes=2**30, cuda_max_allocated=4 * 2**30, cuda_max_reserved=8 * 2**30)
    text = folded(after.format_memory_stats(after.memory_stats(m)))
    assert "GPU = NVIDIA T4. Max memory = 16.00 GiB." in text
    assert "2.00 GiB reserved (12.5% of the card)" in text
    assert "The card now: 4.00 GiB used" in text
    assert "allocated 4.00 GiB (25.0% of its card), reserved 8.00 GiB (50.0%)" in text


def test_an_eval_forward_on_a_cpu_leaves_the_4bit_weights_as_loaded(monkeypatch):
    """bitsandbytes repacks 4-bit weights at an eval forward on AVX512-BF16 CPUs (other bytes, other kernels);
    build.load_model turns that off, so every CPU counts the same bytes (the merge test above relies on it).
    bitsandbytes is told this CPU has AVX512-BF16, so that on an AVX2-only CPU too the test fails without it."""
    import bitsandbytes.nn.modules
    import torch

    from course_utils.memtrack import model_state_tensors, tensor_bytes

    monkeypatch.setattr(bitsandbytes.nn.modules, "has_avx512bf16", lambda: True)  # what Linear4bit reads
    model, tokenizer = after.load_base("tiny", load_in_4bit=True)
    flags = [m.support_avx512bf16_for_cpu for m in model.modules() if hasattr(m, "support_avx512bf16_for_cpu")]
    assert flags and not any(flags)
    before = tensor_bytes(model_state_tensors(model))
    with torch.no_grad():
        model(input_ids=tokenizer("a test", return_tensors="pt")["input_ids"])
    assert tensor_bytes(model_state_tensors(model)) == before
    assert not any(getattr(m.weight.quant_state, "packing_format_for_cpu", False)
                   for m in model.modules() if hasattr(m, "support_avx512bf16_for_cpu"))
