"""Count before changing (issue 31): per micro-batch, the kernel launches, host-device waits, allocator calls and the
host's time per decoder layer of a 1 x 16 QLoRA step, for our recipe and for the peer, with tokens/s from the same
processes. One JSON line per run, and a table.

    python scripts/gpu/count_launches.py --out counts.jsonl [--variants ours,ours-lean,unsloth] [--rounds 2] [--steps 5]
        [--tables DIR] [--peer-site /tmp/unsl-site] [--run-id NAME]
    python scripts/gpu/count_launches.py --model tiny --steps 4 --variants ours,ours-lean --out c.jsonl  # CPU smoke test

Variants, each trained in a fresh process, interleaved over --rounds (A B C, then B A ..., as try_step_changes.py):
- "ours": notebook 09's "+ Liger kernels" recipe at 1 x 16, the one the peer table shows at 1 x 16 (course_utils.beyond
  path_from(source())[3]: QLoRA NF4 + double quant, LoRA r16 on q/k/v/o, bf16, checkpointing, paged 8-bit AdamW, no
  fp32 upcast, embeddings on CPU, Liger), built by course_utils.build as every measurement is;
- "ours-lean": the same with Recipe(lean_host=True) (course_utils/lean_trainer.py);
- "ours-fused": the same with Recipe(fused_lora=True) (course_utils/fused_lora.py), "ours-fused-lean" with both;
- "ours-fused-reentrant": fused LoRA with Recipe(reentrant_checkpointing=True): each layer's first forward builds no
  autograd graph (torch's reentrant checkpointing, as Unsloth's own checkpoint function does); "-ops" after it (run
  counts-20261207-dequant only; its switch is gone since): fused LoRA's dequantize through bitsandbytes' ops, as before
  its direct calls; "-norm": with
  torch's F.rms_norm in place of every RMSNorm (torch_rms_norm, a change tried; patched when training begins: in run
  counts-20261207-dequant it was patched after build() and Trainer.train() put Liger's back, so those processes ran
  as "ours-fused-reentrant" and their lines say so); "-rope" (after "-norm" or in its place): transformers' RoPE
  function compiled (compiled_rope, a change tried: one generated kernel each way for q and k, in place of Liger's
  Triton call, patched when training begins);
- "unsloth": Unsloth 2026.10.9 at 1 x 16 as scripts/gpu/peer_unsloth.py trains it (its own site directory, --peer-site,
  first on PYTHONPATH; the random-weight folder models.preset_path built); "unsloth-16x1" the same at 16 x 1;
- at 16 x 1 (one micro-batch a step: the profiled window is the last step, its optimizer step inside): "fast-fused",
  the peer table's 16 x 1 recipe ("fast, embeddings + activations on CPU (16x1)", trl's activation offloader) with
  fused LoRA; "fast-fused-pinned" with layer_offload.py's offloader in place of trl's (each layer's input only, into
  pinned buffers allocated once; installed when training begins); "fast-fused-reentrant-pinned" that with reentrant
  checkpointing too (as Unsloth's offloaded checkpoint; trl's offloader cannot go with it);
- "ours-fused-compiled", "ours-fused-reentrant-compiled": fused LoRA (+ reentrant) with each decoder layer compiled
  (compiled_layers) and Liger off (its RoPE breaks the graph): transformers' RMSNorm, SwiGLU and RoPE for Inductor to
  fuse, when training begins. The checkpoint is then inside the compiled layer, and with reentrant checkpointing
  nothing was recomputed (run counts-20261207-compiled: 19.1 GiB, README.md); "-compiled-inside" compiles the layer's
  forward inside its checkpoint instead (Recipe(compile_layers=True), course_utils/compiled_layers.py);
  "-graphs" after it compiles with mode="reduce-overhead" (CUDA graphs), "-noguards" skips Dynamo's guard checks
  once the first step has compiled (torch.compiler.set_stance(skip_guard_eval_unsafe=True): the run-5 probe spent
  0.5 ms of host in each compiled call's cache lookup);
- "-latescale" (run counts-20261207-inside16 only; its switch is gone since): fused LoRA's backward scaling as before
  2026-12-07 evening (a multiply over each (tokens, in_features) input gradient, 128 a micro-batch), against today's,
  on the (tokens, r) gradient.
On a CPU (--model tiny) "ours" is notebook 09's CPU recipe of the same rung without Liger (a smoke test of this code).

In each process: step 0 warms up (not counted); steps 1 .. steps-2 are timed as course_utils.probe times them
(synchronized at each step's end; tokens/s of the median step), with a forward pre/post hook on every decoder layer
that adds up the host's time inside the layer's forward (and, separately, inside its recomputation in the backward
pass under checkpointing); the last step is profiled: torch.profiler (CPU and CUDA activity, record_shapes) over
--window micro-batches from the 5th micro-batch of the step on, from the start of one micro-batch's training_step to the
start of the next one's, so the training loop's own work between micro-batches (transformers' isnan check) is inside
and the optimizer step is not. From that window, per micro-batch:
- kernels: device kernel events (CUPTI), and launch calls: cudaLaunchKernel*/cuLaunchKernel* runtime and driver calls;
- waits (the host stops until the GPU is done): cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize,
  synchronous cudaMemcpy; d2h: device-to-host copies (each .item() is one); item: aten::_local_scalar_dense calls;
  and where the waits come from (the chain of ops around each one);
- allocator: cudaMalloc, cudaFree, cudaHostAlloc / cudaMallocHost / cudaFreeHost (the caching allocator's misses);
- aten_ops: operator calls the dispatcher saw (the host's work, one by one).
Host time: micro_batch_ms is the timed steps' median wall time over grad_accum (the optimizer step shared out);
per layer: that over the decoder layers, and the hooks' time in each layer's forward per micro-batch (the recomputation
under checkpointing is not timed where it stops early, torch's default for non-reentrant checkpointing: the layer's
forward hook never fires there; where it does fire, it is recompute_host_ms_per_layer). waits_ms: the host's time
blocked in the waits, per micro-batch, under the profiler.
The profiler slows the host, so the profiled window is for counting only; times come from the timed steps.
Memory: allocated_gib is the whole process's allocated peak; allocated_after_warmup_gib the peak after step 0 (which
compiles, where a variant compiles), on lines from 2026-12-07 evening on.
`--print-only --out FILE` prints the table of a file of these lines again, with each variant's tokens/s by process.

Run on the H200 on 2026-12-03 (scripts/gpu/logs/counts-20261203/README.md), with fused LoRA on an H100 on
2026-12-07 (scripts/gpu/logs/fused-20261207/README.md) and with reentrant checkpointing, repeated, the same day
(scripts/gpu/logs/repeats-20261207/README.md), lines shipped in
course_utils/reference/beyond/tries/counts-llama-3.1-8b.jsonl. Checked on a CPU with --model tiny (2026-12-03, torch
2.13): the same counts of reads per micro-batch as tests/test_lean_trainer.py's (8 for ours, 1 with lean_host).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the peer's child puts its own site directory first on PYTHONPATH, ROOT after it
    sys.path.append(str(ROOT))

VARIANTS = ("ours", "ours-lean", "ours-fused", "ours-fused-lean", "ours-fused-reentrant",
            "ours-fused-reentrant-norm", "ours-fused-reentrant-rope", "ours-fused-reentrant-norm-rope", "unsloth",
            "fast-fused", "fast-fused-pinned", "fast-fused-reentrant-pinned", "unsloth-16x1",
            "ours-fused-reentrant-compiled", "ours-fused-compiled", "ours-fused-reentrant-compiled-inside",
            "ours-fused-compiled-inside", "fast-fused-compiled-inside", "ours-fused-reentrant-compiled-inside-graphs",
            "ours-fused-reentrant-compiled-inside-noguards")
START_MICRO = 4  # the profiled window starts at this micro-batch of the last step (well away from the optimizer)
LAUNCH = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cuLaunchKernel",
          "cuLaunchKernelEx", "cudaGraphLaunch")
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cuStreamSynchronize",
         "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2")
ALLOCATOR = ("cudaMalloc", "cudaFree", "cudaMallocHost", "cudaHostAlloc", "cudaFreeHost", "cudaMallocAsync",
             "cudaFreeAsync", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemHostAlloc", "cuMemFreeHost")
WINDOW_END = "count_launches.window_end"
STEP_MARK = "count_launches.training_step"


# --- what is counted ---------------------------------------------------------------------------------------------
def is_device(event) -> bool:
    """A kernel, copy or memset on the GPU (CUPTI's activity), not a host-side call."""
    return str(getattr(event, "device_type", "")).endswith(("CUDA", "PrivateUse1"))


def classify(events, micro_batches: int) -> dict:
    """Per-micro-batch counts from a profiler's events (FunctionEvents), those before the WINDOW_END mark only."""
    events = [e for e in events if not (is_device(e) and (getattr(e, "is_user_annotation", False)
                                                          or e.name in (STEP_MARK, WINDOW_END)))]  # marks, GPU side
    ends = [e.time_range.start for e in events if e.name == WINDOW_END]
    end = min(ends) if ends else float("inf")
    # host events: those before the closing synchronize; device events: all (the window opened on an idle GPU,
    # and what the window launched may still run when the host reaches its end)
    kept = [e for e in events if is_device(e) or (e.time_range.start < end and e.name != WINDOW_END)]
    names = Counter(e.name for e in kept if not is_device(e))
    device = [e for e in kept if is_device(e)]
    copies = [e for e in device if e.name.startswith("Memcpy")]
    memsets = [e for e in device if e.name.startswith("Memset")]
    kernels = [e for e in device if not e.name.startswith(("Memcpy", "Memset"))]
    per = lambda n: round(n / micro_batches, 2)  # noqa: E731
    waits = {n: names[n] for n in WAITS if names[n]}
    allocator = {n: names[n] for n in ALLOCATOR if names[n]}
    launches = {n: names[n] for n in LAUNCH if names[n]}
    steps = [(e.time_range.start, e.time_range.end) for e in kept if e.name == STEP_MARK and not is_device(e)]
    sites: Counter = Counter()
    for e in kept:  # where each wait and each read of a tensor's value comes from
        if e.name in WAITS or e.name == "aten::_local_scalar_dense":
            inside = any(a <= e.time_range.start < b for a, b in steps)  # any thread: backward runs on its own
            sites[f"{e.name} <- {site(e)}" + ("" if inside else "  [outside training_step]")] += 1
    return dict(
        kernels=per(len(kernels)), launch_calls=per(sum(launches.values())),
        launches_by_call={k: per(v) for k, v in launches.items()},
        memcpy=per(len(copies)), d2h=per(sum(1 for e in copies if "DtoH" in e.name)), memset=per(len(memsets)),
        waits=per(sum(waits.values())), waits_by_call={k: per(v) for k, v in waits.items()},
        waits_ms=round(sum(e.time_range.end - e.time_range.start for e in kept if e.name in WAITS) / 1000
                       / micro_batches, 2),
        item=per(names["aten::_local_scalar_dense"]), is_nonzero=per(names["aten::is_nonzero"]),
        allocator=per(sum(allocator.values())), allocator_by_call={k: per(v) for k, v in allocator.items()},
        aten_ops=per(sum(c for n, c in names.items() if n.startswith("aten::"))),
        wait_sites={k: per(v) for k, v in sites.most_common(16)},
        device_ms=round(sum(e.time_range.end - e.time_range.start for e in device) / 1000 / micro_batches, 2),
        device_events=len(device), host_events=sum(names.values()),
    )


def site(event) -> str:
    """Where an event was called from: the innermost Python frames outside torch (with_stack), else its op chain."""
    stack = getattr(event, "stack", None) or []
    p = event
    while not stack and getattr(p, "cpu_parent", None) is not None:  # a runtime call has no stack: its op's
        p = p.cpu_parent
        stack = getattr(p, "stack", None) or []
    frames = [f for f in stack if "/torch/" not in f and "count_launches" not in f][:3]
    chain, p = [], getattr(event, "cpu_parent", None)
    while p is not None and len(chain) < 5:
        if p.name != STEP_MARK:
            chain.append(p.name)
        p = getattr(p, "cpu_parent", None)
    return " | ".join(frames) if frames else (" < ".join(chain) or "(top level)")


# --- the counter: a TrainerCallback plus a wrapper of trainer.training_step -----------------------------------------
class Counter_:
    """Times steps 1 .. steps-2, adds up the decoder layers' host time in them, and profiles `window` micro-batches
    of the last step. Framework-neutral: works on any transformers Trainer (ours and Unsloth's)."""

    def __init__(self, trainer, steps: int, grad_accum: int, window: int, tokens_per_step: int, cuda: bool,
                 with_stack: bool = False):
        self.trainer, self.steps, self.grad_accum, self.window = trainer, steps, grad_accum, window
        self.with_stack = with_stack
        self.tokens_per_step, self.cuda = tokens_per_step, cuda
        self.step_s: list[float] = []
        self.micro = 0  # training_step calls so far
        self.start_micro = (steps - 1) * grad_accum + min(START_MICRO, max(0, grad_accum - window - 1))
        self.prof = None
        self.result: dict | None = None
        self.window_s = None
        self.timing_layers = False
        self.fwd: list[float] = []
        self.recompute: list[float] = []
        self._t0: dict[int, float] = {}
        self.layers = [m for m in trainer.model.modules() if type(m).__name__.endswith("DecoderLayer")]
        for layer in self.layers:
            layer.register_forward_pre_hook(self._pre)
            layer.register_forward_hook(self._post)
        original = trainer.training_step

        def training_step(*args, **kwargs):
            self._before_micro()
            self.micro += 1
            import torch

            with torch.profiler.record_function(STEP_MARK) if self.prof is not None else _null():
                return original(*args, **kwargs)

        trainer.training_step = training_step

    # layer hooks: host time inside each decoder layer's forward (and its recomputation in the backward pass)
    def _pre(self, module, args):
        if self.timing_layers:
            self._t0[id(module)] = time.perf_counter()

    def _post(self, module, args, output):
        if self.timing_layers and id(module) in self._t0:
            import torch

            took = time.perf_counter() - self._t0.pop(id(module))
            in_backward = getattr(torch._C, "_current_graph_task_id", lambda: -1)() != -1
            (self.recompute if in_backward else self.fwd).append(took)

    def _sync(self):
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def _before_micro(self):
        if self.micro == self.start_micro:
            self._open()
        elif self.prof is not None and self.micro == self.start_micro + self.window:
            self._close(self.window)

    def _open(self, stack: bool | None = None):
        from torch.profiler import ProfilerActivity, profile

        self._sync()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.stack = self.with_stack if stack is None else stack
        self.prof = profile(activities=acts, record_shapes=True, with_stack=self.stack)
        self.prof.__enter__()
        self._w0 = time.perf_counter()

    def _close(self, micro_batches: int):
        import torch

        with torch.profiler.record_function(WINDOW_END):
            self._sync()
        self.window_s = time.perf_counter() - self._w0
        self.prof.__exit__(None, None, None)
        t = time.perf_counter()
        self.result = classify(self.prof.events(), micro_batches)
        self.result["window_micro_batches"] = micro_batches
        self.result["profiled_ms_per_micro_batch"] = round(self.window_s * 1000 / micro_batches, 1)
        shapes = self.prof.key_averages(group_by_input_shape=True)
        self.tables = (self.prof.key_averages().table(sort_by="count", row_limit=70, max_name_column_width=70),
                       shapes.table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60),
                       # where the GPU's time goes (at 16 x 1 the step is bound by it): kernels and ops by shape
                       shapes.table(sort_by="self_device_time_total", row_limit=40, max_name_column_width=60))
        self.result["analysis_s"] = round(time.perf_counter() - t, 1)
        self.result["python_stacks"] = self.stack
        self.prof = None

    def callback(self):
        from transformers import TrainerCallback

        counter = self

        class Timer(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                counter._sync()
                counter._s0 = time.perf_counter()
                counter.timing_layers = 1 <= state.global_step <= counter.steps - 2
                if state.global_step == counter.steps - 1 and counter.micro == 0:  # training_step is not ours to wrap
                    counter._open(stack=False)  # a whole step: lighter, no Python stacks
                    counter.whole_step = True

            def on_step_end(self, args, state, control, **kw):
                counter._sync()
                if state.global_step == 1 and counter.cuda:  # the warm-up's peak (compiling, where a variant does)
                    import torch

                    counter.warmup_bytes = torch.cuda.max_memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                if 2 <= state.global_step <= counter.steps - 1:  # global_step counts the step just done
                    counter.step_s.append(time.perf_counter() - counter._s0)
                counter.timing_layers = False
                if counter.prof is not None and state.global_step == counter.steps:
                    counter._close(counter.grad_accum if getattr(counter, "whole_step", False) else
                                   counter.micro - counter.start_micro)

        return Timer()

    def summary(self) -> dict:
        rates = [self.tokens_per_step / s for s in self.step_s]
        n_layers = max(1, len(self.layers))
        micro = self.grad_accum * len(self.step_s)
        step = statistics.median(self.step_s) if self.step_s else None
        out = dict(tokens_per_s=round(statistics.median(rates), 1) if rates else None,
                   step_rates=[round(r, 1) for r in rates],
                   spread=round((max(rates) - min(rates)) / statistics.median(rates), 3) if len(rates) > 1 else None,
                   micro_batch_ms=round(step * 1000 / self.grad_accum, 1) if step else None,
                   layers=len(self.layers))
        if step:
            out["micro_batch_ms_per_layer"] = round(out["micro_batch_ms"] / n_layers, 2)
        if micro and self.fwd:
            out["fwd_host_ms_per_layer"] = round(sum(self.fwd) * 1000 / (micro * n_layers), 3)
            out["fwd_calls_per_micro_batch"] = round(len(self.fwd) / micro, 1)
        if micro and self.recompute:
            out["recompute_host_ms_per_layer"] = round(sum(self.recompute) * 1000 / (micro * n_layers), 3)
            out["recompute_calls_per_micro_batch"] = round(len(self.recompute) / micro, 1)
        return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# --- the children ---------------------------------------------------------------------------------------------------
def ours_recipe(variant: str, model: str, steps: int):
    from course_utils.chapter import beyond_the_recipe as beyond
    from course_utils.machine import device_type

    if variant.startswith("fast"):  # 16 x 1: "fast, embeddings + activations on CPU (16x1)", the peer table's
        recipe = beyond.path_from(beyond.source(model, steps))[6]
        if device_type() != "cuda":  # activation offloading is CUDA only: the same without it (a smoke test)
            recipe = beyond.path_here(model)[6].with_(offload_activations=False, liger_kernels=False, label="fast (CPU)")
    elif device_type() == "cuda":
        recipe = beyond.path_from(beyond.source(model, steps))[3]  # "+ Liger kernels" (1x16)
    else:  # notebook 09's CPU rung, Liger off (CUDA only): a smoke test of this script
        recipe = beyond.path_here(model)[3].with_(liger_kernels=False, steps=steps, label="+ Liger kernels (CPU: off)")
    recipe = recipe.with_(steps=steps, warmup_steps=1, label=recipe.label)
    if variant.startswith(("ours-fused", "fast-fused")):
        recipe = recipe.with_(fused_lora=True, label=recipe.label + ", fused LoRA")
    if variant.endswith("-pinned"):  # trl's offloader off: layer_offload.py's goes in when training begins
        recipe = recipe.with_(offload_activations=False, label=recipe.label + ", layer inputs to pinned buffers")
    if "-reentrant" in variant:
        recipe = recipe.with_(reentrant_checkpointing=True, label=recipe.label + ", reentrant ckpt")
    if "-compiled" in variant:  # Liger's RoPE breaks a compiled graph (README.md): transformers' layers
        inside = "-compiled-inside" in variant  # Recipe(compile_layers=True), compiled_layers.py
        recipe = recipe.with_(liger_kernels=False, compile_layers=inside, label=recipe.label.replace(
            "+ Liger kernels", "no Liger") + (", layers compiled inside ckpt" if inside else ", layers compiled"))
    if variant.endswith("-lean"):
        recipe = recipe.with_(lean_host=True, label=recipe.label + ", lean host")
    return recipe


def child_ours(variant: str, args) -> dict:
    import torch

    from course_utils.build import build
    from course_utils.results import environment_record

    recipe = ours_recipe(variant, args.model, args.steps)
    holder: dict = {}

    from transformers import TrainerCallback

    class Forward(TrainerCallback):
        def on_train_begin(self, *a, **k):  # after Trainer.train() applied Liger's kernels, which would undo a patch
            if "-norm" in variant:
                notes.append(torch_rms_norm(built.model))
            if variant.endswith("-rope"):
                notes.append(compiled_rope())
            if variant.endswith("-compiled"):
                notes.append(compiled_layers(built))
            if variant.endswith("-compiled-inside-graphs"):  # before the recipe's own callback, which then leaves them
                notes.append(compiled_inside(built, "reduce-overhead"))
            if variant.endswith("-pinned"):
                import layer_offload

                notes.append(layer_offload.install(built.trainer))

        def on_step_begin(self, *a, **k):
            return holder["cb"].on_step_begin(*a, **k)

        def on_step_end(self, args, state, *a, **k):
            if variant.endswith("-noguards") and state.global_step == 1:  # step 0 (global_step 1) compiled both graphs
                torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
                notes.append("Dynamo's guards skipped from step 1 on (skip_guard_eval_unsafe)")
            return holder["cb"].on_step_end(args, state, *a, **k)

    built = build(recipe, callbacks=(Forward(),))
    notes = list(built.notes)
    counter = Counter_(built.trainer, recipe.steps, recipe.grad_accum, args.window, recipe.tokens_per_step,
                       torch.cuda.is_available(), args.stack)
    holder["cb"] = counter.callback()
    torch.cuda.reset_peak_memory_stats() if torch.cuda.is_available() else None
    built.trainer.train()
    losses = [round(r["loss"], 4) for r in built.trainer.state.log_history if "loss" in r]
    if "-compiled" in variant:  # what torch.compile made of the layers: one graph, no break, expected
        from try_step_changes import compile_counts

        notes.append(f"torch.compile: {json.dumps(compile_counts())}")
    offload = built.trainer.maybe_activation_offload_context
    if hasattr(offload, "allocated"):  # layer_offload.py's: what it moved, and how many buffers it ever made
        notes.append(f"{offload.offloaded} layer inputs moved over {recipe.steps * recipe.grad_accum} micro-batches, "
                     f"{offload.allocated} pinned buffers made")
    return dict(label=recipe.label, recipe=recipe.to_dict(), recipe_key=recipe.key, notes=notes,
                env=environment_record(), losses=losses, counter=counter)


def torch_rms_norm(model) -> str:
    """A change tried, not a Recipe knob (yet): every RMSNorm module (Liger's, or transformers' where Liger is off)
    runs torch's own fused `F.rms_norm` (one operator forward, one backward; scripts/gpu/host_costs.py: 369 -> 142 us
    of host time per forward and backward on an H100 in one run, 724 -> 173 in another; its result within one bf16
    step of transformers', and losses within 0.001 in training, run counts-20261207-norm)."""
    import torch

    n = 0
    for module in model.modules():
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        if type(module).__name__.endswith("RMSNorm") and eps is not None and module.weight is not None:
            module.forward = (lambda m, e: lambda x: torch.nn.functional.rms_norm(x, m.weight.shape, m.weight, e))(module, eps)
            n += 1
    return f"torch's F.rms_norm in {n} RMSNorm modules (count_launches.py's -norm variant)"


def compiled_layers(built) -> str:
    """Each decoder layer under torch.compile (try_step_changes.compile_layers: one graph the layers share), with
    Dynamo told to let transformers' output-capturing context variable, which the layer sets inside the checkpoint,
    go unreplayed in the recomputation (torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint; without
    it the checkpoint breaks the graph and nothing compiles, on a CPU with and without fused LoRA). Fused LoRA's
    dequantize goes through bitsandbytes' ops while compiling (torch.library ops Dynamo can trace; its ctypes calls
    are not). On a CPU (tiny model, 2026-12-07): one graph, no graph break, no recompile, the same losses, with
    non-reentrant and reentrant checkpointing. Per-layer compile is the issue's last change."""
    import torch
    from try_step_changes import compile_layers

    torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    compile_layers(built)
    return "each decoder layer compiled (count_launches.py's -compiled variants)"


def compiled_inside(built, mode: str) -> str:
    """Recipe(compile_layers=True)'s compile (course_utils.compiled_layers: each decoder layer's forward compiled inside
    its checkpoint) with torch.compile's `mode`, in place of the recipe's own, which finds the layers done."""
    from course_utils.compiled_layers import compile_inside_checkpoint

    n = compile_inside_checkpoint(built.trainer.model, mode=mode)
    return f"each decoder layer's forward compiled inside its checkpoint ({n} layers, {mode})"


def compiled_rope() -> str:
    """A change tried, not a Recipe knob (yet): Llama's apply_rotary_pos_emb (Liger's, once Trainer.train() put it
    there) replaced by transformers' own function compiled (torch.compile, static shapes, one graph): q and k rotated
    by one generated kernel in the forward and one in the backward. Host time per forward and backward on an H100
    (scripts/gpu/host_costs.py, two runs on 2026-12-07): Liger's RoPE 381 and 696 us, transformers' 501 and 662."""
    import torch
    from transformers.models.llama import modeling_llama

    def rope(q, k, cos, sin, unsqueeze_dim=1):  # transformers 5.24's apply_rotary_pos_emb and rotate_half, as written
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        half = q.shape[-1] // 2
        q_rot = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        k_rot = torch.cat((-k[..., half:], k[..., :half]), dim=-1)
        return q * cos + q_rot * sin, k * cos + k_rot * sin

    modeling_llama.apply_rotary_pos_emb = torch.compile(rope, dynamic=False, fullgraph=True)
    return "transformers' RoPE compiled in place of Liger's (count_launches.py's -rope variant)"


def child_unsloth(variant: str, args) -> dict:
    sys.path.insert(0, str(ROOT / "scripts" / "device"))
    import peer_unsloth as P

    P.setup_environment()
    version = P.peer_version()
    import unsloth  # noqa: F401  (first: it patches transformers, trl and peft)
    import datasets
    import torch
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    model_dir = Path(args.model_dir) if args.model_dir else P.default_model_dir(args.model)
    micro, accum = (16, 1) if variant == "unsloth-16x1" else (1, 16)
    recipe = P.peer_recipe(args.model, micro, accum, args.steps, version)
    rows = P.training_rows(AutoTokenizer.from_pretrained(model_dir), recipe)
    model, tokenizer = P.load_unsloth(model_dir, recipe)
    from transformers import TrainerCallback

    holder: dict = {}

    class Forward(TrainerCallback):
        def on_step_begin(self, *a, **k):
            return holder["cb"].on_step_begin(*a, **k)

        def on_step_end(self, *a, **k):
            return holder["cb"].on_step_end(*a, **k)

    with tempfile.TemporaryDirectory(prefix="count-unsloth-") as out_dir:
        trainer = SFTTrainer(model=model, args=SFTConfig(**P.sft_kwargs(recipe, out_dir, True)),
                             train_dataset=datasets.Dataset.from_dict({"input_ids": rows}), processing_class=tokenizer,
                             callbacks=[Forward()])
        trainer.remove_callback(PrinterCallback)
        counter = Counter_(trainer, recipe.steps, recipe.grad_accum, args.window, recipe.tokens_per_step, True,
                           args.stack)
        holder["cb"] = counter.callback()
        torch.cuda.reset_peak_memory_stats()
        trainer.train()
    losses = [round(r["loss"], 4) for r in trainer.state.log_history if "loss" in r]
    import dataclasses

    notes = P.run_notes(model, trainer) + [f"trainer class {type(trainer).__name__}; "
                                           f"logging_nan_inf_filter={getattr(trainer.args, 'logging_nan_inf_filter', '?')}"]
    return dict(label=recipe.label, recipe=recipe.to_dict(), recipe_key=recipe.key, notes=notes,
                env=dataclasses.asdict(P.peer_environment()), losses=losses, counter=counter)


def child(variant: str, args) -> None:
    t0 = time.perf_counter()
    got = child_unsloth(variant, args) if variant.startswith("unsloth") else child_ours(variant, args)  # it first
    import torch

    counter = got.pop("counter")
    cuda = torch.cuda.is_available()
    line = dict(run=args.run_id, variant=variant, status="ok", **{k: got[k] for k in ("label", "losses")},
                timing=counter.summary(), counts=counter.result,
                allocated_gib=round(max(torch.cuda.max_memory_allocated(), getattr(counter, "warmup_bytes", 0)) / 2**30,
                                    2) if cuda else None,  # the whole run's peak, as before
                allocated_after_warmup_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
                wall_s=round(time.perf_counter() - t0, 1), notes=got["notes"], recipe=got["recipe"],
                recipe_key=got["recipe_key"], env=got["env"],
                date=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                command="count_launches.py " + " ".join(sys.argv[1:]))
    if args.tables and getattr(counter, "tables", None):
        Path(args.tables).mkdir(parents=True, exist_ok=True)
        with open(Path(args.tables) / f"{args.run_id}-tables.txt", "a") as f:
            f.write(f"\n=== {variant} ({got['label']}), {counter.result['window_micro_batches']} micro-batches, "
                    f"by count ===\n{counter.tables[0]}\n=== {variant}: by self CPU time, grouped by input shape ===\n"
                    f"{counter.tables[1]}\n=== {variant}: by self GPU time, grouped by input shape ===\n"
                    f"{counter.tables[2]}\n")
    print("RESULT " + json.dumps(line), flush=True)


# --- the parent -----------------------------------------------------------------------------------------------------
def child_env(variant: str, args) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    if variant.startswith("unsloth"):  # the peer's site directory first, this checkout after it, not our site directory
        env["PYTHONPATH"] = os.pathsep.join([args.peer_site, str(ROOT)])
        env["HF_DATASETS_OFFLINE"] = "1"
    return env


def row(d: dict) -> str:
    c, t = d.get("counts") or {}, d.get("timing") or {}
    return (f"{d['variant']:10} {d.get('status', '?'):7} {c.get('kernels', '-')!s:>8} {c.get('launch_calls', '-')!s:>8} "
            f"{c.get('waits', '-')!s:>6} {c.get('d2h', '-')!s:>5} {c.get('item', '-')!s:>5} {c.get('allocator', '-')!s:>6} "
            f"{c.get('aten_ops', '-')!s:>8} {t.get('micro_batch_ms', '-')!s:>8} {t.get('micro_batch_ms_per_layer', '-')!s:>7} "
            f"{t.get('fwd_host_ms_per_layer', '-')!s:>7} {t.get('recompute_host_ms_per_layer', '-')!s:>7} "
            f"{t.get('tokens_per_s', '-')!s:>8} {t.get('spread', '-')!s:>6} {d.get('allocated_gib', '-')!s:>6}")


HEADER = (f"{'variant':10} {'status':7} {'kernels':>8} {'launch':>8} {'waits':>6} {'d2h':>5} {'item':>5} {'alloc':>6} "
          f"{'aten ops':>8} {'ms/mb':>8} {'ms/lyr':>7} {'fwd/lyr':>7} {'rec/lyr':>7} {'tok/s':>8} {'spread':>6} {'GiB':>6}")


def print_table(path: str, run_id: str | None = None) -> None:
    """The runs in `path` (JSON lines of this script) as the table it prints while measuring, then per variant: the
    processes' tokens/s (each the median of its timed steps), their median, and the range over every timed step."""
    runs = [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]
    runs = [d for d in runs if run_id is None or d.get("run") == run_id]
    print(HEADER)
    for d in runs:
        print(row(d))
    print()
    for name in dict.fromkeys(d["variant"] for d in runs):
        ok = [d for d in runs if d["variant"] == name and d.get("status") == "ok"]
        per = [d["timing"]["tokens_per_s"] for d in ok if d["timing"].get("tokens_per_s")]
        steps = [r for d in ok for r in d["timing"].get("step_rates", [])]
        if per:
            print(f"{name:10} tokens/s by process {per}, median {statistics.median(per):,.0f}; "
                  f"timed steps {min(steps):,.0f} to {max(steps):,.0f} ({len(steps)} steps)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON lines, one per run (appended)")
    ap.add_argument("--variants", default="ours,ours-lean,unsloth")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the variants, interleaved (A B C, B C A, ...)")
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps: 1 warm-up, steps-2 timed, 1 profiled")
    ap.add_argument("--window", type=int, default=2, help="micro-batches profiled")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--model-dir", default=None, help="the peer's random-weight folder (default: models.preset_path's)")
    ap.add_argument("--peer-site", default="/tmp/unsl-site")
    ap.add_argument("--tables", default=None, help="folder for the profiler's tables (one text file per run id)")
    ap.add_argument("--timeout", type=float, default=400)
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--print-only", action="store_true", help="measure nothing: the table of the runs in --out "
                    "(of --run-id where given), each run, then each variant's tokens/s over its runs")
    ap.add_argument("--child", choices=VARIANTS)
    ap.add_argument("--stack", action="store_true", help="child: Python stacks in the profile (the parent asks for "
                    "them at each variant's first run only: they slow the analysis)")
    args = ap.parse_args(argv)
    args.run_id_given = args.run_id is not None
    args.run_id = args.run_id or time.strftime("counts-%Y%m%d-%H%M", time.gmtime())
    if args.steps < 4:
        ap.error("--steps must be at least 4: 1 warm-up, 2 or more timed, 1 profiled")
    if args.child:
        child(args.child, args)
        return 0
    if args.print_only:
        print_table(args.out, args.run_id if args.run_id_given else None)
        return 0
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"no variant {unknown}; there are: {list(VARIANTS)}")
    from course_utils.models import preset_path
    from course_utils.results import environment_record

    if args.model != "tiny":
        t = time.perf_counter()
        print("random-weight checkpoint:", preset_path(args.model), f"({time.perf_counter() - t:.0f} s)", flush=True)
    order = [names[(i + r) % len(names)] for r in range(max(1, args.rounds)) for i in range(len(names))]
    print(HEADER, flush=True)
    seen: set = set()
    for name in order:
        if name.startswith("unsloth") and not Path(args.peer_site).is_dir():
            print(f"unsloth: no site directory at {args.peer_site} (scripts/device/peer_wheels.py); skipped", flush=True)
            continue
        first = name not in seen
        seen.add(name)
        cmd = [sys.executable, __file__, "--child", name, *(["--stack"] if first else []), *(argv or sys.argv[1:])]
        failed = dict(run=args.run_id, variant=name, env=environment_record(), command=" ".join(cmd[1:]),
                      date=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()))
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=child_env(name, args))
            lines = [ln[7:] for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
            line = lines[-1] if lines else json.dumps(dict(failed, status="failed",
                                                          error=(done.stdout + done.stderr)[-2500:]))
        except subprocess.TimeoutExpired as exc:
            line = json.dumps(dict(failed, status="timeout", error=f"over {args.timeout} s: "
                                   f"{((exc.stdout or b'') + (exc.stderr or b''))[-1500:]!r}"))
        with open(args.out, "a") as f:
            f.write(line + "\n")
        d = json.loads(line)
        print(row(d) + (f"  {d.get('error', '')[-1200:]}" if d.get("status") != "ok" else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
