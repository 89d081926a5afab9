"""What this machine can do: device, memory, bf16 support, library versions, an environment report."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
from dataclasses import dataclass

GiB = 1024**3
MiB = 1024**2
STACK = ("torch", "transformers", "peft", "trl", "bitsandbytes", "datasets", "accelerate")


class HardwareError(RuntimeError):
    """The recipe asks for something this machine cannot do; the message says what to use instead."""


def device_type() -> str:
    """'cuda' when a CUDA GPU is visible, else 'cpu'."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_name() -> str:
    """A readable name of the compute device, e.g. 'NVIDIA H200' or 'CPU (2 cores, x86_64)'."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU ({os.cpu_count()} cores, {platform.machine()})"


def compute_capability() -> tuple[int, int] | None:
    """CUDA compute capability of GPU 0, or None on CPU."""
    import torch

    return torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None


def cpu_has_bf16() -> bool:
    """True when the CPU has native bf16 instructions (AVX512-BF16 or AMX); without them bf16 is 6-10x slower."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return platform.machine() == "arm64"  # Apple silicon has bf16
    return "avx512_bf16" in flags or "amx_bf16" in flags


def bf16_supported() -> bool:
    """Native bf16 on this device. On CUDA it needs compute capability 8.0 or more (Ampere and later).

    `torch.cuda.is_bf16_supported()` also says True on a T4 (7.5), through emulation: slow, so we
    look at the compute capability instead.
    """
    cc = compute_capability()
    if cc is not None:
        return cc >= (8, 0)
    return cpu_has_bf16()


def resolve_precision(precision: str) -> str:
    """Turn 'auto' into what the hardware does best; check a forced choice is possible."""
    dev = device_type()
    if precision == "auto":
        if dev == "cuda":
            return "bf16" if bf16_supported() else "fp16"
        return "fp32"  # mixed precision on CPU saves little and, without bf16 instructions, is slow
    if precision == "bf16" and not bf16_supported():
        where = f"this GPU ({device_name()}, compute capability {compute_capability()})" if dev == "cuda" else "this CPU"
        raise HardwareError(
            f"precision='bf16' was requested, but {where} has no native bf16 "
            "(it needs an NVIDIA GPU of compute capability 8.0+, or a CPU with AVX512-BF16/AMX). "
            "Use precision='auto' (fp16 on a T4, fp32 on CPU) or precision='fp32'."
        )
    if precision == "fp16" and dev != "cuda":
        raise HardwareError(
            "precision='fp16' mixed precision needs a CUDA GPU (its loss scaler is CUDA-only here). "
            "Use precision='auto' or 'fp32' on CPU."
        )
    return precision


def bitsandbytes_status() -> tuple[bool, str]:
    """(usable, reason): whether bitsandbytes imports and has a backend for this device."""
    try:
        import bitsandbytes as bnb  # noqa: F401
    except Exception as exc:  # ImportError, or a CUDA setup error raised at import
        return False, f"bitsandbytes does not import here ({type(exc).__name__}: {exc})"
    return True, f"bitsandbytes {md.version('bitsandbytes')} on {device_type()}"


def versions() -> dict[str, str]:
    """Installed versions of the training stack (and Python)."""
    out = {"python": platform.python_version()}
    for name in STACK:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "missing"
    for name in OPTIONAL_STACK:  # recorded where installed only, so that other machines' keys do not change
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


OPTIONAL_STACK = ("liger-kernel",)  # notebook 08's Liger kernels (CUDA only)


def total_memory_bytes() -> int:
    """Memory of the compute device: GPU memory on CUDA, physical RAM on CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class Environment:
    """Where a measurement ran: enough to say whether two results are comparable."""

    device: str
    device_type: str
    total_memory_gib: float
    bf16: bool
    compute_capability: str | None
    cuda: str | None
    driver: str | None
    versions: dict

    @property
    def key(self) -> str:
        """Results measured with the same key are comparable (device and library versions)."""
        import hashlib
        import json

        blob = json.dumps([self.device, self.versions], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def environment() -> Environment:
    """Read the current environment."""
    import torch

    cc = compute_capability()
    driver = None
    if torch.cuda.is_available():
        try:
            import subprocess

            driver = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10,
            ).stdout.strip().splitlines()[0]
        except Exception:
            driver = None
    from . import MEASUREMENT_METHOD, __version__
    from .models import tiny_fingerprint

    course = {"course_utils": __version__, "measurement_method": str(MEASUREMENT_METHOD), "tiny_model": tiny_fingerprint()}
    return Environment(
        device=device_name(),
        device_type=device_type(),
        total_memory_gib=round(total_memory_bytes() / GiB, 2),
        bf16=bf16_supported(),
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        cuda=torch.version.cuda,
        driver=driver,
        versions={**versions(), **course},
    )


def env_report() -> tuple[str, bool]:
    """The `course env` text, with [OK]/[FAIL] lines for what the chapter needs, and overall OK."""
    env = environment()
    lines = [
        f"device:        {env.device}",
        f"memory:        {env.total_memory_gib:.1f} GiB",
        f"bf16 (native): {env.bf16}" + (f"  (compute capability {env.compute_capability})" if env.compute_capability else ""),
        f"precision=auto resolves to: {resolve_precision('auto')}",
    ]
    if env.cuda:
        lines.append(f"CUDA:          {env.cuda}, driver {env.driver}")
    lines.append("versions:      " + ", ".join(f"{k} {v}" for k, v in env.versions.items()))
    checks = []
    ok_all = True

    def check(ok: bool, text: str, required: bool = True) -> None:
        nonlocal ok_all
        checks.append(f"[{'OK' if ok else ('FAIL' if required else 'WARN')}] {text}")
        ok_all &= ok or not required

    for name in STACK:
        check(env.versions[name] != "missing", f"{name} installed ({env.versions[name]})")
    major = env.versions["transformers"].split(".")[0]
    check(major == "5", f"transformers 5.x (found {env.versions['transformers']})")
    check(env.versions["trl"].split(".")[0] == "1", f"trl 1.x (found {env.versions['trl']})")
    usable, why = bitsandbytes_status()
    check(usable, f"4-bit and 8-bit through bitsandbytes: {why}")
    check(env.bf16, "native bf16" + ("" if env.bf16 else " (not here: fp16 on GPU, fp32 on CPU)"), required=False)
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    check(True, "hub access: " + ("off (HF_HUB_OFFLINE set; the embedded default is used)" if offline else "allowed"))
    return "\n".join(lines + [""] + checks), ok_all
