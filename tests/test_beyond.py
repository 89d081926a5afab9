"""Notebook 09's changes: the recipe knobs, what a CPU does with them, the estimator's model of them, the
side-by-side table and its targets, and the shipped H200 data (checked against the issue's targets)."""

from __future__ import annotations

import json
import os
import runpy
from pathlib import Path

import pytest

from course_utils.chapter import beyond_the_recipe as beyond
from course_utils.chapter import toward_the_limit
from course_utils.recipe import LATER_FIELDS, Recipe, source_chapter_recipe
from course_utils.results import Measurement, all_reference_results

GIB = 2**30
ROOT = Path(__file__).resolve().parents[1]


def fake(label: str, allocated_gib: float, tokens_per_s: float, losses=(), status: str = "ok", **recipe) -> Measurement:
    r = source_chapter_recipe("llama-3.1-8b").with_(label=label, **recipe)
    return Measurement(recipe=r.to_dict(), recipe_key=r.key, env={"device": "test"}, env_key="e", status=status,
                       cuda_max_allocated=int(allocated_gib * GIB), cuda_max_reserved=int(allocated_gib * GIB),
                       tokens_per_s=tokens_per_s, losses=list(losses))


# --- the recipe knobs ---------------------------------------------------------------------------
def test_new_fields_leave_every_shipped_key_unchanged():
    """Fields added after the reference runs were shipped must not change their keys (the store finds
    measurements by key)."""
    refs = all_reference_results()
    assert refs
    for m in refs:
        assert Recipe.from_dict(m.recipe).key == m.recipe_key, m.label
    src = source_chapter_recipe()
    for name in LATER_FIELDS:
        assert src.with_(**{name: True}).key != src.key, name


def test_describe_names_each_change():
    r = beyond.fast_low_memory()
    text = r.describe()
    for words in ("no fp32 upcast", "embeddings on CPU", "Liger", "activations on CPU", "16x1"):
        assert words in text


def test_lean_and_fast_keep_what_is_trained():
    """Same LoRA, sequence, optimizer and tokens per optimizer step as the source recipe."""
    src = beyond.source()
    for r in (beyond.lean(), beyond.fast(), beyond.fast_low_memory()):
        assert r.tokens_per_step == src.tokens_per_step == 16 * 512
        for knob in ("lora_r", "lora_alpha", "lora_dropout", "lora_targets", "max_seq_length", "optimizer",
                     "load_in_4bit", "double_quant", "learning_rate", "seed", "precision", "gradient_checkpointing"):
            assert getattr(r, knob) == getattr(src, knob), (r.label, knob)


# --- on a CPU -----------------------------------------------------------------------------------
def test_cuda_only_changes_are_refused_with_the_reason_on_a_cpu():
    tiny = Recipe(model="tiny", load_in_4bit=True, prepare_kbit=False)
    liger = beyond.why_not_here(tiny.with_(liger_kernels=True))
    assert "liger_kernels=True" in liger and "CUDA" in liger and "liger_kernels=False" in liger
    offload = beyond.why_not_here(tiny.with_(offload_activations=True))
    assert "offload_activations=True" in offload and "offload_activations=False" in offload
    assert beyond.why_not_here(tiny.with_(offload_embeddings=True)) is None  # it runs; the table stays put


def test_offload_embeddings_refuses_a_full_fine_tune_and_tied_tables():
    import torch

    from course_utils.build import build, offload_input_embeddings
    from course_utils.recipe import RecipeError

    with pytest.raises(RecipeError, match="offload_embeddings=True needs a frozen embedding table"):
        build(Recipe(model="tiny", lora_r=None, offload_embeddings=True, steps=3, warmup_steps=1))

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

        def get_input_embeddings(self):
            return self.embed

        def get_output_embeddings(self):
            return self.head

    with pytest.raises(RecipeError, match="ties them"):
        offload_input_embeddings(Tied())


def test_run_path_skips_what_this_machine_cannot_do_and_goes_on_without_it(monkeypatch):
    """On a CPU: Liger and activation offloading are skipped with their reasons; the recipes after
    Liger are measured without it (nothing is measured twice, nothing measured is lost)."""
    import course_utils.measure as measure_module

    seen = []

    def fake_measure(recipe, **kw):
        seen.append(recipe)
        return fake(recipe.label, 1.0, 100.0)

    monkeypatch.setattr(measure_module, "measure", fake_measure)
    results, skipped = beyond.run_path("tiny", progress=False)
    labels = [r.label for r in beyond.path_here("tiny")]
    assert set(skipped) == {labels.index("+ Liger kernels"), len(labels) - 1}
    assert [results[i] is None for i in range(len(labels))] == [i in skipped for i in range(len(labels))]
    assert not any(r.liger_kernels or r.offload_activations for r in seen)
    assert [r.label for r in seen] == [lab for i, lab in enumerate(labels) if i not in skipped]
    lean = next(r for r in seen if r.label.startswith("lean"))
    assert lean.micro_batch * lean.grad_accum == seen[0].micro_batch * seen[0].grad_accum


# --- the estimator ------------------------------------------------------------------------------
def test_estimator_models_embeddings_on_cpu_and_liger():
    from course_utils.estimate import estimate, model_shapes

    s = model_shapes("llama-3.1-8b")
    lean = source_chapter_recipe().with_(prepare_kbit=False)
    moved = estimate(lean.with_(offload_embeddings=True), hardware="gpu").by_category["parameters"]
    assert estimate(lean, hardware="gpu").by_category["parameters"] - moved == s.embed_params * 2
    # on a CPU-only machine the table is in the same memory either way
    assert estimate(lean.with_(offload_embeddings=True), hardware="cpu").peak_bytes == estimate(lean, hardware="cpu").peak_bytes
    no_ckpt = lean.with_(gradient_checkpointing=False, micro_batch=4, grad_accum=4)
    saved = (estimate(no_ckpt, hardware="gpu").by_category["activations"]
             - estimate(no_ckpt.with_(liger_kernels=True), hardware="gpu").by_category["activations"])
    # per layer and token: each norm keeps bf16 instead of fp32 (2 x 2 B x hidden), SwiGLU one intermediate less
    per_token = 2 * 2 * s.hidden + 2 * s.intermediate
    assert saved >= (s.layers - 1) * 4 * 512 * per_token
    offloaded, kept = estimate(beyond.fast_low_memory(), hardware="gpu"), estimate(beyond.fast(), hardware="gpu")
    assert any("activation offloading" in n for n in offloaded.notes)
    # trl moves the layers' saved tensors to CPU memory: on the GPU only the embedding output (the table is on
    # the CPU), [tokens x hidden], and the loss's kept hidden states, one row per scored token (each sequence's
    # last token has no label), both bf16
    tokens = kept.recipe.micro_batch * kept.recipe.max_seq_length
    scored = tokens - kept.recipe.micro_batch
    assert offloaded.by_category["activations"] == (tokens + scored) * s.hidden * 2 < kept.by_category["activations"]
    assert estimate(beyond.fast_low_memory(), hardware="cpu").peak_bytes > offloaded.peak_bytes  # CUDA only


# --- the table, the targets, the loss curves, the peers -------------------------------------------
def test_rows_are_ratios_against_the_source_of_the_same_run():
    table = beyond.rows([fake("source", 8.0, 1000), fake("lean", 4.0, 4000), fake("oom", 1.0, 1, status="does_not_fit")])
    assert [r.label for r in table] == ["source", "lean"]
    assert table[1].memory_ratio == pytest.approx(0.5) and table[1].speed_ratio == pytest.approx(4.0)
    text = beyond.format_rows(table)
    assert "0.50" in text and "4.00" in text


@pytest.mark.parametrize("lean_gib,lean_speed,fast_gib,fast_speed,missed", [
    (5.0, 1200, 15.0, 9000, []),
    (5.8, 1200, 15.0, 9000, ["lean: allocated <= 0.70 x source", "lean: allocated <= 5.7 GiB"]),
    (5.0, 900, 15.0, 9000, ["lean: tokens/s >= source"]),
    (5.0, 1200, 16.5, 7000, ["fast: allocated <= 16 GiB", "fast: tokens/s >= 8 x source"]),
])
def test_target_checks_can_fail(lean_gib, lean_speed, fast_gib, fast_speed, missed):
    checks = beyond.target_checks(fake("source", 8.22, 1000), fake("lean", lean_gib, lean_speed),
                                  fake("fast", fast_gib, fast_speed))
    assert len(checks) == 5
    assert [target for target, _, met in checks if not met] == missed


def test_loss_agreement():
    a = fake("a", 1, 1, losses=[3.0, 2.5, 2.0])
    b = fake("b", 1, 1, losses=[3.0, 2.4, 2.1, 9.9])
    agree = beyond.loss_agreement(a, b)
    assert agree["steps"] == 3 and agree["max_gap"] == pytest.approx(0.1)
    assert agree["fall_a"] == pytest.approx(1.0) and agree["fall_b"] == pytest.approx(0.9)


def test_peer_comparison_says_who_is_ahead_on_what(monkeypatch):
    quoted = {"unsloth": {"version": "unsloth 2026.10.9", "runs": [  # fixed figures: the ratios below are theirs
        {"batch": "1x16", "micro_batch": 1, "grad_accum": 16, "peak_allocated_gib": 5.88, "tokens_per_s": 1406},
        {"batch": "16x1", "micro_batch": 16, "grad_accum": 1, "peak_allocated_gib": 7.62, "tokens_per_s": 11503}]}}
    monkeypatch.setattr(toward_the_limit, "peers", lambda model="llama-3.1-8b": quoted)
    text = toward_the_limit.peer_comparison({"1x16": [fake("ours", 5.0, 2000)], "16x1": [fake("big", 9.0, 11000)]})
    assert "unsloth" in text
    assert "less memory (-15%), faster (+42%)" in text
    assert "more memory (+18%), slower (-4%)" in text


# --- the shipped H200 data --------------------------------------------------------------------------
def test_shipped_side_by_side_run_meets_the_targets_and_records_its_provenance():
    side = beyond.by_label(beyond.reference())
    src, lean, fast = side["source recipe (1x16)"], side["lean recipe (4x4)"], side["fast recipe (16x1)"]
    checks = beyond.target_checks(src, lean, fast)
    assert len(checks) == 5 and all(met for _, _, met in checks), checks
    for m in side.values():
        assert m.env["device"] == "NVIDIA H200" and m.command.startswith("beyond_recipe.py") and m.date
        assert {"torch", "transformers", "peft", "trl", "bitsandbytes"} <= set(m.env["versions"])
        assert len(m.losses) == 20
        agree = beyond.loss_agreement(src, m)
        assert agree["max_gap"] < 0.02 < agree["fall_b"]  # same curve, and a curve that moves


def test_shipped_peers_have_their_provenance():
    p = toward_the_limit.peers()["unsloth"]
    assert p["version"] and p["hardware"] and p["source"] and p["settings"]
    assert {r["batch"] for r in p["runs"]} == {"1x16", "16x1"}


def test_planner_checks_ship_with_the_source_of_the_same_run():
    from course_utils.chapter.complete_recipe import shipped_checks

    text = shipped_checks("llama-3.1-8b")
    assert text.count("fits, ") >= 2 and "does not fit, source recipe" in text and "check_plan.py" in text


def test_planner_factors_come_from_measured_pairs():
    from course_utils.estimate.plan import speed_of, tuning_factor

    refs = [m for m in all_reference_results() if m.fits and m.tokens_per_s]
    r = source_chapter_recipe().with_(prepare_kbit=False, liger_kernels=True, micro_batch=8, grad_accum=2,
                                      steps=5, warmup_steps=1)
    factor, parts = tuning_factor(r, refs)
    assert factor > 1 and len(parts) == 2 and all("measured at micro-batch" in p for p in parts)
    speed = speed_of(r, refs)
    assert not speed.measured and "without the changes" in speed.basis


def test_beyond_script_prints_the_shipped_table(capsys, tmp_path):
    script = runpy.run_path(str(ROOT / "scripts" / "gpu" / "beyond_recipe.py"), run_name="beyond_recipe")
    shipped = ROOT / "course_utils" / "reference" / "beyond" / "llama-3.1-8b.jsonl"
    assert script["main"](["--set", "curves", "--out", str(shipped), "--print-only",
                           "--peer-out", str(tmp_path / "no-peers.jsonl")]) == 0  # our table alone
    out = capsys.readouterr().out
    assert out.count("MET ") == 5 and "MISSED" not in out
    assert "lean recipe (4x4)   " in out.split("the source recipe's loss fell by")[1]  # the loss table's row


# --- the peer in the benchmark (scripts/gpu/peer_unsloth.py, run by beyond_recipe.py --peers unsloth) ------------
def fake_peer(micro_batch: int, grad_accum: int, allocated_gib: float, tokens_per_s: float, run_id: str = "r",
              losses=()) -> Measurement:
    r = toward_the_limit.peer_recipe("llama-3.1-8b", micro_batch, grad_accum, 20, label=f"Unsloth ({micro_batch}x{grad_accum})")
    m = fake(r.label, allocated_gib, tokens_per_s, losses, micro_batch=micro_batch, grad_accum=grad_accum,
             optimizer="adamw_8bit", prepare_kbit=False, steps=20, warmup_steps=1)
    assert m.recipe_key == r.key
    m.run_id, m.env = run_id, {"device": "NVIDIA H200", "versions": {"unsloth": "2026.10.9"}}
    return m


def peer_script() -> dict:
    return runpy.run_path(str(ROOT / "scripts" / "gpu" / "peer_unsloth.py"), run_name="peer_unsloth")


def test_rows_take_ratios_to_the_peer_at_the_same_batching():
    ours = [fake("source", 8.0, 1000), fake("lean", 5.0, 5000, micro_batch=4, grad_accum=4),
            fake("fast", 6.0, 12000, micro_batch=16, grad_accum=1)]
    peers = [fake_peer(16, 1, 7.5, 11500), fake_peer(1, 16, 6.0, 1600)]
    table = {r.label: r for r in beyond.rows(ours, peers=peers)}
    assert table["fast"].peer_memory_ratio == pytest.approx(6.0 / 7.5)
    assert table["fast"].peer_speed_ratio == pytest.approx(12000 / 11500)
    assert table["source"].peer_memory_ratio == pytest.approx(8.0 / 6.0)
    assert table["lean"].peer_memory_ratio is None  # no run of the peer at 4x4
    assert table["Unsloth (16x1)"].memory_ratio == pytest.approx(7.5 / 8.0)  # the peer's rows, against our source
    text = beyond.format_rows(list(table.values()))
    assert "(x peer)" in text and text.splitlines()[3].split()[-2:] == ["-", "-"]  # lean's row
    assert "(x peer)" not in beyond.format_rows(beyond.rows(ours))  # the table without peers is unchanged


def test_peer_checks_take_our_closest_recipe_at_each_of_its_settings():
    peers = [fake_peer(16, 1, 8.0, 10000), fake_peer(1, 16, 6.0, 1600)]
    ours = [fake("source", 8.2, 1000), fake("slow but small", 6.0, 9000, micro_batch=16, grad_accum=1),
            fake("ahead", 6.4, 10600, micro_batch=16, grad_accum=1)]
    checks = toward_the_limit.peer_checks(ours, peers)
    assert [met for *_, met in checks] == [True, False]
    assert checks[0][1] == ["ahead: 0.80 x memory, 1.06 x speed", "slow but small: 0.75 x memory, 0.90 x speed"]
    assert checks[1][1] == ["source: 1.37 x memory, 0.62 x speed"]  # every recipe at the batching, closest first
    assert "no recipe of ours at 1x16" in toward_the_limit.peer_checks(ours[1:], peers)[1][1][0]


def test_latest_peer_runs_are_the_peer_recipes_of_this_run():
    runs = [fake_peer(16, 1, 8.0, 1, run_id="a"), fake_peer(16, 1, 7.0, 2, run_id="b"), fake_peer(1, 16, 6, 3, "a"),
            fake("ours", 1, 1, micro_batch=16, grad_accum=1)]
    assert [m.tokens_per_s for m in toward_the_limit.latest_peer_runs(runs, "unsloth", "llama-3.1-8b", 20)] == [2, 3]
    assert [m.tokens_per_s for m in toward_the_limit.latest_peer_runs(runs, "unsloth", "llama-3.1-8b", 20, "a")] == [1, 3]
    assert toward_the_limit.latest_peer_runs(runs, "unsloth", "llama-3.1-8b", 4) == []  # other step counts: other recipes
    assert toward_the_limit.peer_name(runs[0]) == "unsloth" and toward_the_limit.peer_name(runs[-1]) is None


def test_peers_prefer_measured_runs_and_keep_the_readers_working(monkeypatch):
    from course_utils.chapter import facts

    measured = [fake_peer(16, 1, 7.62, 11476.4, losses=[11.9, 11.0]), fake_peer(1, 16, 5.88, 1673.2)]
    monkeypatch.setattr(toward_the_limit, "peer_reference", lambda model="llama-3.1-8b": measured)
    p = toward_the_limit.peers()["unsloth"]
    assert p["measured"] and p["version"] == "unsloth 2026.10.9" and p["hardware"] == "NVIDIA H200"
    assert "16x1" not in p["settings"] and "adamw_8bit" in p["settings"] and "peer_unsloth.py" in p["source"]
    assert [(r["batch"], r["peak_allocated_gib"], r["tokens_per_s"]) for r in p["runs"]] == [
        ("16x1", 7.62, 11476), ("1x16", 5.88, 1673)]
    assert facts.peer("1x16").tokens_per_s == 1673 and facts.peer("16x1").version == "unsloth 2026.10.9"
    assert "unsloth 2026.10.9, 16x1" in toward_the_limit.peer_comparison({"16x1": [fake("ours", 6.0, 12000)]})


def test_peer_runs_ship_apart_from_ours():
    """The estimator and the planner are checked on every .jsonl of reference/beyond/: the peer's runs are not ours."""
    assert beyond.peer_reference() == [] or all(toward_the_limit.peer_name(m) for m in beyond.peer_reference())
    assert not any(toward_the_limit.peer_name(m) for m in all_reference_results())


def test_peer_recipe_keeps_what_the_source_recipe_trains():
    src = beyond.source(steps=20)
    for mb, ga in toward_the_limit.PEER_BATCHES:
        r = toward_the_limit.peer_recipe("llama-3.1-8b", mb, ga, 20)
        assert r.tokens_per_step == src.tokens_per_step and r.warmup_steps == src.warmup_steps == 1
        for knob in ("lora_r", "lora_alpha", "lora_dropout", "lora_targets", "max_seq_length", "learning_rate",
                     "seed", "precision", "load_in_4bit", "double_quant", "gradient_checkpointing"):
            assert getattr(r, knob) == getattr(src, knob), knob
        assert r.optimizer == "adamw_8bit" and not r.prepare_kbit


@pytest.mark.slow
def test_peer_packs_the_rows_that_build_trains_on():
    """The peer tokenizes and packs the shipped data itself (its trl is older): the same rows as build()'s."""
    from course_utils.build import build

    recipe = Recipe(model="tiny", max_seq_length=512, steps=3, warmup_steps=1, micro_batch=1, grad_accum=16)
    built = build(recipe)
    script = peer_script()
    packed = script["packed_rows"](built.tokenizer, script["training_texts"](), 512)
    rows = script["training_rows"](built.tokenizer, recipe)
    assert len(packed) % 16 and len(rows) == len(packed) - len(packed) % 16  # whole optimizer steps, on both sides
    assert rows == [list(r) for r in built.trainer.train_dataset["input_ids"]] and len(rows) >= 5 * 16


def test_peer_trains_with_build_s_settings(tmp_path):
    """Every training setting both stacks have is build.sft_config's (batching, schedule, optimizer, seeds, data)."""
    from trl import SFTConfig

    from course_utils.build import sft_config

    recipe = toward_the_limit.peer_recipe("tiny", 16, 1, 20).with_(precision="fp32")
    ours = sft_config(recipe, "fp32", str(tmp_path))
    peer = SFTConfig(**peer_script()["sft_kwargs"](recipe, str(tmp_path), on_cuda=False))
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "max_steps", "learning_rate",
                 "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm", "adam_beta1", "adam_beta2",
                 "adam_epsilon", "optim", "max_length", "logging_steps", "seed", "data_seed", "bf16", "fp16",
                 "dataloader_drop_last", "dataloader_num_workers", "dataloader_pin_memory", "shuffle_dataset"):
        assert getattr(peer, name) == getattr(ours, name), name
    assert not peer.packing and not peer.padding_free  # the rows come packed: every batch is [micro_batch, seq]


def test_peer_measures_with_the_course_probe(tmp_path):
    """On a CPU, with the tiny model and peft's LoRA standing in for Unsloth's: the script's trainer, probe and
    Measurement (one warm-up, one tracked, one timed step)."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from course_utils.build import lora_config
    from course_utils.models import tiny_model_path

    script = peer_script()
    recipe = script["peer_recipe"]("tiny", 2, 1, 3, "test").with_(precision="fp32", max_seq_length=128,
                                                                    label="Unsloth test (2x1)")
    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_path()), lora_config(recipe))
    rows = script["packed_rows"](tok, script["training_texts"](), 128)
    probe, trainer, status, error, _ = script["train"](model, tok, rows, recipe, str(tmp_path))
    m = script["to_measurement"](recipe, script["peer_environment"](), probe, model, status, error, notes=["cpu"])
    assert m.status == "ok" and m.recipe_key == recipe.key and m.label == "Unsloth test (2x1)"
    assert len(m.losses) == 3 and m.tokens_per_s > 0 and probe.tokens == 3 * 2 * 128
    assert m.trainable_params > 0 and m.env["versions"]["transformers"] and m.date
    assert Measurement.from_dict(json.loads(m.to_json())).label == m.label  # it stores like ours


def test_beyond_recipe_runs_the_peer_in_its_own_environment(tmp_path, monkeypatch, capsys):
    script = runpy.run_path(str(ROOT / "scripts" / "gpu" / "beyond_recipe.py"), run_name="beyond_recipe")
    calls = []

    class Done:
        returncode, stdout, stderr = 0, "Unsloth (16x1): ok\n", ""

    def fake_run(cmd, env, **kw):
        calls.append((cmd, env))
        return Done()

    monkeypatch.setattr(script["subprocess"], "run", fake_run)
    args = script["parse_args"](["--set", "curves", "--peers", "unsloth", "--out", str(tmp_path / "run.jsonl"),
                                 "--peer-site", str(tmp_path)])
    assert args.peer_out == tmp_path / "peers" / "run.jsonl"
    script["run_peer"]("unsloth", args, tmp_path / "model")
    settings = [(cmd[cmd.index("--micro-batch") + 1], cmd[cmd.index("--grad-accum") + 1]) for cmd, _ in calls]
    assert settings == [("16", "1"), ("1", "16")]
    for cmd, env in calls:
        assert cmd[1].endswith("peer_unsloth.py") and env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), str(ROOT)]
        assert cmd[cmd.index("--model-dir") + 1] == str(tmp_path / "model") and env["HF_HUB_OFFLINE"] == "1"
    calls.clear()
    script["run_peer"]("unsloth", script["parse_args"](["--out", "x.jsonl", "--peer-site", str(tmp_path / "no")]), ROOT)
    assert not calls and "no site directory" in capsys.readouterr().out


def test_beyond_script_prints_the_peer_beside_the_shipped_table(tmp_path, capsys):
    from course_utils.results import ResultStore

    store = ResultStore(tmp_path / "peers.jsonl")
    store.add(fake_peer(16, 1, 7.62, 11476, losses=[11.9, 11.8, 11.6]))
    store.add(fake_peer(1, 16, 5.88, 1673))
    script = runpy.run_path(str(ROOT / "scripts" / "gpu" / "beyond_recipe.py"), run_name="beyond_recipe")
    shipped = ROOT / "course_utils" / "reference" / "beyond" / "llama-3.1-8b.jsonl"
    assert script["main"](["--set", "curves", "--out", str(shipped), "--print-only", "--peer-out",
                           str(store.path)]) == 0
    out = capsys.readouterr().out
    assert "(x peer)" in out and "Unsloth (16x1)" in out and "and against the peer" in out
    assert "16x1: allocated <= 0.85 x and tokens/s >= 1.05 x Unsloth (16x1)" in out
    assert "\nUnsloth (16x1)   " in out.split("the source recipe's loss fell by")[1]  # in the loss table


def test_peer_wheel_is_stripped_with_a_record_that_lists_what_is_left(tmp_path):
    import zipfile

    wheels = runpy.run_path(str(ROOT / "scripts" / "device" / "peer_wheels.py"), run_name="peer_wheels")
    wheel = tmp_path / "unsloth-1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("unsloth/__init__.py", "x = 1\n")
        z.writestr("studio/big.js", "0" * 10000)
        z.writestr("unsloth_cli/app.py", "y = 2\n")
        z.writestr("unsloth-1.dist-info/RECORD", "stale\n")
    assert wheels["strip_wheel"](wheel) > 0 and wheels["strip_wheel"](wheel) == 0
    with zipfile.ZipFile(wheel) as z:
        assert sorted(z.namelist()) == ["unsloth-1.dist-info/RECORD", "unsloth/__init__.py"]
        record = z.read("unsloth-1.dist-info/RECORD").decode().splitlines()
    assert record[0].startswith("unsloth/__init__.py,sha256=") and record[0].endswith(",6")
    assert record[1] == "unsloth-1.dist-info/RECORD,,"


def test_the_peer_set_holds_the_issue_table_in_one_run():
    script = runpy.run_path(str(ROOT / "scripts" / "gpu" / "beyond_recipe.py"), run_name="beyond_recipe")
    recipes = script["recipe_set"]("peer", "llama-3.1-8b", 6)
    assert recipes[0].label == "source recipe (1x16)" and all(r.steps == 6 for r in recipes)
    shapes = {beyond.batching(r) for r in recipes}
    assert {f"{m}x{g}" for m, g in toward_the_limit.PEER_BATCHES} <= shapes  # ours at each of the peer's settings
    assert {r.tokens_per_step for r in recipes} == {recipes[0].tokens_per_step}
    assert "+ Liger kernels" in [r.label for r in recipes] and "lean recipe (4x4)" in [r.label for r in recipes]


def test_the_picks_set_measures_the_planners_picks_with_and_without_the_host_changes():
    """Issue 31's next GPU run: the planner's picks for 16 and 8 GiB, each alone, + fused LoRA, + reentrant
    checkpointing, so that their speed at the picks' own micro-batches is measured before the planner offers them."""
    from course_utils.estimate.planner import plan

    script = runpy.run_path(str(ROOT / "scripts" / "gpu" / "beyond_recipe.py"), run_name="beyond_recipe")
    recipes = script["recipe_set"]("picks", "llama-3.1-8b", 6)
    for gib, (pick, fused, reentrant) in zip((16, 8), (recipes[:3], recipes[3:])):
        assert pick == plan("llama-3.1-8b", f"{gib}GiB").pick.recipe.with_(steps=6, warmup_steps=1)
        assert fused == pick.with_(fused_lora=True) and reentrant == fused.with_(reentrant_checkpointing=True)
