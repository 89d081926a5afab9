"""scripts/gpu/count_launches.py's counting, on a made-up profile (no GPU): what is a kernel, a launch, a wait, an
allocator call, which events fall in the window, and where the waits come from."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "gpu"))
import count_launches as C  # noqa: E402


def ev(name, start, end=None, device=False, parent=None, annotation=False):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end if end is not None else start + 1),
                           device_type=DeviceType.CUDA if device else DeviceType.CPU, cpu_parent=parent, stack=[],
                           is_user_annotation=annotation)


def test_classify_counts_per_micro_batch_inside_the_window():
    step = ev(C.STEP_MARK, 0, 100, annotation=True)
    item = ev("aten::item", 10, parent=step)
    dense = ev("aten::_local_scalar_dense", 10, parent=item)
    sync = ev("cudaStreamSynchronize", 11, parent=dense)
    loop_sync = ev("cudaStreamSynchronize", 150)  # between micro-batches: the training loop's
    events = [
        step, item, dense, sync, loop_sync,
        ev(C.STEP_MARK, 0, 100, device=True, annotation=True),  # the mark on the GPU's timeline: not a kernel
        ev("cudaLaunchKernel", 1, parent=step), ev("cudaLaunchKernel", 2, parent=step), ev("cuLaunchKernelEx", 3),
        ev("cudaMalloc", 4), ev("cudaFree", 5), ev("cudaMemcpyAsync", 10),
        ev("ampere_bf16_gemm", 5, device=True), ev("triton_rms_norm", 6, device=True),
        ev("cutlass_80_tensorop_gemm", 7, device=True),
        ev("Memcpy DtoH (Device -> Pageable)", 11, device=True), ev("Memset (Device)", 12, device=True),
        ev("aten::mm", 3), ev("aten::add", 4),
        ev(C.WINDOW_END, 200, annotation=True), ev("cudaDeviceSynchronize", 201),  # the closing sync: not counted
        ev("late_kernel", 300, device=True),  # launched in the window, ran after the host reached its end: counted
    ]
    c = C.classify(events, micro_batches=2)
    assert c["kernels"] == 4 / 2  # gemm, rms_norm, cutlass, late_kernel
    assert c["launch_calls"] == 3 / 2 and c["launches_by_call"] == {"cudaLaunchKernel": 1.0, "cuLaunchKernelEx": 0.5}
    assert c["waits"] == 2 / 2 and c["waits_by_call"] == {"cudaStreamSynchronize": 1.0}
    assert c["d2h"] == 0.5 and c["memcpy"] == 0.5 and c["memset"] == 0.5
    assert c["allocator"] == 1.0 and c["allocator_by_call"] == {"cudaMalloc": 0.5, "cudaFree": 0.5}
    assert c["item"] == 0.5 and c["aten_ops"] == 4 / 2
    sites = c["wait_sites"]
    assert any(k.startswith("cudaStreamSynchronize <- aten::_local_scalar_dense < aten::item")
               and "outside" not in k for k in sites), sites
    assert any(k.startswith("cudaStreamSynchronize <- (top level)") and k.endswith("[outside training_step]")
               for k in sites), sites


def test_an_unknown_variant_is_named(capsys):
    import pytest

    with pytest.raises(SystemExit):
        C.main(["--out", "x.jsonl", "--variants", "ours,theirs"])
    assert "no variant ['theirs']" in capsys.readouterr().err


def test_the_shipped_counts_carry_their_provenance_and_show_what_lean_host_and_fused_lora_removed():
    import json
    import statistics

    from course_utils.recipe import Recipe

    path = Path(__file__).resolve().parents[1] / "course_utils/reference/beyond/tries/counts-llama-3.1-8b.jsonl"
    runs = [json.loads(line) for line in path.read_text().splitlines()]
    assert {d["variant"] for d in runs if d["run"] == "counts-20261203"} == {"ours", "ours-lean", "unsloth"}
    for d in runs:
        assert d["status"] == "ok" and d["run"] and d["date"] and d["command"].startswith("count_launches.py --child")
        env = d["env"]
        assert env["device"] in ("NVIDIA H200", "NVIDIA H100 80GB HBM3")
        assert env["driver"] and env["cuda"] and env["versions"]["torch"]
        if d["variant"] != "unsloth":
            assert Recipe.from_dict(d["recipe"]).key == d["recipe_key"]
            assert Recipe.from_dict(d["recipe"]).lean_host == d["variant"].endswith("-lean")
            assert Recipe.from_dict(d["recipe"]).fused_lora == d["variant"].startswith(("ours-fused", "fast-fused"))
            assert Recipe.from_dict(d["recipe"]).reentrant_checkpointing == ("-reentrant" in d["variant"])
            assert Recipe.from_dict(d["recipe"]).compile_layers == ("-compiled-inside" in d["variant"])
    by = {d["variant"]: d for d in runs if d["run"] == "counts-20261203"}
    ours, lean = by["ours"]["counts"], by["ours-lean"]["counts"]
    assert lean["waits"] < ours["waits"] and lean["item"] < ours["item"]
    assert abs(lean["kernels"] - ours["kernels"]) <= 10  # the same work on the GPU
    assert by["ours"]["losses"] == by["ours-lean"]["losses"]  # the same training
    fused = {d["variant"]: d for d in runs if d["run"] == "counts-20261207-fused"}
    assert set(fused) == {"ours", "ours-fused", "unsloth"}
    ours, mine = fused["ours"]["counts"], fused["ours-fused"]["counts"]
    assert mine["aten_ops"] < 0.75 * ours["aten_ops"] and mine["kernels"] <= ours["kernels"]  # fewer operators
    assert max(abs(a - b) for a, b in zip(fused["ours"]["losses"], fused["ours-fused"]["losses"])) < 0.05
    # reentrant checkpointing (2026-12-07, three runs, nothing else on the GPU): the same training as fused LoRA, and
    # faster than it in every run where both ran, each process of it against the median of fused LoRA's
    for run in ("counts-20261207-repeats", "counts-20261207-reentrant"):
        mine = [d for d in runs if d["run"] == run]
        fused = [d for d in mine if d["variant"] == "ours-fused"]
        reentrant = [d for d in mine if d["variant"] == "ours-fused-reentrant"]
        assert len(fused) >= 2 and len(reentrant) >= 2 and not any(d.get("beside") for d in mine)
        assert all(d["losses"] == fused[0]["losses"] for d in reentrant)
        median = statistics.median(d["timing"]["tokens_per_s"] for d in fused)
        assert min(d["timing"]["tokens_per_s"] for d in reentrant) > median
    # fused LoRA's dequantize through bitsandbytes' ctypes library (counts-20261207-dequant): the same kernels and
    # training as through its ops ("-ops"), fewer operators, every process faster than the ops' median
    mine = [d for d in runs if d["run"] == "counts-20261207-dequant"]
    ops = [d for d in mine if d["variant"] == "ours-fused-reentrant-ops"]
    direct = [d for d in mine if d.get("ran_as", d["variant"]) == "ours-fused-reentrant"]  # the "-norm" patch undone
    assert all(d["counts"]["aten_ops"] == direct[0]["counts"]["aten_ops"] for d in direct)
    assert len(ops) == 2 and len(direct) == 4 and all(d["losses"] == ops[0]["losses"] for d in mine if d["variant"] != "unsloth")
    assert direct[0]["counts"]["kernels"] == ops[0]["counts"]["kernels"]
    assert direct[0]["counts"]["aten_ops"] < ops[0]["counts"]["aten_ops"]
    median = statistics.median(d["timing"]["tokens_per_s"] for d in ops)
    assert min(d["timing"]["tokens_per_s"] for d in direct) > median


def test_the_host_table_sets_each_variant_beside_ours_of_its_own_run():
    """host_work.host_table (notebook 09): per count run, each variant's median over its processes, its range, and its
    ratio to ours of that run; the counts are the first process's."""
    import json
    import statistics

    from course_utils.chapter import host_work as tries

    path = Path(__file__).resolve().parents[1] / "course_utils/reference/beyond/tries/counts-llama-3.1-8b.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert tries.count_runs() == list(dict.fromkeys(d["run"] for d in lines))
    for run in tries.count_runs():
        counts = tries.host_counts(run)
        assert list(counts) == [v for v in tries.HOST_VARIANTS if v in counts]
        for variant, h in counts.items():
            mine = [d for d in lines if d["run"] == run and d.get("ran_as", d["variant"]) == variant and d["status"] == "ok"]
            speeds = [d["timing"]["tokens_per_s"] for d in mine]
            assert h.processes == len(mine) and h.tokens_per_s == statistics.median(speeds)
            assert (h.tokens_per_s_low, h.tokens_per_s_high) == (min(speeds), max(speeds))
            assert h.aten_ops == mine[0]["counts"]["aten_ops"] and h.allocated_gib == mine[0]["allocated_gib"]
        text = str(tries.host_table(run))
        assert run in text and next(iter(counts.values())).env["device"] in text
        names = tuple(h.name for h in counts.values())
        ratios = [line.split()[-2] for line in text.splitlines() if line.startswith(names)]
        assert ratios[:1] == (["1.00"] if "ours" in counts else ["-"])
    assert tries.host_counts().keys() >= {"ours"}  # run=None: the latest run with ours in it
    with pytest.raises(KeyError, match="no finished count run 'counts-nope'"):
        tries.host_counts("counts-nope")


def test_host_costs_runs_on_a_cpu_and_says_what_it_left_out(tmp_path, capsys):
    """scripts/gpu/host_costs.py (issue 31's next candidates, timed on a GPU): on a CPU the transformers and torch
    cases run, F.rms_norm computes transformers' RMSNorm, and the CUDA-only cases say they are left out."""
    import json

    import host_costs

    out = tmp_path / "costs.jsonl"
    assert host_costs.main(["--calls", "2", "--rounds", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "dequantize: left out" in text
    assert float(text.split("largest difference ")[1].split()[0]) < 1e-5
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [d["case"] for d in lines] == ["rmsnorm transformers", "rmsnorm torch F.rms_norm", "rope transformers"]
    assert all(d["host_us"] > 0 and d["gpu_us"] is None and d["device"] == "CPU" for d in lines)


def test_the_changes_table_shows_every_change_a_count_run_measured_before_and_with_it():
    """host_work.changes_table (notebook 09, README): each change of CHANGES from the one run that measured it, without
    it, with it and Unsloth where that run had it; every variant a shipped count run measured beside the variant
    it changes is one of CHANGES (a new change shipped without a row fails here)."""
    import json
    import statistics

    from course_utils.chapter import host_work

    path = Path(__file__).resolve().parents[1] / "course_utils/reference/beyond/tries/counts-llama-3.1-8b.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]

    def median(run, variant):
        return statistics.median(d["timing"]["tokens_per_s"] for d in lines
                                 if d["run"] == run and d.get("ran_as", d["variant"]) == variant and d["status"] == "ok")

    found = host_work.changes()
    assert [c.change for c in found] == [c[0] for c in host_work.CHANGES]
    text = str(host_work.changes_table())
    for c, (_, run, before, after) in zip(found, host_work.CHANGES):
        assert c.speedup == median(run, after) / median(run, before)
        assert (c.unsloth is None) == (not any(d["run"] == run and d["variant"].startswith("unsloth") for d in lines))
        assert f"{c.speedup:.2f}" in text and run.removeprefix("counts-") in text
    measured = {d.get("ran_as", d["variant"]) for d in lines} - {"unsloth", "unsloth-16x1"}
    assert measured <= {c[2] for c in host_work.CHANGES} | {c[3] for c in host_work.CHANGES}
    assert len(text.splitlines()[0]) <= 100 and "1 x 16" in text


def _tiny_llama_checkpointed(reentrant: bool):
    """A 3-layer Llama of random weights (seed 0), training, checkpointed, and a batch of token ids."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                      num_key_value_heads=1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).train()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    if reentrant:
        model.enable_input_require_grads()
    return model, torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_layer_offload_moves_each_layer_input_into_buffers_made_once_and_trains_the_same(reentrant):
    """scripts/gpu/layer_offload.py (count_launches.py's -pinned variants, issue 31): under checkpointing it takes each
    decoder layer's input and nothing else, the pool of buffers stops growing after the first micro-batch, and the
    gradients are those of training without it, to the bit (on a CPU its copies are CPU copies)."""
    import torch
    import layer_offload

    def train(offload: bool):
        model, ids = _tiny_llama_checkpointed(reentrant)
        ctx = layer_offload.LayerInputOffload(model, model.config.hidden_size) if offload else None
        grads = []
        for _ in range(3):
            model.zero_grad()
            with ctx or torch.enable_grad():
                model(input_ids=ids, labels=ids).loss.backward()
            grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        return grads, ctx

    plain, _ = train(False)
    moved, ctx = train(True)
    assert ctx.offloaded == 3 * 3 and ctx.allocated == 3 and not ctx.entries
    assert all(torch.equal(a, b) for x, y in zip(plain, moved) for a, b in zip(x, y))
    with pytest.raises(ValueError, match="no module named \\*DecoderLayer"):
        layer_offload.LayerInputOffload(torch.nn.Linear(2, 2), 2)
