"""One rank of a multi-process run: what `accelerate launch` starts once per GPU (or, on a CPU, once per gloo
process) for course_utils.distributed.launch (notebook 09_more_than_one_gpu).

A rank trains the recipe with the course's own measuring run (measure.run_here: build's SFTTrainer, the
tensor-level tracker, the probe); the Trainer sees the distributed environment accelerate set up and wraps
the model in DDP or FSDP itself. On top of that a rank records the tokens it processed and a fingerprint of
its first batch (the ranks must see different data), optionally the first step's gradients (the tests
compare them with one process on the whole batch), saves the adapter (the Trainer writes it on rank 0 only),
and writes rank<N>.json into the run's folder, where the parent combines the ranks into one Measurement.

    python -m course_utils.distributed_rank --recipe JSON --out FOLDER --strategy ddp [--save FOLDER] [--first-step]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from .recipe import Recipe

DISTRIBUTED_TYPES = {"ddp": ("MULTI_GPU", "MULTI_CPU"), "fsdp": ("FSDP",), "fsdp_offload": ("FSDP",)}
DOES_NOT_FIT_EXIT = 4  # a rank that ran out of memory exits with this, so that torchrun stops the others


def rank_info() -> tuple[int, int, int]:
    """(rank, world size, local rank) from the variables torchrun sets; (0, 1, 0) in a plain process."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0)))


def fingerprint(ids) -> str:
    """12 hex digits that name a batch of token ids (equal batches, equal fingerprints)."""
    return hashlib.sha256(ids.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:12]


class RankRecorder:
    """Hooks and a Trainer callback on one rank: tokens seen, the first batch, the first step's gradients."""

    def __init__(self, strategy: str, first_step: bool):
        self.strategy, self.first_step = strategy, first_step
        self.tokens = 0
        self.first_ids = None  # the first micro-batch's input_ids
        self.grads: dict = {}  # name -> gradient of each trainable parameter before the first optimizer step
        self.trainer = None
        self.distributed_type = ""

    def on_built(self, built) -> None:
        """measure.run_here's hook: check what accelerate set up, hook the model, add the callback."""
        from transformers import TrainerCallback

        self.trainer = built.trainer
        self.distributed_type = str(built.trainer.accelerator.distributed_type).split(".")[-1]
        _, world, _ = rank_info()
        # one process: a plain run (NO), or torchrun's single rank (accelerate still sets up the strategy)
        allowed = DISTRIBUTED_TYPES[self.strategy] + (() if world > 1 else ("NO",))
        if self.distributed_type not in allowed:
            from .measure import MeasurementError

            raise MeasurementError(
                f"strategy={self.strategy!r} on {world} process(es) asked accelerate for {' or '.join(allowed)}, "
                f"but it set up {self.distributed_type}; nothing was measured. On a CPU only 'ddp' works.")
        built.trainer.model.register_forward_pre_hook(self._forward_pre, with_kwargs=True)
        recorder = self

        class _Grads(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
                if recorder.first_step and state.global_step == 0 and model is not None:
                    recorder.grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()
                                      if p.requires_grad and p.grad is not None}

        built.trainer.add_callback(_Grads())

    def _forward_pre(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            self.tokens += ids.numel()
            if self.first_ids is None:
                self.first_ids = ids.detach().cpu().clone()


def run_rank(recipe: Recipe, out: Path, strategy: str = "ddp", save: str | None = None,
             first_step: bool = False) -> dict:
    """Train and measure the recipe as this rank; write rank<N>.json (and rank<N>-first-step.pt) into `out`
    and return what was written. In a plain process it is a one-process run (the tests' reference)."""
    import torch

    from .measure import run_here

    rank, world, local = rank_info()
    if torch.cuda.is_available():
        torch.cuda.set_device(local)  # before anything touches the GPU: this rank's card
    if world > 1:
        from accelerate import PartialState

        # the process group exists before the model loads: FSDP's CPU-RAM-efficient loading needs it
        PartialState(cpu=not torch.cuda.is_available())
    recorder = RankRecorder(strategy, first_step)
    m = run_here(recipe, report_progress=rank == 0, on_built=recorder.on_built)
    saved = False
    if save and m.fits and recorder.trainer is not None:
        recorder.trainer.save_model(save)  # every rank calls it (FSDP gathers); the Trainer writes on rank 0
        saved = bool(recorder.trainer.args.should_save)
    out.mkdir(parents=True, exist_ok=True)
    if first_step:
        torch.save({"grads": recorder.grads, "first_ids": recorder.first_ids}, out / f"rank{rank}-first-step.pt")
    record = {"rank": rank, "world": world, "distributed_type": recorder.distributed_type,
              "tokens": recorder.tokens, "saved": saved, "measurement": json.loads(m.to_json()),
              "first_batch": fingerprint(recorder.first_ids) if recorder.first_ids is not None else ""}
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    recorder.trainer = None
    return record


def main(argv: list[str] | None = None) -> int:
    """Entry point under `accelerate launch -m course_utils.distributed_rank`."""
    from .measure import CHILD_ERRORS, _child_error

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipe", required=True, help="Recipe as JSON (Recipe.to_dict())")
    parser.add_argument("--out", required=True, help="the run's folder: rank<N>.json goes there")
    parser.add_argument("--strategy", default="ddp", choices=sorted(DISTRIBUTED_TYPES))
    parser.add_argument("--save", default=None, help="save the trained adapter into this folder (rank 0 writes)")
    parser.add_argument("--first-step", action="store_true", help="keep the first step's gradients and batch")
    args = parser.parse_args(argv)
    out = Path(args.out)
    rank, world, _ = rank_info()
    try:
        record = run_rank(Recipe.from_dict(json.loads(args.recipe)), out, args.strategy, args.save, args.first_step)
    except Exception as exc:  # the parent raises it again, as the same type with the same message
        if type(exc).__name__ not in CHILD_ERRORS:
            raise
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, **_child_error(exc)}))
        return 3
    finally:
        _leave_process_group()
    if record["measurement"]["status"] != "ok" and world > 1:
        return DOES_NOT_FIT_EXIT  # the other ranks may wait in a collective that never comes: torchrun stops them
    return 0


def _leave_process_group() -> None:
    """Destroy the process group if this rank made one (no warning at exit)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
