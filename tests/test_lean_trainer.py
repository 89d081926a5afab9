"""Recipe(lean_host=True) (course_utils/lean_trainer.py): the same training and the same logged metrics as trl's
SFTTrainer, with fewer host-GPU waits per micro-batch (counted through patched Tensor.item and Tensor.__bool__,
which are what a wait is made of on a GPU). The tiny model on a CPU, in this process."""

from __future__ import annotations

import contextlib

import pytest
import torch

from course_utils.build import build, sft_config
from course_utils.lean_trainer import LeanSFTTrainer, _CacheOncePerStep
from course_utils.recipe import Recipe

# 1 x 4 micro-batches, so that the per-micro-batch reads show up 4 times per optimizer step
RECIPE = Recipe(micro_batch=1, grad_accum=4, max_seq_length=64, steps=3, warmup_steps=1, lora_dropout=0.05)


@contextlib.contextmanager
def counting_reads():
    """Count Tensor.item() and bool(tensor) calls (each one a wait for the GPU on CUDA) inside the block."""
    counts = {"item": 0, "bool": 0}
    item, as_bool = torch.Tensor.item, torch.Tensor.__bool__

    def counted_item(self):
        counts["item"] += 1
        return item(self)

    def counted_bool(self):
        counts["bool"] += 1
        return as_bool(self)

    torch.Tensor.item, torch.Tensor.__bool__ = counted_item, counted_bool
    try:
        yield counts
    finally:
        torch.Tensor.item, torch.Tensor.__bool__ = item, as_bool


def train(recipe: Recipe):
    b = build(recipe)
    with counting_reads() as counts:
        b.trainer.train()
    logs = [row for row in b.trainer.state.log_history if "loss" in row]
    return b, logs, counts


@pytest.fixture(scope="module")
def both(tiny_model):
    return train(RECIPE), train(RECIPE.with_(lean_host=True))


def test_lean_host_is_a_new_key_and_leaves_the_old_ones():
    assert RECIPE.with_(lean_host=True).key != RECIPE.key
    assert "lean host" in RECIPE.with_(lean_host=True).describe() and "lean host" not in RECIPE.describe()


def test_lean_host_configures_the_trainer(tmp_path):
    assert sft_config(RECIPE, "fp32", str(tmp_path)).logging_nan_inf_filter is True
    assert sft_config(RECIPE.with_(lean_host=True), "fp32", str(tmp_path)).logging_nan_inf_filter is False


def test_lean_host_trains_the_same_losses_and_logs_the_same_metrics(both):
    (plain, plain_logs, _), (lean, lean_logs, _) = both
    assert type(plain.trainer).__name__ == "SFTTrainer" and isinstance(lean.trainer, LeanSFTTrainer)
    assert len(plain_logs) == len(lean_logs) == RECIPE.steps
    for a, b in zip(plain_logs, lean_logs):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6, abs=1e-7)
        for name in ("entropy", "mean_token_accuracy", "num_tokens", "grad_norm"):
            assert b[name] == pytest.approx(a[name], rel=1e-6, abs=1e-7), name
    assert lean_logs[-1]["num_tokens"] == RECIPE.steps * RECIPE.tokens_per_step  # every token counted, once
    for p, q in zip(plain.trainer.model.parameters(), lean.trainer.model.parameters()):
        if p.requires_grad:
            torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)


def test_lean_host_reads_the_gpu_fewer_times(both):
    (_, _, plain), (_, _, lean) = both
    micro_batches = RECIPE.steps * RECIPE.grad_accum
    # trl: 3 item() and two `num_valid > 0` tests per micro-batch; transformers: isnan and isinf per micro-batch.
    # What is left (the optimizer's and the logging's reads) comes once per optimizer step, in both.
    assert plain["item"] - lean["item"] == 3 * micro_batches, (plain, lean)
    assert plain["bool"] - lean["bool"] >= 3 * micro_batches, (plain, lean)
    assert lean["bool"] <= plain["bool"] / 4, (plain, lean)


def test_the_offloaders_cache_is_emptied_once_per_optimizer_step():
    class Module:
        emptied = 0

        def empty_cache(self):
            self.emptied += 1

        def current_stream(self):
            return "stream"

    inner = Module()
    gate = _CacheOncePerStep(inner)
    assert gate.current_stream() == "stream"  # everything else passes through
    for micro in range(8):  # what LeanSFTTrainer.training_step sets, at 4 micro-batches per optimizer step
        gate.allow = micro % 4 == 0
        gate.empty_cache()
    assert inner.emptied == 2
