"""Selective activation checkpointing (SAC) beside none and full, on QLoRA, in one process (issue 29).

    python scripts/gpu/selective_checkpointing.py --out course_utils/reference/checkpointing/llama-3.1-8b.jsonl
    python scripts/gpu/selective_checkpointing.py --lora-bf16 --out course_utils/reference/checkpointing/lora-bf16-llama-3.1-8b.jsonl
    python scripts/gpu/selective_checkpointing.py --device cpu --model tiny --seq 128 --out /tmp/sac.jsonl  # dry run
    python scripts/gpu/selective_checkpointing.py --print-only --out course_utils/reference/checkpointing/llama-3.1-8b.jsonl

The model is built the way every course run builds it (course_utils.build.build on a random-weight preset: NF4
with double quantization, LoRA r=16 on q, k, v, o, bf16, the chapter's packed data; --lora-bf16: notebook 01's
bf16 LoRA with adamw_torch instead), once. Then each setting trains
the same LoRA start on the same micro-batches with a fresh paged_adamw_8bit, interleaved with repeats (ABCDABCD), at
each micro-batch size, sequence 512, one micro-batch per optimizer step. A setting is switched exactly as the
Trainer switches it from `SFTConfig(activation_checkpointing=..., activation_checkpointing_kwargs=...)`
(transformers/trainer.py: `model.activation_checkpointing_enable(activation_checkpointing_kwargs=...)`):

- none:                no activation checkpointing
- full:                {"use_reentrant": False}: every decoder layer keeps its input and recomputes the rest
- selective-attention: + context_fn saving the attention (SDPA) outputs: trl's own SAC policy
                       (trl/models/selective_activation_checkpointing.py)
- selective-matmul:    + context_fn saving every matmul's output (aten.mm, aten.addmm, aten.bmm, SDPA and, on a
                       4-bit model, bitsandbytes' gemm_4bit, which a policy sees as one op); the rest is recomputed
- selective-aten-matmul (not in the default set): the same without gemm_4bit: on QLoRA only LoRA's matmuls and SDPA

Per setting and micro-batch it records: CUDA's allocated peak over the timed steps (torch.cuda.max_memory_allocated
after a reset that follows the warm-up steps), tokens/s over the timed steps, every step's loss, and the bytes the
forward leaves alive for the backward (course_utils.memtrack's tensor-level tracker, one extra untimed step in the
first run of each setting: the same bytes in every run). One JSON
line per setting and micro-batch goes to --out with the GPU, its environment (driver, CUDA, library versions), the
date and the command; a table is printed.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # course_utils, from a checkout

import torch  # noqa: E402
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts  # noqa: E402

GiB = 2**30
SETTINGS = ("none", "full", "selective-attention", "selective-matmul", "selective-aten-matmul")
DEFAULT_SETTINGS = SETTINGS[:4]


def _ops(names, namespace=torch.ops.aten) -> frozenset:
    """The default overloads of these ops (a name this torch build lacks is skipped)."""
    return frozenset(getattr(namespace, n).default for n in names if hasattr(namespace, n))


ATTENTION_OPS = _ops(("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                      "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"))
ATEN_MATMUL_OPS = _ops(("mm", "addmm", "bmm")) | ATTENTION_OPS


def _bnb_gemm_4bit() -> frozenset:
    """bitsandbytes' 4-bit matmul (dequantize + matmul in one custom op; SAC sees it whole, not its inner aten.mm)."""
    import bitsandbytes  # noqa: F401  (registers torch.ops.bitsandbytes)

    return frozenset({torch.ops.bitsandbytes.gemm_4bit.default})


def save_attention(ctx, op, *args, **kwargs):
    """SAC policy: keep the attention outputs, recompute everything else (trl's policy)."""
    return CheckpointPolicy.MUST_SAVE if op in ATTENTION_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def save_aten_matmuls(ctx, op, *args, **kwargs):
    """SAC policy: keep the outputs of aten's matmuls and attention, recompute the elementwise rest."""
    return CheckpointPolicy.MUST_SAVE if op in ATEN_MATMUL_OPS else CheckpointPolicy.PREFER_RECOMPUTE


@functools.cache
def _all_matmul_ops() -> frozenset:
    return ATEN_MATMUL_OPS | _bnb_gemm_4bit()


def save_matmuls(ctx, op, *args, **kwargs):
    """SAC policy: keep every matmul's output, bitsandbytes' 4-bit matmul included; recompute the rest."""
    return CheckpointPolicy.MUST_SAVE if op in _all_matmul_ops() else CheckpointPolicy.PREFER_RECOMPUTE


POLICIES = {"selective-attention": save_attention, "selective-matmul": save_matmuls,
            "selective-aten-matmul": save_aten_matmuls}


def checkpointing_kwargs(setting: str) -> dict | None:
    """SFTConfig's activation_checkpointing_kwargs for a setting (None: no checkpointing)."""
    if setting == "none":
        return None
    kwargs = {"use_reentrant": False}
    if setting in POLICIES:
        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, POLICIES[setting])
    return kwargs


def set_checkpointing(model, setting: str) -> None:
    """Switch the model to a setting the way the Trainer does (transformers/trainer.py, `activation_checkpointing`)."""
    kwargs = checkpointing_kwargs(setting)
    if kwargs is None:
        model.activation_checkpointing_disable()
    else:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)


def parse_args(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON-lines file, one line per setting and micro-batch (appended)")
    ap.add_argument("--model", default="llama-3.1-8b", help="a course preset (random weights) or 'tiny'")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run (no memory peak)")
    ap.add_argument("--settings", default=",".join(DEFAULT_SETTINGS),
                    help=f"comma-separated, from {', '.join(SETTINGS)}")
    ap.add_argument("--micro-batches", default="4,1", help="comma-separated micro-batch sizes")
    ap.add_argument("--seq", type=int, default=512, help="tokens per sequence")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per run")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per run")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each setting, interleaved (ABCDABCD)")
    ap.add_argument("--print-only", action="store_true", help="print the table of the lines in --out; measure nothing")
    ap.add_argument("--lora-bf16", action="store_true",
                    help="notebook 01's recipe: bf16 LoRA (no 4-bit base) with adamw_torch, instead of QLoRA")
    args = ap.parse_args(argv)
    args.settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown or not args.settings:
        ap.error(f"--settings: unknown {unknown}; choose from {', '.join(SETTINGS)}")
    try:
        args.micro_batches = [int(m) for m in args.micro_batches.split(",")]
    except ValueError:
        ap.error(f"--micro-batches: {args.micro_batches!r} is not a comma-separated list of whole numbers, e.g. 4,1")
    if min(args.micro_batches) < 1 or args.seq < 8 or args.warmup < 0 or args.steps < 1 or args.repeats < 1:
        ap.error("--micro-batches and --seq (>= 8), --steps and --repeats must be positive, --warmup >= 0")
    return args


def provenance(argv: list[str] | None) -> dict:
    """The machine as every shipped run records it, the date (UTC) and the command."""
    from course_utils.results import environment_record

    env = environment_record()
    return dict(device=env["device"], env=env, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                command=" ".join(["scripts/gpu/selective_checkpointing.py", *(sys.argv[1:] if argv is None else argv)]))


def build_once(args):
    """The course's QLoRA build (source chapter recipe: NF4 + double quant, LoRA r=16 on q,k,v,o, paged_adamw_8bit),
    on this device; returns the trainer (its model, packed data and collator are what every setting trains with)."""
    from course_utils.build import build
    from course_utils.recipe import source_chapter_recipe

    precision = "bf16" if args.device == "cuda" else "fp32"
    optimizer = "paged_adamw_8bit" if args.device == "cuda" else "adamw_8bit"  # bitsandbytes pages on CUDA only
    blocks = (args.warmup + args.steps + 1) * max(args.micro_batches)
    recipe = source_chapter_recipe(args.model)
    if args.lora_bf16:
        optimizer = "adamw_torch"
        recipe = recipe.with_(load_in_4bit=False, double_quant=False)
    recipe = recipe.with_(
        micro_batch=max(args.micro_batches), grad_accum=1, max_seq_length=args.seq, precision=precision,
        optimizer=optimizer, steps=max(4, args.warmup + args.steps + 1), warmup_steps=1,
        label="selective checkpointing")
    built = build(recipe)
    if len(built.trainer.train_dataset) < blocks:
        raise SystemExit(f"the packed data holds {len(built.trainer.train_dataset)} blocks of {args.seq} tokens, "
                         f"fewer than the {blocks} these steps need; lower --steps, --warmup or --micro-batches")
    return built


def batches(trainer, micro_batch: int, count: int, device) -> list[dict]:
    """The first `count` micro-batches of the packed data, collated by trl's collator, on the device."""
    rows = trainer.train_dataset
    out = []
    for i in range(count):
        batch = trainer.data_collator([rows[j] for j in range(i * micro_batch, (i + 1) * micro_batch)])
        out.append({k: v.to(device) for k, v in batch.items() if isinstance(v, torch.Tensor)})
    return out


def make_optimizer(params, optimizer: str):
    """The recipe's optimizer as the Trainer makes it for `optim=`: bitsandbytes' paged or unpaged 8-bit AdamW,
    or torch's AdamW."""
    import bitsandbytes as bnb

    kind = {"paged_adamw_8bit": bnb.optim.PagedAdamW8bit, "adamw_8bit": bnb.optim.AdamW8bit,
            "adamw_torch": torch.optim.AdamW}[optimizer]
    return kind(params, lr=2e-4, weight_decay=0.0)


def train_step(model, params, optimizer, batch, autocast: bool) -> float:
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)  # the Trainer's max_grad_norm
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def saved_for_backward(model, batch, autocast: bool, device: str) -> int:
    """Bytes the forward leaves alive for the backward (course_utils.memtrack: every tensor the forward made and
    that is still alive when it returns), for one micro-batch; then the backward, so nothing is left behind."""
    from course_utils.memtrack import MemoryTracker

    tracker = MemoryTracker(device)
    with tracker:
        tracker.phase = "forward"
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = model(**batch).loss
        held = tracker.current["activations"]
        tracker.phase = "after_forward"
        loss.backward()
    model.zero_grad(set_to_none=True)
    return held


def run_one(model, start: dict, setting: str, data: list[dict], args, track: bool = True) -> dict:
    """One run of a setting: the LoRA start restored, a fresh optimizer, warm-up, timed steps, and (`track`) one
    tracked step after them."""
    import gc

    cuda = args.device == "cuda"
    set_checkpointing(model, setting)
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in start:
                p.copy_(start[name])
    torch.manual_seed(0)  # LoRA dropout draws the same masks in every run
    optimizer = make_optimizer(params, args.optimizer)
    losses, seconds = [], None
    for i, batch in enumerate(data[: args.warmup + args.steps]):
        if i == args.warmup:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
        losses.append(train_step(model, params, optimizer, batch, cuda))
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if cuda else None
    held = saved_for_backward(model, data[-1], cuda, args.device) if track else None
    del optimizer
    gc.collect()
    tokens = args.steps * data[0]["input_ids"].numel()
    return dict(losses=[round(float(x), 5) for x in losses], seconds=round(seconds, 4),
                tokens_per_s=round(tokens / seconds, 1), peak_allocated_bytes=peak, saved_for_backward_bytes=held)


def summarize(setting: str, micro_batch: int, runs: list[dict], args, prov: dict) -> dict:
    """One JSON line: the setting's runs and their medians, with provenance."""
    peaks = [r["peak_allocated_bytes"] for r in runs if r["peak_allocated_bytes"] is not None]
    return dict(
        prov, model=args.model, recipe="bf16 LoRA" if args.lora_bf16 else "QLoRA", optimizer=args.optimizer,
        setting=setting, micro_batch=micro_batch, seq=args.seq, warmup=args.warmup,
        steps=args.steps, repeats=len(runs), activation_checkpointing=setting != "none",
        policy=POLICIES[setting].__doc__ if setting in POLICIES else None,
        tokens_per_s=statistics.median(r["tokens_per_s"] for r in runs),
        peak_allocated_bytes=max(peaks) if peaks else None,
        saved_for_backward_bytes=next(r["saved_for_backward_bytes"] for r in runs),  # tracked in the first run
        final_loss=runs[-1]["losses"][-1], runs=runs)


def table(lines: list[dict]) -> str:
    """The measured settings side by side, with the ratios against no checkpointing at the same micro-batch."""
    head = (f"{'setting':<22}{'micro-batch':>12}{'peak alloc GiB':>16}{'saved fwd GiB':>15}{'tokens/s':>10}"
            f"{'vs none':>9}{'final loss':>12}")
    rows = [head, "-" * len(head)]
    for line in lines:
        base = next((x for x in lines if x["setting"] == "none" and x["micro_batch"] == line["micro_batch"]), None)
        ratio = f"{line['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        peak = f"{line['peak_allocated_bytes'] / GiB:.2f}" if line["peak_allocated_bytes"] is not None else "-"
        rows.append(f"{line['setting']:<22}{line['micro_batch']:>12}{peak:>16}"
                    f"{line['saved_for_backward_bytes'] / GiB:>15.3f}{line['tokens_per_s']:>10.0f}{ratio:>9}"
                    f"{line['final_loss']:>12.4f}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.print_only:
        lines = [json.loads(x) for x in Path(args.out).read_text().splitlines() if x.strip()]
        for date in sorted({x["date"] for x in lines}):
            run = [x for x in lines if x["date"] == date]
            print(f"{run[0]['model']}, {run[0].get('recipe', 'QLoRA')}, {run[0]['device']}, {date}: {run[0]['command']}")
            print(table(run))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("selective_checkpointing.py measures on a CUDA GPU; --device cpu --model tiny is a dry run",
              file=sys.stderr)
        return 1
    t = time.perf_counter()
    prov = provenance(argv)
    built = build_once(args)
    args.optimizer = built.recipe.optimizer
    model = built.trainer.model
    model.train()  # checkpointing acts in training mode only
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    print(f"built {args.model} ({built.precision}; {'; '.join(built.notes)}) in {time.perf_counter() - t:.0f} s",
          flush=True)
    device = next(model.parameters()).device
    lines = []
    for mb in args.micro_batches:
        data = batches(built.trainer, mb, args.warmup + args.steps, device)
        runs: dict[str, list[dict]] = {s: [] for s in args.settings}
        for repeat in range(args.repeats):
            for setting in args.settings:
                runs[setting].append(run_one(model, start, setting, data, args, track=repeat == 0))
                r = runs[setting][-1]
                peak = f"{r['peak_allocated_bytes'] / GiB:.2f} GiB" if r["peak_allocated_bytes"] else "-"
                print(f"[{time.perf_counter() - t:.0f} s] mb {mb} {setting} #{repeat + 1}: {peak} peak, "
                      f"{r['tokens_per_s']:.0f} tokens/s, loss {r['losses'][-1]}", flush=True)
        with open(args.out, "a") as f:
            for setting in args.settings:
                line = summarize(setting, mb, runs[setting], args, prov)
                lines.append(line)
                f.write(json.dumps(line) + "\n")
    print()
    what = "bf16 LoRA" if args.lora_bf16 else "QLoRA (NF4)"
    print(f"{args.model}, {what}, LoRA r=16 on q,k,v,o, {args.optimizer}, sequence {args.seq}, {prov['device']}; "
          f"median of {args.repeats} interleaved runs, {args.steps} timed steps after {args.warmup} warm-up")
    print(table(lines))
    print(f"total {time.perf_counter() - t:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
