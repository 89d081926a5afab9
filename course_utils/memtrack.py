"""Tensor-level memory tracking by category, the same on CPU and CUDA.

Process RSS is too noisy to see these effects, and CUDA's allocator counters say how much, not what.
So we watch every tensor storage created while training runs (a `TorchDispatchMode` sees every
operation's outputs), and keep a running total per category:

- parameters:  model weights and buffers (4-bit weights with their quantization scales)
- gradients:   `.grad` of trainable parameters
- optimizer:   optimizer state (Adam's two moments, 8-bit state and its scales)
- activations: tensors created during the forward pass and still alive (kept for backward)
- temporaries: tensors created after the forward pass: backward work, recomputed activations
               under gradient checkpointing, loss metrics, optimizer-step scratch
- other:       anything else (the input batch, trainer bookkeeping)

A new storage is first counted in the category of the phase it was made in; once we know better
(a gradient was accumulated, the optimizer stepped) it moves to its real category. The peak is the
largest total seen, with its split by category at that moment.
"""

from __future__ import annotations

import torch
import weakref
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from typing import Iterable

from course_utils.common import CATEGORIES  # noqa: F401  (memtrack.CATEGORIES: what a byte is tagged as)

PHASE_CATEGORY = {"forward": "activations", "after_forward": "temporaries", "optimizer": "temporaries", "idle": "other"}


class BudgetExceeded(torch.OutOfMemoryError):
    """Raised when tracked memory passes a simulated budget: the recipe does not fit that device."""


class MemoryTracker(TorchDispatchMode):
    """Counts live tensor bytes on one device type, by category, and remembers the peak."""

    def __init__(self, device_type: str = "cpu", budget_bytes: int | None = None):
        super().__init__()
        self.device_type = device_type
        self.budget_bytes = budget_bytes
        self.phase = "idle"
        self._live: dict[int, list] = {}  # id(storage) -> [nbytes, category, weakref]
        self.current = dict.fromkeys(CATEGORIES, 0)
        self.total = 0
        self.peak = 0
        self.peak_by_category = dict(self.current)

    # --- bookkeeping ---------------------------------------------------------------------------
    def _track(self, storage: torch.UntypedStorage, category: str) -> None:
        """Start counting a storage we have not seen before."""
        key = id(storage)
        if key in self._live or storage.device.type != self.device_type:
            return
        nbytes = storage.nbytes()
        ref = weakref.ref(storage, lambda _r, key=key: self._forget(key))
        self._live[key] = [nbytes, category, ref]
        self.current[category] += nbytes
        self.total += nbytes
        if self.total > self.peak:
            self.peak = self.total
            self.peak_by_category = dict(self.current)
        if self.budget_bytes is not None and self.total > self.budget_bytes:
            raise BudgetExceeded(
                f"tracked memory reached {self.total / 2**20:.1f} MiB, over the budget of "
                f"{self.budget_bytes / 2**20:.1f} MiB"
            )

    def _forget(self, key: int) -> None:
        """A storage was freed: stop counting it."""
        entry = self._live.pop(key, None)
        if entry is not None:
            self.current[entry[1]] -= entry[0]
            self.total -= entry[0]

    def classify(self, tensors: Iterable[torch.Tensor], category: str) -> None:
        """Move these tensors' storages to `category` (tracking them if they are new)."""
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            entry = self._live.get(id(storage))
            if entry is None:
                self._track(storage, category)
            elif entry[1] != category:
                self.current[entry[1]] -= entry[0]
                self.current[category] += entry[0]
                entry[1] = category

    def reset_peak(self) -> None:
        """Forget the peak so far (after warm-up): the next peak is the steady-state one."""
        self.peak = self.total
        self.peak_by_category = dict(self.current)

    # --- the dispatch hook ---------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        category = PHASE_CATEGORY[self.phase]
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == self.device_type:
                self._track(t.untyped_storage(), category)
        return out


def model_state_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Weights and buffers, plus bitsandbytes 4-bit quantization state (absmax, code, nested scales)."""
    tensors: list[torch.Tensor] = []
    for p in model.parameters():
        tensors.append(p)
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            tensors.extend(_quant_state_tensors(qs))
    tensors.extend(model.buffers())
    return tensors


def _quant_state_tensors(qs) -> list[torch.Tensor]:
    """Tensors inside a bitsandbytes QuantState, nested double-quant state included."""
    out = [v for v in (getattr(qs, "absmax", None), getattr(qs, "code", None), getattr(qs, "offset", None))
           if isinstance(v, torch.Tensor)]
    if getattr(qs, "state2", None) is not None:
        out.extend(_quant_state_tensors(qs.state2))
    return out


def optimizer_state_tensors(optimizer) -> list[torch.Tensor]:
    """Every tensor in an optimizer's state (torch or bitsandbytes)."""
    out = []
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                out.append(value)
    return out


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind these tensors.

    A storage is known by its device and address (meta storages, which have none, by the Python object, kept
    alive here): keying on id() of the wrapper `untyped_storage()` returns let a freed wrapper's id be reused
    or a shared storage get a second wrapper, so the same tensors could sum differently from run to run. (The
    19,712 bytes a merged tiny 4-bit model once measured over its estimate were bitsandbytes' CPU repack, not
    this: build.one_4bit_format_on_every_cpu.)"""
    seen: dict = {}
    total = 0
    for t in tensors:
        s = t.untyped_storage()
        key = (str(s.device), s.data_ptr()) if s.data_ptr() else ("object", id(s))
        if key not in seen:
            seen[key] = s  # kept: while it lives, no other storage can take its id
            total += s.nbytes()
    return total
