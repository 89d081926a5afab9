"""The multi-process path (course_utils.distributed, notebook 11_more_than_one_gpu) on a CPU: two gloo processes
train the embedded tiny model with DDP through `accelerate launch` and the shipped config, once for the whole
file (a module fixture), beside one process that trains the whole batch in this process. The ranks see
different data, their averaged gradients are those of the whole batch, rank 0 alone saves the adapter, and
the parent stores one Measurement with per-rank figures. FSDP needs GPUs through accelerate: its refusal,
and every other bad input, is checked without starting a process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from course_utils import distributed
from course_utils.distributed import check_launch, combine, config_file, launch, launch_command
from course_utils.machine import HardwareError
from course_utils.recipe import Recipe, RecipeError
from course_utils.results import Measurement, ResultLineError, ResultStore

# fp32, no dropout, same seed: the two runs below are deterministic; 2 sequences of 64 tokens per rank
RECIPE = Recipe(micro_batch=2, max_seq_length=64, steps=3, warmup_steps=1, lora_dropout=0.0, label="ddp test")
WHOLE_BATCH = RECIPE.with_(micro_batch=4)  # one process, both ranks' sequences in one micro-batch


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One 2-process DDP launch (kept rank files, saved adapter, first-step gradients) and the one-process
    reference on the whole batch (in this process: no second start-up)."""
    import torch

    from course_utils.distributed import run_rank

    if distributed.visible_gpus():
        pytest.skip("the CPU (gloo) path; on a GPU machine launch trains on the GPUs")
    root = tmp_path_factory.mktemp("distributed")
    store = ResultStore(root / "results.jsonl")
    m = launch(RECIPE, gpus=2, strategy="ddp", store=store, progress=False, timeout_s=300,
               save_adapter=root / "adapter", workdir=root / "ranks", first_step=True)
    ranks = [torch.load(root / "ranks" / f"rank{r}-first-step.pt") for r in (0, 1)]
    record = run_rank(WHOLE_BATCH, root / "reference", first_step=True)
    reference = torch.load(root / "reference" / "rank0-first-step.pt")
    return {"m": m, "store": store, "root": root, "ranks": ranks, "reference": reference, "record": record}


def test_the_two_ranks_train_different_shares_of_the_same_shuffled_data(runs):
    import torch

    m, (r0, r1), ref = runs["m"], runs["ranks"], runs["reference"]
    assert [r["rank"] for r in m.per_rank] == [0, 1]
    assert m.per_rank[0]["first_batch"] != m.per_rank[1]["first_batch"]
    assert not any(bool((row == other).all()) for row in r0["first_ids"] for other in r1["first_ids"])
    # together they are the whole batch one process trains: rank 0 the first half, rank 1 the second
    assert torch.equal(torch.cat([r0["first_ids"], r1["first_ids"]]), ref["first_ids"])
    per_rank_tokens = RECIPE.steps * RECIPE.tokens_per_step
    assert [r["tokens"] for r in m.per_rank] == [per_rank_tokens, per_rank_tokens]


def test_ddp_averages_the_gradients_of_the_whole_batch(runs):
    import torch

    (r0, r1), ref = runs["ranks"], runs["reference"]["grads"]
    assert set(r0["grads"]) == set(ref) and len(ref) > 0 and all("lora_" in name for name in ref)
    assert any(g.abs().max() > 0 for g in ref.values())  # LoRA's B gets a gradient on the first step (A's is 0)
    for name, want in ref.items():
        scale = float(want.abs().max()) or 1.0
        torch.testing.assert_close(r0["grads"][name], want, rtol=1e-4, atol=1e-5 * scale, msg=name)
        torch.testing.assert_close(r1["grads"][name], r0["grads"][name], rtol=0, atol=0, msg=name)


def test_the_same_losses_as_one_process_on_the_whole_batch(runs):
    want = runs["record"]["measurement"]["losses"]
    assert runs["m"].losses == pytest.approx(want, rel=1e-4)


def test_rank_0_alone_saves_the_adapter(runs):
    m, root = runs["m"], runs["root"]
    assert [r["saved_adapter"] for r in m.per_rank] == [1, 0]
    assert [p.relative_to(root).as_posix() for p in root.rglob("adapter_model.safetensors")] == [
        "adapter/adapter_model.safetensors"]
    config = json.loads((root / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == RECIPE.lora_r and sorted(config["target_modules"]) == sorted(RECIPE.lora_targets)


def test_the_result_is_one_stored_measurement_with_per_rank_figures(runs):
    m, store = runs["m"], runs["store"]
    assert m.fits and (m.gpus, m.strategy, len(m.per_rank)) == (2, "ddp", 2)
    assert m.label == "ddp test" and m.recipe_obj == RECIPE
    assert m.peak_bytes == max(r["peak_bytes"] for r in m.per_rank) > 0
    assert m.cuda_max_allocated is None and all(r["cuda_max_reserved"] is None for r in m.per_rank)
    # global tokens/s: both ranks' tokens of a step over the slowest rank's step time
    assert m.tokens_per_s == pytest.approx(2 * min(r["tokens_per_s"] for r in m.per_rank), rel=1e-3)
    assert any("gloo" in note for note in m.notes)
    [stored] = store.load()
    assert (stored.gpus, stored.strategy, stored.per_rank) == (2, "ddp", m.per_rank)
    assert store.find(RECIPE, m.env_key, gpus=2, strategy="ddp") is not None
    assert store.find(RECIPE, m.env_key) is None  # a one-process lookup never gets the 2-process run


def test_launch_again_returns_the_stored_run_without_starting_one(runs, monkeypatch):
    def no_run(*a, **kw):
        raise AssertionError("started a run although the store has this one")

    monkeypatch.setattr(distributed, "_run_ranks", no_run)
    monkeypatch.setattr(Measurement, "noisy", property(lambda self: False))
    again = launch(RECIPE.with_(label="again"), gpus=2, strategy="ddp", store=runs["store"], progress=False)
    assert again.cached and again.label == "again" and again.per_rank == runs["m"].per_rank


def test_a_rank_that_ran_out_of_memory_makes_the_run_not_fit(runs):
    records = [json.loads((runs["root"] / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    records[1]["measurement"].update(status="does_not_fit", error="OutOfMemoryError: CUDA out of memory")
    m = combine(RECIPE, "ddp", records)
    assert not m.fits and m.tokens_per_s is None and m.error.startswith("rank 1: OutOfMemoryError")
    alone = combine(RECIPE, "ddp", records[1:], gpus=2)  # rank 0 was stopped before it wrote its record
    assert not alone.fits and alone.gpus == 2 and [r["rank"] for r in alone.per_rank] == [1]


# --- without a process --------------------------------------------------------------------------------------
@pytest.mark.parametrize("gpus", [0, -1, True, 1.5, "2"])
def test_gpus_must_be_a_whole_number_of_one_or_more(gpus):
    with pytest.raises(RecipeError, match="gpus must be a whole number, 1 or more"):
        check_launch(RECIPE, gpus, "ddp")


def test_an_unknown_strategy_names_the_known_ones():
    with pytest.raises(RecipeError, match=r"strategy must be one of \('ddp', 'fsdp', 'fsdp_offload'\).*'zero3'"):
        check_launch(RECIPE, 2, "zero3")


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp_offload"])
def test_fsdp_on_a_cpu_says_it_needs_gpus_and_what_to_use(monkeypatch, strategy):
    monkeypatch.setattr(distributed, "visible_gpus", lambda: 0)
    with pytest.raises(HardwareError, match=r"needs GPUs.*quietly train with DDP.*strategy='ddp'"):
        check_launch(RECIPE, 2, strategy)
    with pytest.raises(HardwareError, match=r"FSDP-QLoRA \(load_in_4bit=True\) is a GPU recipe"):
        check_launch(RECIPE.with_(load_in_4bit=True, prepare_kbit=False), 2, strategy)


def test_more_processes_than_cores_or_gpus_is_refused_with_the_count(monkeypatch):
    monkeypatch.setattr(distributed, "visible_gpus", lambda: 0)
    monkeypatch.setattr(distributed.os, "cpu_count", lambda: 2)
    with pytest.raises(HardwareError, match=r"gpus=3 asks for 3 CPU processes.*2 CPU cores.*gpus <= 2"):
        check_launch(RECIPE, 3, "ddp")
    monkeypatch.setattr(distributed, "visible_gpus", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(HardwareError, match=r"gpus=2 asks for 2 GPUs, but this process sees 1 \(CUDA_VISIBLE_DEVICES="):
        check_launch(RECIPE, 2, "ddp")


def test_fsdp_qlora_asks_for_one_dtype_per_unit(monkeypatch):
    monkeypatch.setattr(distributed, "visible_gpus", lambda: 2)
    with pytest.raises(RecipeError, match="Set prepare_kbit=False"):
        check_launch(RECIPE.with_(load_in_4bit=True), 2, "fsdp")
    with pytest.raises(RecipeError, match="set offload_embeddings=False"):
        check_launch(RECIPE.with_(offload_embeddings=True), 2, "fsdp")


def test_the_shipped_configs_hold_the_settings_the_chapter_teaches():
    ddp = yaml.safe_load(config_file("ddp").read_text())
    assert ddp["distributed_type"] == "MULTI_GPU" and ddp["num_machines"] == 1
    fsdp = yaml.safe_load(config_file("fsdp").read_text())
    assert fsdp["distributed_type"] == "FSDP"
    assert config_file("fsdp_offload") == config_file("fsdp")
    want = {"fsdp_sharding_strategy": "FULL_SHARD", "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_sync_module_states": True, "fsdp_use_orig_params": False, "fsdp_offload_params": False,
            "fsdp_activation_checkpointing": False, "fsdp_state_dict_type": "FULL_STATE_DICT"}
    assert {k: fsdp["fsdp_config"][k] for k in want} == want
    cmd = launch_command(RECIPE, 2, "fsdp_offload", Path("/tmp/x"))
    assert cmd[1:3] == ["-m", "accelerate.commands.launch"] and str(config_file("fsdp")) in cmd
    assert "--fsdp_offload_params" in cmd and cmd[cmd.index("--num_processes") + 1] == "2"
    assert "--fsdp_offload_params" not in launch_command(RECIPE, 2, "fsdp", Path("/tmp/x"))


def test_under_fsdp_the_4bit_weights_are_stored_in_the_compute_dtype(monkeypatch):
    import torch

    from course_utils.build import quantization_config

    qlora = RECIPE.with_(load_in_4bit=True, precision="bf16")
    assert quantization_config(qlora, "bf16").bnb_4bit_quant_storage == torch.uint8  # one GPU: bitsandbytes' default
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert quantization_config(qlora, "bf16").bnb_4bit_quant_storage == torch.bfloat16


def _line(**changes) -> dict:
    m = Measurement(recipe=RECIPE.to_dict(), recipe_key=RECIPE.key, env={}, env_key="e", status="ok")
    return {**json.loads(m.to_json()), **changes}


def test_stored_lines_keep_their_one_gpu_meaning_and_bad_distributed_fields_are_named():
    old = _line()
    for name in ("gpus", "strategy", "per_rank"):
        old.pop(name)
    m = Measurement.from_dict(old)  # a line stored before this field existed
    assert (m.gpus, m.strategy, m.per_rank) == (1, "", [])
    for field, bad in (("gpus", 0), ("gpus", True), ("strategy", "zero3"), ("per_rank", [{"rank": -1}]),
                       ("per_rank", {"rank": 0})):
        with pytest.raises(ResultLineError, match=f"field '{field}'"):
            Measurement.from_dict(_line(**{field: bad}))
