"""Issue 31's "offload only the layer input, into pinned buffers allocated once": a change tried at 16 x 1, where the
course's recipe keeps its saved activations in CPU memory through trl's offloader (Recipe(offload_activations=True),
SFTConfig(activation_offloading=True)).

Under checkpointing, what a decoder layer leaves for its backward pass is its input: torch's checkpoint saves it
(non-reentrant: `_NoopSaveInputs`; reentrant: `CheckpointFunction`'s save_for_backward), everything inside the layer
is recomputed. trl's offloader moves every saved tensor over 1 KiB outside the head, each into a fresh pinned tensor
(torch's host caching allocator), with a copy-stream wait, an event and a stash entry per tensor. This one moves
only the layer inputs: a forward pre-hook on each decoder layer (transformers 5 checkpoints the layer's `forward`,
inside `__call__`, so module hooks run outside the checkpoint) marks the next hidden-state-shaped tensor saved as the
layer's input; it is copied on a side stream into a pinned buffer from a pool that grows in the first micro-batch and
is reused after (`allocated` counts the buffers); in the backward pass each input is copied back on the side stream,
the next one (the layer before) prefetched while this layer's backward runs. No host-device wait anywhere: the
compute stream waits on the copy stream's events, the GPU side. With reentrant checkpointing it does what Unsloth's
offloaded checkpoint does, which trl's offloader cannot (it would move the recomputed activations too:
Recipe(reentrant_checkpointing=True, offload_activations=True) is refused).

Used by scripts/gpu/count_launches.py's "-pinned" variants (installed when training begins, in place of the
trainer's `maybe_activation_offload_context`, the context trl's SFTTrainer.training_step enters for each
micro-batch). On a CPU the "copies" are plain CPU copies (no streams): tests/test_count_launches.py checks the same
losses with and without it and that the pool stops growing after the first micro-batch.
"""

from __future__ import annotations

import torch


class LayerInputOffload:
    """A saved-tensors-hooks context (enter it around each micro-batch's forward and backward) that keeps each
    checkpointed decoder layer's input in a reused pinned CPU buffer until the backward pass needs it."""

    def __init__(self, model, hidden_size: int):
        self.hidden = hidden_size
        self.layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
        if not self.layers:
            raise ValueError("LayerInputOffload: the model has no module named *DecoderLayer to take inputs from")
        for layer in self.layers:
            layer.register_forward_pre_hook(self._mark)
        self.cuda = any(p.is_cuda for p in model.parameters())  # (the embedding table may stay on the CPU)
        self.copy_stream = torch.cuda.Stream() if self.cuda else None
        self.pool: dict[tuple, list[torch.Tensor]] = {}
        self.allocated = 0  # pinned buffers made so far (the pool's size): grows in the first micro-batch only
        self.offloaded = 0  # layer inputs moved, all micro-batches
        self.entries: list[dict] = []  # this micro-batch's layer inputs, in the order saved
        self._armed = False
        self._hooks = None

    # forward: the pre-hook arms; the checkpoint's save of the layer's input is the next hidden-state-shaped pack
    def _mark(self, module, args):
        if self._hooks is not None and torch.is_grad_enabled() and module.training:
            self._armed = True

    def _take(self, t: torch.Tensor) -> bool:
        return (self._armed and t.dim() == 3 and t.shape[-1] == self.hidden and t.is_floating_point()
                and not isinstance(t, torch.nn.Parameter))

    def _buffer(self, t: torch.Tensor) -> torch.Tensor:
        free = self.pool.setdefault((tuple(t.shape), t.dtype), [])
        if free:
            return free.pop()
        self.allocated += 1
        return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self.cuda)

    def pack(self, t: torch.Tensor):
        if not self._take(t):
            return t
        self._armed = False
        buf, t = self._buffer(t), t.contiguous()
        if self.cuda:
            self.copy_stream.wait_stream(torch.cuda.current_stream())  # the input is computed before it is copied
            with torch.cuda.stream(self.copy_stream):
                buf.copy_(t, non_blocking=True)
            t.record_stream(self.copy_stream)  # its memory is not reused before the copy is done
        else:
            buf.copy_(t)
        entry = dict(index=len(self.entries), buf=buf, device=t.device, back=None, event=None)
        self.entries.append(entry)
        self.offloaded += 1
        return entry

    def _bring_back(self, entry: dict) -> None:
        if entry["back"] is not None:
            return
        if not self.cuda:
            entry["back"] = entry["buf"].clone()
            return
        back = torch.empty_like(entry["buf"], device=entry["device"])  # on the compute stream
        self.copy_stream.wait_stream(torch.cuda.current_stream())  # its memory's last use is done
        with torch.cuda.stream(self.copy_stream):
            back.copy_(entry["buf"], non_blocking=True)
            entry["event"] = self.copy_stream.record_event()
        entry["back"] = back

    def unpack(self, packed):
        if not isinstance(packed, dict):
            return packed
        self._bring_back(packed)
        back, packed["back"] = packed["back"], None  # the next unpack of it (none expected) copies again
        if self.cuda:
            torch.cuda.current_stream().wait_event(packed["event"])
        i = packed["index"]
        if i > 0:  # the backward pass goes from the last layer to the first: start the one before now
            self._bring_back(self.entries[i - 1])
        return back

    def __enter__(self):
        self.entries = []
        self._armed = False
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        self._hooks = None
        for e in self.entries:  # every buffer back to the pool: a later copy into it runs on the same copy stream,
            e["back"] = None    # after this micro-batch's copies out of it
            self.pool[(tuple(e["buf"].shape), e["buf"].dtype)].append(e["buf"])
        self.entries = []
        return False


def install(trainer) -> str:
    """Puts a LayerInputOffload in place of the trainer's per-micro-batch context (trl's offloader or nothing)."""
    model = trainer.model
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    if hidden is None:
        raise ValueError("LayerInputOffload: the model's config has no hidden_size")
    trainer.maybe_activation_offload_context = LayerInputOffload(model, hidden)
    return ("each decoder layer's checkpointed input in a pinned CPU buffer allocated once (layer_offload.py, "
            "in place of trl's offloader)")
