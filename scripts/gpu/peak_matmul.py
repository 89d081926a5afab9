"""The GPU's measured dense matmul rate, to set beside its datasheet peak (issue 16's compute limit).

    python scripts/gpu/peak_matmul.py --out peak-matmul.jsonl [--size 8192] [--dtype bf16] [--repeats 10]

Times one size x size x size matmul (torch.mm, bf16 by default) on CUDA: a few warm-up runs, then --repeats
timed runs, each between two CUDA events; the median time gives TFLOP/s = 2 x size^3 / time. Appends one JSON
line to --out with the GPU's name and environment (driver, CUDA, library versions, as every shipped run
records it), the date (UTC), the command, every timed run and the median, so a measured rate can ship beside
the datasheet's (course_utils.machine.DATASHEET_PEAK_FLOPS) with its provenance. It measures one matmul shape, not a training step: the rate a step's largest matmuls can
at best run at on this GPU, with this torch and cuBLAS.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # course_utils, from a checkout
DTYPES = ("bf16", "fp16", "fp32", "tf32")


def measure(size: int, dtype: str, repeats: int, warmup: int) -> dict:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    kind = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(size, size, device="cuda", dtype=kind, generator=gen)
    b = torch.randn(size, size, device="cuda", dtype=kind, generator=gen)
    out = torch.empty(size, size, device="cuda", dtype=kind)
    for _ in range(warmup):
        torch.mm(a, b, out=out)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.mm(a, b, out=out)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    median = statistics.median(times)
    return dict(size=size, dtype=dtype, flops=2 * size**3, warmup=warmup, repeats=repeats,
                seconds=[round(t, 7) for t in times], median_s=round(median, 7),
                tflops=round(2 * size**3 / median / 1e12, 1))


def provenance(argv: list[str] | None = None) -> dict:
    """The machine as every shipped run records it (course_utils.results.environment: GPU, driver, CUDA, library
    versions), the GPU's name on its own, the date (UTC) and the command (its arguments: `argv`, else sys.argv's)."""
    from course_utils.results import environment_record

    env = environment_record()
    return dict(device=env["device"], env=env, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                command=" ".join(["scripts/gpu/peak_matmul.py", *(sys.argv[1:] if argv is None else argv)]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON-lines file the measurement is appended to")
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--dtype", default="bf16", choices=DTYPES)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("peak_matmul.py times a CUDA matmul: it needs a GPU", file=sys.stderr)
        return 1
    line = dict(provenance(argv), **measure(args.size, args.dtype, args.repeats, args.warmup))
    with open(args.out, "a") as f:
        f.write(json.dumps(line) + "\n")
    print(f"{line['device']}: {args.size}^3 {args.dtype} matmul, median of {args.repeats}: "
          f"{line['median_s'] * 1e3:.3f} ms, {line['tflops']:,.1f} TFLOP/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
