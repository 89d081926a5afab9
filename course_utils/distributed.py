"""More than one GPU: train a recipe on several processes with `accelerate launch`, measured per GPU
(notebook 11_more_than_one_gpu).

Two ways to use a second card, both PyTorch's own engines, driven by accelerate and the Trainer:

- DDP (data parallelism; strategy="ddp"): the model fits one card. Every process holds the whole model and
  trains on its own share of the batches; after each backward the gradients are all-reduced (averaged), so
  every copy takes the same step. Per-GPU memory stays what one GPU needs; N cards train about N times the
  tokens per second, and the effective batch is N x micro_batch x grad_accum.
- FSDP (sharding; strategy="fsdp"): the model does not fit one card. Weights, gradients and optimizer state
  are split N ways; each layer is all-gathered just before it computes and freed after, so a GPU holds
  1/N of the model plus one layer in full. With QLoRA this needs the 4-bit weights stored in a float dtype
  (see accelerate_configs/fsdp_qlora.yaml). strategy="fsdp_offload" also keeps the parameters in CPU memory
  (Answer.AI's 70B on 2 x 24 GB cards).

    from course_utils.distributed import launch
    m = launch(Recipe(micro_batch=2, max_seq_length=64, steps=4), gpus=2, strategy="ddp")
    m.per_rank        # each rank's peak allocated/reserved memory, tokens and tokens/s
    m.tokens_per_s    # global: the tokens of all ranks per step / the step time

On a machine without GPUs, `gpus` is the number of CPU processes, talking over the gloo backend (the course's
CI path, with the embedded tiny model); FSDP needs GPUs there (launch says why). Each rank is one
course_utils.distributed_rank process; this module starts them, relays rank 0's progress, and combines their
results into one Measurement (gpus, strategy and per_rank set), stored like any other.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from course_utils import checks, child
from course_utils.common import GiB, MiB, shipped
from course_utils.launch import (CHILD_ERRORS, MeasurementError, TEMP_PREFIXES, _child_error, _progress_bar,
                                 _read_child_result, child_env, relay, temp_folder)
from course_utils.machine import HardwareError, rank_info
from course_utils.recipe import Recipe, RecipeError
from course_utils.results import (Measurement, ResultStore, STRATEGIES as _STORED_STRATEGIES, default_store,
                                  environment)
from course_utils.show.tables import Column, Table

STRATEGIES = tuple(s for s in _STORED_STRATEGIES if s)  # ("ddp", "fsdp", "fsdp_offload")
CONFIGS = {"ddp": "ddp.yaml", "fsdp": "fsdp_qlora.yaml", "fsdp_offload": "fsdp_qlora.yaml"}


def config_file(strategy: str) -> Path:
    """The accelerate config the package ships for a strategy (course_utils/accelerate_configs/)."""
    check_strategy(strategy)
    return shipped("accelerate_configs", CONFIGS[strategy])


def check_strategy(strategy: str) -> None:
    """An unknown strategy is a RecipeError that lists the known ones."""
    if strategy not in STRATEGIES:
        raise RecipeError(f"strategy must be one of {STRATEGIES} ('ddp': a full copy of the model per GPU; 'fsdp': "
                          f"the model sharded across them), got {strategy!r}.")


def visible_gpus() -> int:
    """CUDA GPUs this process can see (CUDA_VISIBLE_DEVICES applied); 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_launch(recipe: Recipe, gpus: int, strategy: str) -> str:
    """Every check before any process starts; RecipeError or HardwareError with the fix in the message.
    Returns where the ranks train: 'cuda' or 'cpu'."""

    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise RecipeError(f"gpus must be a whole number, 1 or more (the processes that train together), got {gpus!r}.")
    check_strategy(strategy)
    have = visible_gpus()
    sharded = strategy.startswith("fsdp")
    if have == 0 and sharded:
        four_bit = (" FSDP-QLoRA (load_in_4bit=True) is a GPU recipe, and" if recipe.load_in_4bit else "")
        raise HardwareError(
            f"strategy={strategy!r} needs GPUs, and this machine has none.{four_bit} accelerate turns FSDP on only for "
            "GPU processes: on CPU processes it would quietly train with DDP and shard nothing. Use strategy='ddp' "
            "here (gloo processes), or run on a machine with GPUs.")
    if sharded and recipe.load_in_4bit and recipe.prepare_kbit:
        raise RecipeError(
            "FSDP-QLoRA flattens each unit's weights into one tensor of one dtype, and prepare_kbit=True upcasts the "
            "norms and embeddings to fp32 beside the 4-bit weights stored in the compute dtype. "
            "Set prepare_kbit=False.")
    if sharded and recipe.offload_embeddings:
        raise RecipeError("offload_embeddings=True keeps the embedding table out of the sharded model, which FSDP "
                          "does not allow; set offload_embeddings=False (FSDP shards the table instead).")
    if have == 0:
        cores = os.cpu_count() or 1
        if gpus > cores:
            raise HardwareError(f"gpus={gpus} asks for {gpus} CPU processes (this machine has no GPU), but it has "
                                f"{cores} CPU cores; each process needs one. Use gpus <= {cores}.")
    elif gpus > have:
        seen = os.environ.get("CUDA_VISIBLE_DEVICES")
        why = f" (CUDA_VISIBLE_DEVICES={seen!r})" if seen is not None else ""
        raise HardwareError(f"gpus={gpus} asks for {gpus} GPUs, but this process sees {have}{why}. Use gpus <= {have}, "
                            "or make more GPUs visible.")
    checks.check_runnable(recipe)
    checks.check_data(recipe, world=gpus)  # one step of all the processes together must come from the data
    return "cuda" if have else "cpu"


def launch_command(recipe: Recipe, gpus: int, strategy: str, out: Path, *,
                   save_adapter: str | os.PathLike | None = None, first_step: bool = False) -> list[str]:
    """The `accelerate launch` command that starts the ranks (python -m accelerate.commands.launch)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file(strategy)),
           "--num_processes", str(gpus), "--num_machines", "1", "--main_process_port", "0"]
    if strategy == "fsdp_offload":
        cmd += ["--fsdp_offload_params", "true"]
    cmd += ["--module", "course_utils.distributed", "--recipe", json.dumps(recipe.to_dict()),
            "--out", str(out), "--strategy", strategy]
    if save_adapter is not None:
        cmd += ["--save", str(save_adapter)]
    if first_step:
        cmd.append("--first-step")
    return cmd


def launch_env(recipe: Recipe, gpus: int, device: str) -> dict:
    """The ranks' environment: measure's child environment, plus, on a CPU, gloo processes of a share of the
    cores each (ACCELERATE_USE_CPU)."""
    env = child_env(recipe)
    if device == "cpu":
        env["ACCELERATE_USE_CPU"] = "true"
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // gpus))
    return env


def launch(recipe: Recipe, gpus: int = 2, strategy: str = "ddp", *, store: ResultStore | None = None,
           force: bool = False, progress: bool = True, timeout_s: float | None = None,
           save_adapter: str | os.PathLike | None = None, workdir: str | os.PathLike | None = None,
           first_step: bool = False) -> Measurement:
    """Train the recipe on `gpus` processes with `accelerate launch` and the strategy's shipped config, and
    return one Measurement of the whole run (notebook 11_more_than_one_gpu; `course run --gpus N`).

    The recipe is per GPU: each rank trains micro_batch x grad_accum sequences a step, so a step of the run
    trains gpus times that. The result's peak_bytes and cuda_max_allocated/reserved are the largest of any
    rank (what each card must hold), per_rank has every rank's figures, and tokens_per_s is global: all the
    ranks' tokens of a step / the step time (the slowest rank's median step). A stored result of the same
    recipe, environment, gpus and strategy is returned instead of a new run, unless force=True.

    save_adapter: a folder to save the trained adapter in (rank 0 writes it). workdir: a folder for the ranks'
    own files (rank<N>.json; with first_step=True also each rank's first batch and first-step gradients),
    kept after the run; by default a temporary folder, removed. timeout_s stops a run that takes longer.
    """
    device = check_launch(recipe, gpus, strategy)
    store = store or default_store()
    env_key = environment().key
    if not force and not first_step and save_adapter is None:
        found = store.find(recipe, env_key, gpus=gpus, strategy=strategy)
        if found is not None and not found.noisy:
            found.cached = True
            found.recipe = {**found.recipe, "label": recipe.label}
            if progress:  # what is read back says so, with the date it was measured
                print(read_back_line(found), flush=True)
            return found
    store.check_writable()
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        ranks = _run_ranks(recipe, gpus, strategy, device, Path(workdir), save_adapter, first_step, progress, timeout_s)
    else:
        with temp_folder(TEMP_PREFIXES[0]) as tmp:
            ranks = _run_ranks(recipe, gpus, strategy, device, Path(tmp), save_adapter, first_step, progress, timeout_s)
    result = combine(recipe, strategy, ranks, gpus)
    store.add(result)
    result.recipe = {**result.recipe, "label": recipe.label}
    return result


def _run_ranks(recipe: Recipe, gpus: int, strategy: str, device: str, out: Path, save_adapter, first_step: bool,
               progress: bool, timeout_s: float | None) -> list[dict]:
    """Start accelerate launch, relay rank 0's progress, wait; every rank's record, in rank order."""
    for old in out.glob("rank*.json"):  # a kept folder from an earlier run: only this run's records count
        old.unlink()
    cmd = launch_command(recipe, gpus, strategy, out, save_adapter=save_adapter, first_step=first_step)
    # a session of its own, so that a timeout stops accelerate, torchrun and every rank together
    code, log, timed_out = relay(cmd, launch_env(recipe, gpus, device), _progress_bar(recipe, progress), timeout_s,
                                 kill=_kill_group, new_session=True)
    if timed_out:
        raise MeasurementError(f"the {gpus}-process run of {recipe.name!r} took longer than {timeout_s} s; stopped it.")
    records = {}
    for path in out.glob("rank*.json"):
        d = json.loads(path.read_text())
        records[d["rank"]] = d
    for d in records.values():
        if "child_error" in d:
            _read_child_result(d)  # raises the rank's error, same type, same message
    out_of_memory = any(d["measurement"]["status"] != "ok" for d in records.values())
    if len(records) != gpus and not out_of_memory:  # a rank that ran out of memory stops the others: not a failure
        tail = "".join(log[-40:])
        raise MeasurementError(f"the {gpus}-process run of {recipe.name!r} failed (exit code {code}; results from "
                               f"rank(s) {sorted(records)} of {gpus}). Last lines of its log:\n{tail}")
    return [records[r] for r in sorted(records)]


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop the launcher's session (the launcher, torchrun and the ranks it started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def combine(recipe: Recipe, strategy: str, ranks: list[dict], gpus: int | None = None) -> Measurement:
    """One Measurement from the ranks' records: the largest per-rank peaks, every rank in per_rank, and the
    global tokens/s (sum of the ranks' tokens per step / the slowest rank's median step time). `gpus` (default:
    one per record) is larger when a rank ran out of memory and the others were stopped before they wrote."""
    ms = [Measurement.from_dict(r["measurement"]) for r in ranks]
    first = ms[0]
    per_rank = [{"rank": r["rank"], "peak_bytes": m.peak_bytes, "cuda_max_allocated": m.cuda_max_allocated,
                 "cuda_max_reserved": m.cuda_max_reserved, "tokens": r["tokens"], "tokens_per_s": m.tokens_per_s,
                 "first_batch": r["first_batch"], "saved_adapter": 1 if r["saved"] else 0}
                for r, m in zip(ranks, ms)]
    failed = [(r["rank"], m) for r, m in zip(ranks, ms) if not m.fits]
    status = "does_not_fit" if failed else "ok"
    error = "; ".join(f"rank {rank}: {m.error}" for rank, m in failed)
    rate = None
    if not failed and len(ms) == (gpus or len(ms)) and all(m.tokens_per_s for m in ms):
        step_s = max(recipe.tokens_per_step / m.tokens_per_s for m in ms)  # the ranks step together
        rate = round(len(ms) * recipe.tokens_per_step / step_s, 1)
    peakest = max(ms, key=lambda m: m.peak_bytes)
    cuda = [m.cuda_max_allocated for m in ms if m.cuda_max_allocated is not None]
    reserved = [m.cuda_max_reserved for m in ms if m.cuda_max_reserved is not None]
    timing = {}
    spreads = [m.timing["spread"] for m in ms if "spread" in m.timing]
    shares = [m.timing["cpu_share"] for m in ms if "cpu_share" in m.timing]
    if ms[0].timing.get("timed_steps") is not None:
        timing["timed_steps"] = ms[0].timing["timed_steps"]
    if spreads:
        timing["spread"] = max(spreads)
    if shares:
        timing["cpu_share"] = min(shares)
    backend = "gloo" if ranks[0]["distributed_type"] == "MULTI_CPU" else "nccl"
    notes = list(first.notes) + [
        f"{gpus or len(ms)} processes, {strategy} through accelerate launch ({ranks[0]['distributed_type']}, {backend}); "
        "peaks: the largest rank's; tokens/s: all ranks' tokens per step / the slowest rank's median step"]
    return Measurement(
        recipe=first.recipe, recipe_key=first.recipe_key, env=first.env, env_key=first.env_key, status=status,
        error=error, peak_bytes=peakest.peak_bytes, peak_by_category=dict(peakest.peak_by_category),
        cuda_max_allocated=max(cuda) if cuda else None, cuda_max_reserved=max(reserved) if reserved else None,
        tokens_per_s=rate, losses=first.losses, precision=first.precision, trainable_params=first.trainable_params,
        model_bytes=max(m.model_bytes for m in ms), duration_s=max(m.duration_s for m in ms),
        startup_s=max(m.startup_s for m in ms), build_s=max(m.build_s for m in ms), notes=notes, date=first.date,
        command=first.command, run_id=first.run_id, timing=timing, gpus=gpus or len(ms), strategy=strategy,
        per_rank=per_rank)

DISTRIBUTED_TYPES = {"ddp": ("MULTI_GPU", "MULTI_CPU"), "fsdp": ("FSDP",), "fsdp_offload": ("FSDP",)}
DOES_NOT_FIT_EXIT = 4  # a rank that ran out of memory exits with this, so that torchrun stops the others


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


    rank, world, local = rank_info()
    if torch.cuda.is_available():
        torch.cuda.set_device(local)  # before anything touches the GPU: this rank's card
    if world > 1:
        from accelerate import PartialState

        # the process group exists before the model loads: FSDP's CPU-RAM-efficient loading needs it
        PartialState(cpu=not torch.cuda.is_available())
    recorder = RankRecorder(strategy, first_step)
    m = child.run_here(recipe, report_progress=rank == 0, on_built=recorder.on_built)
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


def fsdp_ready(recipe: Recipe) -> Recipe:
    """A recipe as FSDP-QLoRA runs it (notebook 11; `course run --strategy fsdp`): 4-bit weights share one
    storage dtype with every other weight of a unit, so no fp32 upcast (prepare_kbit=False); others unchanged."""
    return recipe.with_(prepare_kbit=False, label=recipe.label) if recipe.load_in_4bit else recipe


def rank_table(measurements) -> Table:
    """Each rank of each multi-process measurement: its peak (tensor-level; CUDA's allocated and reserved on a
    GPU), tokens trained and its own tokens/s, and a hash of its first batch (different ranks, different data)."""
    unit = "MiB" if all((r["peak_bytes"] or 0) < GiB for m in measurements for r in m.per_rank) else "GiB"
    scale = MiB if unit == "MiB" else GiB
    columns = [Column("recipe", wrap=True), Column("rank", fmt="d"), Column("peak", unit, ".1f" if unit == "MiB"
                                                                              else ".2f"),
               Column("reserved", unit, ".1f" if unit == "MiB" else ".2f"), Column("tokens", fmt=",d"),
               Column("tokens/s", fmt=",.0f"), Column("first batch")]
    rows = [(m.label, r["rank"], r["peak_bytes"] / scale,
             (r["cuda_max_reserved"] / scale) if r.get("cuda_max_reserved") else None, r["tokens"],
             r["tokens_per_s"], r["first_batch"]) for m in measurements for r in m.per_rank]
    return Table(columns, rows)


if __name__ == "__main__":
    sys.exit(main())
