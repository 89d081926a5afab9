"""Beyond the source recipe on a GPU: the source recipe, each change, the lean and the fast recipe,
measured in one run, printed side by side with ratios against the source recipe of that run.

    python scripts/gpu/beyond_recipe.py --out course_utils/reference/beyond/llama-3.1-8b.jsonl
    python scripts/gpu/beyond_recipe.py --set explore --steps 4 --out explore.jsonl
    python scripts/gpu/beyond_recipe.py --set curves --peers unsloth --out run.jsonl   # Unsloth beside ours
    python scripts/gpu/beyond_recipe.py --set peer --steps 6 --peers unsloth --out run.jsonl  # issue 16's table, one run
    python scripts/gpu/beyond_recipe.py --set fused --peers unsloth --peer-batches 16x1 --out run.jsonl  # issue 31
    COURSE_PROFILE=t4 python scripts/gpu/beyond_recipe.py --set fused-t4 --steps 4 --out t4.jsonl  # fp16, T4 profile
    python scripts/gpu/beyond_recipe.py --set compiled --peers unsloth --out run.jsonl  # issue 31: compile_layers
    python scripts/gpu/beyond_recipe.py --set picks --steps 6 --out picks.jsonl  # planner picks, + fused

Each recipe trains in a fresh process (course_utils.measure) on a random-weight preset built from
its config (no download): warm-up step, one tracked step (peaks by category and CUDA's allocated
and reserved peaks), then timed steps (median tokens/s). With --steps 20 the per-step losses of
the source, lean and fast recipes, which see the same data in the same order, are compared too.
The --out file is a results store: a recipe already in it is not run again. Under the table: every run's
tokens/s against its compute limit and its allocated peak against its memory floor (toward_the_limit.toward_the_limit).

--peers unsloth (an optional extra, never a dependency of the course): after our recipes, Unsloth trains the
same model, data and tokens per step at its two settings, 16x1 and 1x16, through scripts/gpu/peer_unsloth.py, each in
a process of its own with the peer's site directory (--peer-site; scripts/device/peer_wheels.py says how to make it) in
place of ours on PYTHONPATH. Its runs go to --peer-out (peers/<name of --out> beside --out), and the table gets
ratios to the peer at each batching.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[2]

from course_utils.chapter import beyond_the_recipe as beyond  # noqa: E402
from course_utils.chapter import toward_the_limit
from course_utils.common import GiB  # noqa: E402
from course_utils.recipe import Recipe  # noqa: E402


def recipe_set(name: str, model: str, steps: int) -> list[Recipe]:
    """The recipes of a set, the source recipe first."""
    path = beyond.changes(model, steps)
    lean, fast = beyond.lean(model, steps), beyond.fast(model, steps)
    if name == "final":
        return path + [lean, fast]
    if name == "curves":  # the recipes whose loss curves are compared
        return [path[0], lean, fast, beyond.fast_low_memory(model, steps)]
    if name == "peer":  # issue 16's table in one run: ours at the peer's two settings (1x16, 16x1), lean and source
        return [path[0], path[3], lean, fast, beyond.fast_low_memory(model, steps)]
    if name in ("fused", "fused-t4", "compiled", "compiled-t4"):  # issue 31: fused_lora at the peer's two settings;
        # "compiled": the best of "fused" at each setting with and without compile_layers; "-t4": 1 x 16 only, under
        # the T4 profile in fp16
        from course_utils import machine

        src = beyond.source(model, steps)
        if not machine.bf16_supported():
            src = src.with_(precision="fp16", label=src.label)
        p = beyond.path_from(src)
        fused = [r.with_(fused_lora=True, label=r.label + ", fused LoRA") for r in (p[3], p[6])]
        # reentrant checkpointing at 1 x 16 only: the 16 x 1 recipe offloads activations, which it cannot go with
        reentrant = fused[0].with_(reentrant_checkpointing=True, label=fused[0].label + ", reentrant ckpt")
        if name.startswith("compiled"):  # Liger's RoPE breaks a compiled layer: torch.compile fuses RMSNorm & co itself;
            # "compiled" also runs each without Liger and uncompiled: the pair the planner's factor for it needs
            out = []
            for r in [reentrant] + ([] if name.endswith("-t4") else [fused[1]]):
                plain = r.with_(liger_kernels=False, label=r.label.replace("+ Liger kernels", "no Liger").replace(
                    "fast,", "fast, no Liger,"))
                out += [r] + ([] if name.endswith("-t4") else [plain])
                out.append(plain.with_(compile_layers=True, label=plain.label + ", compiled layers"))
            return out
        return [p[3], fused[0], reentrant] + ([] if name == "fused-t4" else [p[6], fused[1]])
    if name == "picks":  # issue 31: the planner's picks for 16 and 8 GiB, + fused LoRA, + reentrant checkpointing
        from course_utils.estimate.planner import plan

        out = []
        for gib in (16, 8):
            pick = plan(model, f"{gib}GiB").pick.recipe.with_(steps=steps, warmup_steps=1, label=f"pick for {gib} GiB")
            fused = pick.with_(fused_lora=True, label=pick.label + ", fused LoRA")
            out += [pick, fused, fused.with_(reentrant_checkpointing=True, label=fused.label + ", reentrant ckpt")]
        return out
    if name == "explore":
        no_upcast = path[1]
        return path + [
            lean.with_(micro_batch=2, grad_accum=8, label="lean 2x8"),
            lean,
            no_upcast.with_(micro_batch=16, grad_accum=1, label="no upcast 16x1"),
            fast,
            fast.with_(micro_batch=4, grad_accum=4, gradient_checkpointing=False, label="fast, 4x4, no ckpt"),
            fast.with_(torch_compile=True, label="fast + torch.compile"),
            lean.with_(torch_compile=True, label="lean + torch.compile"),
        ]
    raise SystemExit(f"unknown set {name!r}")


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--set", default="final", choices=("final", "curves", "peer", "explore", "fused", "fused-t4",
                                                                    "compiled", "compiled-t4", "picks"))
    parser.add_argument("--only", action="append", default=None, metavar="LABEL",
                        help="only the recipe of the set with this label (repeatable)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run (1 warm-up, 1 tracked)")
    parser.add_argument("--out", required=True, help="results file (JSON lines); resumable")
    parser.add_argument("--timeout", type=float, default=None, help="stop a run that takes longer (s)")
    parser.add_argument("--print-only", action="store_true", help="print the table of --out; measure nothing")
    parser.add_argument("--peers", action="append", default=[], choices=toward_the_limit.PEERS,
                        help="after our recipes, measure this stack too, at 16x1 and 1x16 (an optional extra)")
    parser.add_argument("--peer-site", default="/tmp/unsl-site", help="the peer's own site directory")
    parser.add_argument("--peer-batches", default=",".join(f"{m}x{g}" for m, g in toward_the_limit.PEER_BATCHES),
                        help="the peer's settings to run, e.g. 1x16 (default: all of them)")
    parser.add_argument("--peer-out", default=None,
                        help="the peers' results file (default: peers/<--out's name> beside --out, which is where "
                             "course_utils/reference/beyond/ keeps them: apart from our runs)")
    parser.add_argument("--run-id", default=None, help="the measurement run (default: beyond-<UTC date and time>)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    args.peer_out = Path(args.peer_out) if args.peer_out else out.parent / "peers" / out.name
    return args


def selected(args) -> list[Recipe]:
    """The set's recipes, or those of them that --only names (an unknown label is an error that lists them)."""
    recipes = recipe_set(args.set, args.model, args.steps)
    if not args.only:
        return recipes
    unknown = sorted(set(args.only) - {r.label for r in recipes})
    if unknown:
        raise SystemExit(f"no recipe labelled {unknown} in set {args.set}; its labels: {[r.label for r in recipes]}")
    return [r for r in recipes if r.label in args.only]


def measure_ours(recipes: list[Recipe], store, timeout: float | None) -> list:
    """Each recipe in a fresh process (course_utils.measure), in order; a failed run is reported and skipped."""
    from course_utils.measure import measure_all

    def said(results) -> None:
        o, at = results[-1], f"[{len(results)}/{len(recipes)}] {results[-1].label}"
        if o.measurement is None:
            print(f"{at}: FAILED {o.skipped.removeprefix('failed: ')[-1500:]}", flush=True)
            return
        m = o.measurement
        alloc = (m.cuda_max_allocated or 0) / GiB
        print(f"{at}: {m.status}, {alloc:.2f} GiB allocated, {m.tokens_per_s or 0:.0f} tokens/s, {o.seconds:.0f} s  "
              f"{m.notes}", flush=True)

    return measure_all(recipes, store=store, progress=False, isolate=True, timeout_s=timeout, keep_going=True,
                       after_each=said).measured


def peer_command(name: str, args, model_dir: Path, micro_batch: int, grad_accum: int) -> list[str]:
    """The peer script's command line for one of its settings."""
    return [sys.executable, str(ROOT / "scripts" / "gpu" / f"peer_{name}.py"), "--model", args.model, "--model-dir",
            str(model_dir), "--micro-batch", str(micro_batch), "--grad-accum", str(grad_accum),
            "--steps", str(args.steps), "--out", str(args.peer_out)]


def peer_env(site: str) -> dict:
    """The peer's environment: its site directory first, then this checkout, and not our site directory."""
    from course_utils.child import LAUNCHED_ENV, _command

    return dict(os.environ, PYTHONPATH=os.pathsep.join([site, str(ROOT)]), PYTHONUNBUFFERED="1",
                HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", COURSE_COMMAND=_command(),
                **{LAUNCHED_ENV: repr(time.time())})


def run_peer(name: str, args, model_dir: Path) -> None:
    """The peer at each of its settings, each in its own process; what went wrong is printed, not raised."""
    if not Path(args.peer_site).is_dir():
        print(f"{name}: no site directory at {args.peer_site}; install the peer's wheels there first "
              "(scripts/device/peer_wheels.py says how). Not measured.", flush=True)
        return
    wanted = set(args.peer_batches.split(","))
    for mb, ga in [b for b in toward_the_limit.PEER_BATCHES if f"{b[0]}x{b[1]}" in wanted]:
        t = time.perf_counter()
        label = f"{name} ({mb}x{ga})"
        try:
            proc = subprocess.run(peer_command(name, args, model_dir, mb, ga), env=peer_env(args.peer_site),
                                  capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"[peer] {label}: stopped after {args.timeout} s", flush=True)
            continue
        out = (proc.stdout + proc.stderr).strip()
        if proc.returncode not in (0, 3):  # 3: it ran out of memory, which is a result
            print(f"[peer] {label}: FAILED (exit code {proc.returncode}) {out[-2500:]}", flush=True)
            continue
        last = proc.stdout.strip().splitlines()[-1:] or [""]
        print(f"[peer] {last[0]}  ({time.perf_counter() - t:.0f} s)", flush=True)


def peer_runs(args, run_id: str | None) -> list:
    """The peers' latest runs at their settings in --peer-out (of this run, when measuring)."""
    from course_utils.results import ResultStore

    stored = ResultStore(args.peer_out).load()
    return [m for name in args.peers or toward_the_limit.PEERS
            for m in toward_the_limit.latest_peer_runs(stored, name, args.model, args.steps, run_id)]


def stored_runs(store, recipes: list[Recipe]) -> list:
    """The latest stored run of each recipe, labelled as the set labels it."""
    from course_utils.measure import _as_asked

    stored = {m.recipe_key: m for m in store.load()}
    return [_as_asked(stored[r.key], r) for r in recipes if r.key in stored]


def report(args, done: list, peers: list) -> None:
    """The side-by-side table, the issue's targets, the peer's targets and how the loss curves agree."""
    print()
    print(f"{args.model}, sequence 512, 16 x 512 tokens per optimizer step; ratios against the source recipe "
          "measured in this run" + (" and against the peer at the same batching" if peers else ""))
    print(beyond.format_rows(beyond.rows(done, peers=peers)))
    print()
    print(toward_the_limit.toward_the_limit(done + peers))
    src = next((m for m in done if m.label.startswith("source")), None)
    lean = next((m for m in done if m.label.startswith("lean recipe")), None)
    fast = next((m for m in done if m.label.startswith("fast recipe")), None)
    print()
    for target, value, ok in beyond.target_checks(src, lean, fast):
        print(f"  {'MET ' if ok else 'MISSED'}  {target:<36}{value}")
    for line in toward_the_limit.peer_check_lines(done, peers):
        print(f"  {line}")
    table = beyond.loss_table(done + peers)
    if table.rows:
        print()
        print(table)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from course_utils.results import ResultStore

    store = ResultStore(args.out)
    recipes = selected(args)
    if args.print_only:
        report(args, stored_runs(store, recipes), peer_runs(args, None))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("beyond_recipe.py measures on a CUDA GPU; --print-only shows a stored run", file=sys.stderr)
        return 1
    from course_utils.child import RUN_ID_ENV
    from course_utils.models import preset_path

    os.environ[RUN_ID_ENV] = args.run_id or os.environ.get(RUN_ID_ENV) or time.strftime("beyond-%Y%m%d-%H%M",
                                                                                         time.gmtime())
    t = time.perf_counter()
    model_dir = preset_path(args.model)
    print("random-weight checkpoint:", model_dir, f"({time.perf_counter() - t:.0f} s)", flush=True)
    done = measure_ours(recipes, store, args.timeout)
    for name in args.peers:
        run_peer(name, args, model_dir)
    report(args, done, peer_runs(args, os.environ[RUN_ID_ENV]) if args.peers else [])
    return 0


if __name__ == "__main__":
    sys.exit(main())
