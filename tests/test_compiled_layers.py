"""Recipe(compile_layers=True), course_utils/compiled_layers.py (issue 31): each decoder layer's forward compiled
inside its checkpoint. Dynamo and AOTAutograd with the eager backend here: what is checked is what the compiled layers
keep and compute, not Inductor's code generation (slow on a CPU, and the GPU's to run)."""

from __future__ import annotations

import pytest

from course_utils import compiled_layers
from course_utils.recipe import Recipe, RecipeError
from test_count_launches import _tiny_llama_checkpointed  # a 3-layer Llama, checkpointed, and a batch


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_compiling_inside_the_checkpoint_keeps_checkpointing_and_training_the_same(reentrant):
    """compile_inside_checkpoint (Recipe(compile_layers=True); count_launches.py's -compiled-inside variants): each
    layer's forward compiled inside an eager checkpoint (reentrant or not), so what the forward keeps for backward is what it
    keeps without compile (a compiled layer that held its checkpoint kept every activation on the H100: 19.1 GiB
    against 4.79, run counts-20261207-compiled, and here more than three times the uncompiled run's saved elements);
    one graph per grad mode (reentrant: the no-grad first forward and the recomputation), no graph break, the same
    gradients (Dynamo and AOTAutograd with the eager backend here:
    Inductor's codegen is not what this checks)."""
    import torch
    from torch._dynamo.utils import counters
    from course_utils.compiled_layers import compile_inside_checkpoint

    def train(compile_: str):
        model, ids = _tiny_llama_checkpointed(reentrant=reentrant)
        if compile_ == "inside":
            assert compile_inside_checkpoint(model, backend="aot_eager") == 3
        elif compile_ == "layers":  # compile_layers' way, the checkpoint inside the compiled layer
            for layer in model.model.layers:
                layer.compile(backend="aot_eager")
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return saved, [p.grad for p in model.parameters()]

    torch._dynamo.reset()
    counters.clear()
    plain_saved, plain = train("")
    saved, grads = train("inside")
    assert sum(saved) == sum(plain_saved) and len(saved) == len(plain_saved)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, grads))
    assert counters["stats"]["unique_graphs"] == (2 if reentrant else 1) and not counters["graph_break"]
    torch._dynamo.reset()
    if not reentrant:
        return
    flag = torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint
    torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True  # compiled_layers' setting
    try:
        held, _ = train("layers")
    finally:
        torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = flag
        torch._dynamo.reset()
    assert sum(held) > 3 * sum(plain_saved)  # the run-counts-20261207-compiled failure, on a CPU


def test_compiled_inside_the_checkpoint_fused_lora_keeps_no_dequantized_weight(tiny_model):
    """With fused LoRA on the tiny 4-bit model, compile_inside_checkpoint's layers keep for backward no more than the
    uncompiled ones over a forward and backward (the recomputation's included) and no dequantized weight: AOTAutograd's
    CSE would merge the forward's and the backward's dequantize and keep each dequantized weight (on the H100, the
    run-5 probe's 5.08 GiB against 4.79); compile_inside_checkpoint turns it off."""
    import weakref

    import bitsandbytes as bnb
    import torch
    import torch._functorch.config

    from course_utils.build import build
    from course_utils.compiled_layers import compile_inside_checkpoint

    recipe = Recipe(load_in_4bit=True, prepare_kbit=False, micro_batch=1, grad_accum=1, max_seq_length=64, steps=3,
                    warmup_steps=1, fused_lora=True, reentrant_checkpointing=True, gradient_checkpointing=True)

    def peak_saved(compile_: bool):
        built = build(recipe)
        model = built.trainer.model.train()
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
        model.enable_input_require_grads()
        if compile_:
            compile_inside_checkpoint(model, backend="aot_eager")
        batch = {k: v[:1] for k, v in next(iter(built.trainer.get_train_dataloader())).items()}
        live, seen, shapes = {"now": 0, "peak": 0}, set(), set()

        def pack(t):
            storage = t.untyped_storage()
            key, n = storage.data_ptr(), storage.nbytes()
            if key not in seen:
                seen.add(key)
                live["now"] += n
                live["peak"] = max(live["peak"], live["now"])
                weakref.finalize(storage, lambda: (seen.discard(key), live.__setitem__("now", live["now"] - n)))
            shapes.add(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(**batch).loss.backward()
        weights = {tuple(m.weight.quant_state.shape) for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)}
        return live["peak"], shapes & weights

    cse = torch._functorch.config.cse
    try:
        plain, _ = peak_saved(False)
        torch._dynamo.reset()
        compiled, kept_weights = peak_saved(True)
    finally:
        torch._functorch.config.cse = cse
        torch._dynamo.reset()
    assert 0 < compiled <= plain and not kept_weights


def test_the_recipe_knob_trains_the_same_compiled_and_is_refused_with_liger_or_whole_model_compile(tiny_model,
                                                                                                    monkeypatch):
    """build(Recipe(compile_layers=True)) compiles the layers when training begins (Trainer.train turns checkpointing
    on first), each forward once (one graph for the no-grad first forward, one for the recomputation; none on a second
    train()), and trains as the uncompiled recipe does; Liger's kernels and whole-model compile are refused by name."""
    import torch
    import torch._functorch.config
    from torch._dynamo.utils import counters

    from course_utils.build import build, library_objects

    made = compiled_layers.callback
    monkeypatch.setattr(compiled_layers, "callback", lambda: made(backend="aot_eager"))
    recipe = Recipe(load_in_4bit=True, prepare_kbit=False, micro_batch=1, grad_accum=2, max_seq_length=64, steps=3,
                    warmup_steps=1, fused_lora=True, reentrant_checkpointing=True, gradient_checkpointing=True)

    def losses(r):
        built = build(r)
        built.trainer.train()
        return built, [round(h["loss"], 4) for h in built.trainer.state.log_history if "loss" in h]

    cse = torch._functorch.config.cse
    try:
        torch._dynamo.reset()
        counters.clear()
        _, plain = losses(recipe)
        built, compiled = losses(recipe.with_(compile_layers=True))
        assert counters["stats"]["unique_graphs"] == 2 and not counters["graph_break"]
        built.trainer.train()  # a second train(): checkpointing set anew, the layers wrapped again, nothing recompiled
        assert counters["stats"]["unique_graphs"] == 2 and not counters["recompiles"]
    finally:
        torch._functorch.config.cse = cse
        torch._dynamo.reset()
    assert compiled == plain and len(plain) >= 2
    assert all(getattr(layer._gradient_checkpointing_func, "compiled_inside", False)
               for layer in compiled_layers.decoder_layers(built.trainer.model))
    assert any("compiled inside its checkpoint" in s
               for s in library_objects(recipe.with_(compile_layers=True)).course_steps)
    with pytest.raises(RecipeError, match="set liger_kernels=False"):
        recipe.with_(compile_layers=True, liger_kernels=True)
    with pytest.raises(RecipeError, match="torch_compile=True compiles the whole model"):
        recipe.with_(compile_layers=True, torch_compile=True)


def test_the_measured_steps_after_the_tracked_one_run_the_compiled_layers(tiny_model, monkeypatch):
    """torch.compile skips, for good, a function first called under a TorchDispatchMode (the course's MemoryTracker):
    before 2026-12-07 a compiled recipe's tracked step did that, and its timed steps ran eagerly (the shipped
    torch.compile and compiled-layer runs of 2026-12-02, notebook 10). The probe now runs the tracked step in the eager
    stance, so each timed step calls the compiled layers (counted through a counting backend)."""
    import torch

    from course_utils import child
    from course_utils.memtrack import MemoryTracker

    calls = [0]

    def counting(gm, example_inputs):
        from torch._dynamo.backends.debugging import aot_eager

        compiled = aot_eager(gm, example_inputs)

        def run(*args):
            calls[0] += 1
            return compiled(*args)
        return run

    torch._dynamo.reset()
    sin = torch.compile(lambda x: torch.sin(x) + 1, backend=counting)  # the pitfall itself, on a plain function
    x = torch.ones(4)
    sin(x)
    with MemoryTracker("cpu"):
        sin(x)
    sin(x)
    assert calls == [1]  # compiled once, then skipped under the mode and ever after: a newer torch may change this

    made, after_step = compiled_layers.callback, []
    monkeypatch.setattr(compiled_layers, "callback", lambda: made(backend=counting))
    real_build = child.build

    def build(recipe, callbacks=(), **kw):
        from transformers import TrainerCallback

        class Count(TrainerCallback):
            def on_step_end(self, *a, **k):
                after_step.append(calls[0])
        return real_build(recipe, callbacks=(*callbacks, Count()), **kw)

    monkeypatch.setattr(child, "build", build)
    recipe = Recipe(load_in_4bit=True, prepare_kbit=False, micro_batch=1, grad_accum=2, max_seq_length=64, steps=4,
                    warmup_steps=1, fused_lora=True, reentrant_checkpointing=True, gradient_checkpointing=True,
                    compile_layers=True)
    cse = torch._functorch.config.cse
    try:
        calls[0] = 0
        m = child.run_here(recipe)
    finally:
        torch._functorch.config.cse = cse
        torch._dynamo.reset()
    per_step = [b - a for a, b in zip([0] + after_step, after_step)]
    assert m.status == "ok" and per_step[0] > 0 and per_step[1] == 0  # warm-up compiled; the tracked step eager
    assert per_step[2:] == [per_step[0]] * (len(per_step) - 2)  # every timed step ran the compiled layers
