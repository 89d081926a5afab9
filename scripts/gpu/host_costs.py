"""What one call costs the host (issue 31): the pieces of a decoder layer that remain after fused LoRA and reentrant
checkpointing (scripts/gpu/logs/repeats-20261207/README.md), each against what could replace it, in one process.

    python scripts/gpu/host_costs.py [--calls 200] [--rounds 3] [--out host-costs.jsonl]   # on a GPU
    python scripts/gpu/host_costs.py --calls 5 --rounds 1                                   # on a CPU: a smoke test

Cases, at the shapes of Llama-3.1-8B at micro-batch 1 x 512 tokens in bf16 (fp32 on a CPU):
- RMSNorm, forward and backward: transformers' LlamaRMSNorm (several ops), Liger's Triton kernel (what
  `Recipe(liger_kernels=True)` runs), torch's own `F.rms_norm` (one fused operator on CUDA);
- RoPE on q and k, forward and backward: transformers' `apply_rotary_pos_emb`, Liger's `liger_rotary_pos_emb`;
- the NF4 dequantize of one 4,096 x 4,096 weight with double quantization: bitsandbytes' two ops (fused LoRA's
  dequantize before 2026-12-07), the same two kernels through bitsandbytes' ctypes library as fused LoRA now calls
  them (`course_utils.fused_lora._dequantize_cuda`), and into buffers allocated once, as Unsloth's `fast_dequantize`
  does (CUDA only; each checked equal to the ops' result).
Each case runs `--calls` calls with no synchronization inside (the host's time per call while the GPU keeps up:
these kernels take microseconds), then synchronizes; the GPU's time per call from CUDA events over the same calls.
Cases interleave over `--rounds` (A B C, A B C, ...); the median of the rounds is printed. A case whose package is
missing or that needs CUDA is left out, and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, TOKENS = 4096, 32, 8, 128, 512


def norm_cases(device, dtype) -> dict:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x = torch.randn(1, TOKENS, HIDDEN, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    hf = LlamaRMSNorm(HIDDEN, eps=1e-5).to(device, dtype)
    cases = {"rmsnorm transformers": lambda: hf(x).backward(grad),
             "rmsnorm torch F.rms_norm": lambda: torch.nn.functional.rms_norm(x, (HIDDEN,), hf.weight, 1e-5).backward(grad)}
    if device == "cuda":
        try:
            from liger_kernel.transformers.rms_norm import LigerRMSNorm
        except ImportError:
            print("rmsnorm liger: left out (no liger_kernel)")
        else:
            liger = LigerRMSNorm(HIDDEN, eps=1e-5, in_place=False).to(device, dtype)
            cases["rmsnorm liger"] = lambda: liger(x).backward(grad)
    want = hf(x)
    got = torch.nn.functional.rms_norm(x, (HIDDEN,), hf.weight, 1e-5)
    print(f"F.rms_norm against transformers' RMSNorm: largest difference {(got - want).abs().max().item():.1e}")
    return cases


def rope_cases(device, dtype) -> dict:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q = torch.randn(1, HEADS, TOKENS, HEAD_DIM, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(1, KV_HEADS, TOKENS, HEAD_DIM, device=device, dtype=dtype, requires_grad=True)
    angles = torch.arange(TOKENS, device=device, dtype=torch.float32)[:, None] / 10_000 ** (
        torch.arange(0, HEAD_DIM, 2, device=device, dtype=torch.float32) / HEAD_DIM)
    cos, sin = (f(torch.cat([angles, angles], -1))[None].to(dtype) for f in (torch.cos, torch.sin))
    gq, gk = torch.randn_like(q), torch.randn_like(k)

    def run(fn):
        qo, ko = fn(q, k, cos, sin)
        torch.autograd.backward((qo, ko), (gq, gk))

    cases = {"rope transformers": lambda: run(apply_rotary_pos_emb)}
    if device == "cuda":
        try:
            from liger_kernel.transformers.rope import liger_rotary_pos_emb
        except ImportError:
            print("rope liger: left out (no liger_kernel)")
        else:
            cases["rope liger"] = lambda: run(liger_rotary_pos_emb)
    return cases


def dequant_cases(device, dtype) -> dict:
    if device != "cuda":
        print("dequantize: left out (bitsandbytes' CUDA kernels)")
        return {}
    import ctypes

    import bitsandbytes as bnb
    from bitsandbytes.cextension import lib

    from course_utils.fused_lora import _dequantize_cuda, _dequantize_ops

    layer = bnb.nn.Linear4bit(HIDDEN, HIDDEN, bias=False, compute_dtype=dtype, quant_type="nf4",
                              compress_statistics=True).to(device)
    weight, state = layer.weight, layer.weight.quant_state
    absmax = torch.empty(state.absmax.numel(), device=device, dtype=torch.float32)  # allocated once
    out = torch.empty(state.shape, device=device, dtype=dtype)
    nf4 = {torch.bfloat16: lib.cdequantize_blockwise_bf16_nf4, torch.float16: lib.cdequantize_blockwise_fp16_nf4,
           torch.float32: lib.cdequantize_blockwise_fp32_nf4}[dtype]
    inner = state.state2

    def direct():
        stream = ctypes.c_void_p(torch._C._cuda_getCurrentRawStream(weight.device.index))
        lib.cdequantize_blockwise_fp32(inner.code.data_ptr(), state.absmax.data_ptr(), inner.absmax.data_ptr(),
                                       absmax.data_ptr(), inner.blocksize, absmax.numel(), stream)
        absmax.add_(state.offset)
        nf4(None, weight.data.data_ptr(), absmax.data_ptr(), out.data_ptr(), state.blocksize, out.numel(), stream)
        return out

    ops = _dequantize_ops(weight, state, dtype)
    same = torch.equal(direct().clone(), ops) and torch.equal(_dequantize_cuda(weight, state, dtype), ops)
    print(f"dequantize through ctypes (into reused buffers, and fused_lora's) equals bitsandbytes' ops: {same}")
    for other in (torch.float16, torch.float32):  # fused_lora's direct path is used in each dtype that passed
        for nested in (True, False):
            w = bnb.nn.Linear4bit(HIDDEN, HIDDEN, bias=False, compute_dtype=other, quant_type="nf4",
                                  compress_statistics=nested).to(device).weight
            equal = torch.equal(_dequantize_cuda(w, w.quant_state, other), _dequantize_ops(w, w.quant_state, other))
            print(f"fused_lora's direct dequantize equals the ops' in {other}, double quant {nested}: {equal}")
    return {"dequantize bitsandbytes ops": lambda: _dequantize_ops(weight, state, dtype),
            "dequantize ctypes (fused_lora)": lambda: _dequantize_cuda(weight, state, dtype),
            "dequantize ctypes, reused buffers": direct}


def time_case(fn, calls: int, cuda: bool) -> dict:
    for _ in range(3):
        fn()
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t0
    if cuda:
        end.record()
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {"host_us": host / calls * 1e6, "wall_us": wall / calls * 1e6,
            "gpu_us": start.elapsed_time(end) / calls * 1e3 if cuda else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="append one JSON line per case")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    cases = {**norm_cases(device, dtype), **rope_cases(device, dtype), **dequant_cases(device, dtype)}
    results: dict[str, list[dict]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            results[name].append(time_case(fn, args.calls, cuda))
    where = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"\nper call, median of {args.rounds} interleaved rounds of {args.calls} calls, {where}, torch {torch.__version__}")
    print(f"{'case':<36}{'host us':>10}{'GPU us':>10}{'wall us':>10}")
    lines = []
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) if runs[0][k] is not None else None for k in runs[0]}
        gpu = f"{med['gpu_us']:10.1f}" if med["gpu_us"] is not None else f"{'-':>10}"
        print(f"{name:<36}{med['host_us']:10.1f}{gpu}{med['wall_us']:10.1f}")
        lines.append({"case": name, **med, "rounds": runs, "device": where, "torch": torch.__version__,
                      "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "command": "host_costs.py " + " ".join(sys.argv[1:] if argv is None else argv)})
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
