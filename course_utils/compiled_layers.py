"""Recipe(compile_layers=True) (issue 31): torch.compile each decoder layer's forward inside its checkpoint, so the
host dispatches a few fused kernels per layer in place of hundreds of operators, and checkpointing still recomputes
each layer. Measured on an H100 beside Unsloth (README.md, "Compiled layers": faster at 1 x 16, not at 16 x 1) and
under the T4 profile; notebook 09 reads its launch count; the planner offers it in place of Liger (estimate/plan.py).

transformers 5 checkpoints a layer's `forward` (GradientCheckpointingLayer calls the layer's checkpoint function with
it), so compiling the layer itself (`layer.compile()`) puts the checkpoint inside the compiled graph: with reentrant
checkpointing nothing was recomputed and every activation stayed (19.10 GiB against 4.79 on the H100, run
counts-20261207-compiled). Here the checkpoint stays eager and runs a compiled copy of the forward it is given (one
compiled function, shared by the layers). In your own script, with the course installed:

    from course_utils.compiled_layers import callback
    trainer.add_callback(callback())        # wraps the layers when train() has turned checkpointing on

Liger's kernels do not go with it (Liger 0.8.5 calls its RoPE through a torch.compiler.disable'd dispatch(), where a
compiled layer breaks and compiles nothing: Recipe refuses the pair); torch.compile fuses RMSNorm, SwiGLU and RoPE
itself.
"""

from __future__ import annotations

import functools


def decoder_layers(model) -> list:
    """The layers transformers checkpoints (its GradientCheckpointingLayer modules: the decoder layers)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def allow_a_compile_per_layer() -> None:
    """One graph serves every layer (their parameters are the graph's inputs; on a CPU, no recompiles). Should a guard
    on some layer's attribute recompile per layer anyway, the default limit (8) would leave the rest eager: allow one
    per layer. recompile_limit is the name since torch 2.6; cache_size_limit the older alias."""
    import torch

    name = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))


def compile_inside_checkpoint(model, cache: dict | None = None, **compile_kwargs) -> int:
    """torch.compile each decoder layer's forward, inside its checkpoint: the layer's checkpoint function runs a
    compiled copy of the function it is given (one per distinct forward, made once and kept in `cache`). Reentrant or
    not, the checkpoint recomputes as without compile (tests/test_compiled_layers.py). To be called once checkpointing is on
    (a layer already wrapped is left as it is); compile_kwargs go to torch.compile; returns the number of layers.

    It also turns off AOTAutograd's common-subexpression elimination, for the whole process: fused LoRA dequantizes
    each NF4 weight in its forward and again in its backward, CSE makes the two one, and the dequantized weights were
    then saved for the backward (on a CPU, tiny model: peak saved 5.70 MiB uncompiled, 8.86 compiled, 5.36 compiled
    without CSE; the run-5 probe on the H100: 5.08 GiB against 4.79)."""
    import torch
    import torch._functorch.config

    torch._functorch.config.cse = False
    allow_a_compile_per_layer()
    compiled = {} if cache is None else cache  # the layer's forward -> its compiled copy
    layers = decoder_layers(model)
    for layer in layers:
        if getattr(layer._gradient_checkpointing_func, "compiled_inside", False):
            continue

        def run(fn, *args, _checkpoint=layer._gradient_checkpointing_func):  # fn: partial(forward, layer, **kwargs)
            inner = compiled.get(fn.func)
            if inner is None:
                inner = compiled[fn.func] = torch.compile(fn.func, **compile_kwargs)
            return _checkpoint(functools.partial(inner, *fn.args, **fn.keywords), *args)
        run.compiled_inside = True
        layer._gradient_checkpointing_func = run
    return len(layers)


def callback(**compile_kwargs):
    """A TrainerCallback that compiles the layers inside their checkpoints whenever training begins (Trainer.train
    turns checkpointing on first, setting each layer's checkpoint function anew), compiling each forward once."""
    from transformers import TrainerCallback

    cache: dict = {}  # each forward compiled once, over every train() of the trainer

    class CompileLayers(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            compile_inside_checkpoint(model, cache, **compile_kwargs)

    return CompileLayers()
