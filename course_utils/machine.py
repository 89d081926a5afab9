"""What this machine can do: device, memory, bf16 support, device profiles, library versions, an environment
report. Which stored results are comparable is course_utils.provenance's."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys
from dataclasses import dataclass, field

from course_utils.common import GiB, MiB  # noqa: F401  (hardware.GiB, hardware.MiB)
from course_utils.common import GiB, Hardware  # noqa: F401  (machine.Hardware: the devices below)

def rank_info() -> tuple[int, int, int]:
    """(rank, world size, local rank) from the variables torchrun sets; (0, 1, 0) in a plain process."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0)))

STACK = ("torch", "transformers", "peft", "trl", "bitsandbytes", "datasets", "accelerate")


class HardwareError(RuntimeError):
    """The recipe asks for something this machine (or the device an estimate assumes) cannot do, or names no known
    device; the message says what to use instead."""


def device_type() -> str:
    """'cuda' when a CUDA GPU is visible, else 'cpu'."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_name() -> str:
    """A readable name of the compute device, e.g. 'NVIDIA H200', 'T4 profile on NVIDIA H200' or
    'CPU (2 cores, x86_64)'. Under a profile the name says so, so its results are never mixed with the
    GPU's own in the store."""
    import torch

    if torch.cuda.is_available():
        real = torch.cuda.get_device_name(0)
        prof = active_profile()
        return f"{prof.label} on {real}" if prof else real
    return f"CPU ({os.cpu_count()} cores, {platform.machine()})"


def compute_capability() -> tuple[int, int] | None:
    """CUDA compute capability of GPU 0 as the course sees it (a profile's, under one), or None on CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    prof = active_profile()
    return prof.compute_capability if prof else torch.cuda.get_device_capability(0)


# ---------------------------------------------------------------------------------------------
# device profiles: a bigger GPU made to behave, for this course, like a learner's card
# ---------------------------------------------------------------------------------------------
PROFILE_ENV = "COURSE_PROFILE"


@dataclass(frozen=True)
class Profile:
    """A learner's GPU, as far as a bigger GPU can stand in for it: what the course decides from it
    (precision, attention kernels) and how much memory the whole card has. It changes the course's
    view of the hardware, never torch's: torch, Triton and the CUDA kernels still see the real GPU."""

    name: str
    label: str  # how results measured under it are named: "T4 profile"
    gpu: str
    compute_capability: tuple[int, int]
    card_bytes: int  # what the card offers to every process on it together
    flash_attention: bool
    cannot_emulate: str
    # Room kept free for what CUDA adds outside the allocator after the cap is set: kernels loaded
    # lazily on first use, library workspaces of new streams. Without it notebook 06's T4 check
    # (2026-12-01) held 14.84 GiB of the card's T4_CARD_GIB at its peak.
    headroom_bytes: int = 256 * 2**20
    peak_flops: dict | None = field(default=None, compare=False)  # datasheet FLOP/s per precision ("fp16", "fp32")


T4_PEAK_FLOPS = {"fp16": 65e12, "fp32": 8.1e12}  # NVIDIA T4 datasheet: fp16 on its tensor cores, fp32 without
# NVIDIA H200 (SXM, what torch names "NVIDIA H200"; the H200 NVL is slower) datasheet: BF16 and FP16 Tensor Core
# 1,979 TFLOP/s "with sparsity" (2:4 structured), so 989 dense: the rate a dense bf16 matmul can at best reach.
H200_PEAK_FLOPS = {"bf16": 989e12, "fp16": 989e12}
# NVIDIA H100 SXM5 (what torch names "NVIDIA H100 80GB HBM3"; the H100 PCIe and NVL are slower) datasheet: the same
# 1,979 TFLOP/s "with sparsity" in BF16 and FP16 as the H200, so 989 dense
H100_SXM_PEAK_FLOPS = {"bf16": 989e12, "fp16": 989e12}
# datasheet peaks by the device name torch reports (a measurement's env["device"])
DATASHEET_PEAK_FLOPS = {"NVIDIA H200": H200_PEAK_FLOPS, "NVIDIA H100 80GB HBM3": H100_SXM_PEAK_FLOPS,
                        "Tesla T4": T4_PEAK_FLOPS}

# The free T4's memory, the one size of that card in the whole course: the profile's card, the estimator's and
# planner's t4 (HARDWARE), the CLI's help and the texts' named figure t4_gib (course_utils/chapter/figures.yaml).
T4_CARD_GIB = 14.75

PROFILES = {
    "t4": Profile(
        name="t4", label="T4 profile", gpu="NVIDIA T4 (Colab free tier)", compute_capability=(7, 5),
        # 15,360 MiB of GDDR6, of which the driver leaves T4_CARD_GIB to CUDA (what torch reports on Colab)
        card_bytes=int(T4_CARD_GIB * GiB), flash_attention=False, peak_flops=T4_PEAK_FLOPS,
        cannot_emulate=(f"a T4's speed ({T4_PEAK_FLOPS['fp16'] / 1e12:.0f} TFLOP/s fp16 peak, 320 GB/s memory) and "
                        "its own kernels: cuBLAS, "
                        "bitsandbytes and Triton still run the real GPU's code, so their workspaces and timings "
                        "are that GPU's; memory and precision are the T4's, speed is not"),
    ),
}


def active_profile() -> Profile | None:
    """The profile named by $COURSE_PROFILE ('t4'), when a CUDA GPU is here to stand in; else None."""
    import torch

    name = os.environ.get(PROFILE_ENV, "").strip().lower()
    if name in ("", "none", "native", "off"):
        return None
    if name not in PROFILES:
        raise HardwareError(f"{PROFILE_ENV}={name!r} is not a device profile; use one of {', '.join(PROFILES)}, "
                            f"or unset {PROFILE_ENV} to use this machine as it is.")
    return PROFILES[name] if torch.cuda.is_available() else None


def profile_cap_bytes(card_bytes: int, card_used: int, own_reserved: int, headroom: int = 0) -> int:
    """What this process may reserve so that the whole card stays within `card_bytes`: the card's size
    minus what every other process and every CUDA context (this one's too) already hold, less a
    headroom for what the contexts still add later.

    card_used is what the card holds now (all processes, contexts included); own_reserved is the part
    of it that is this process's own allocator pool, which the cap itself governs."""
    return max(0, card_bytes - headroom - (card_used - own_reserved))


def _card_used_bytes() -> int:
    """What the GPU holds now, all processes and contexts together (its total minus its free memory).

    With $COURSE_CARD_GROUP set, a virtual card: only the processes of this process's session count
    (NVML's per-process figures), so several profiled runs can share one big GPU, each as its own card."""
    import torch

    free, total = torch.cuda.mem_get_info(0)
    if os.environ.get(CARD_GROUP_ENV):
        return group_used_bytes()
    return total - free


def apply_profile() -> str | None:
    """Make this process behave as on the profile's card: no flash (or cuDNN) attention, and an allocator
    cap that keeps the whole card within the profile's memory. Called before a model loads; returns a
    note for the measurement, or None when no profile is active."""
    import torch

    prof = active_profile()
    if prof is None:
        return None
    if not prof.flash_attention:
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)  # cuDNN's fused attention needs compute capability 8.0+ too
    torch.cuda.init()
    _, total = torch.cuda.mem_get_info(0)
    used = _card_used_bytes()
    cap = profile_cap_bytes(prof.card_bytes, used, torch.cuda.memory_reserved(0), prof.headroom_bytes)
    torch.cuda.set_per_process_memory_fraction(max(cap, 1) / total, 0)
    return (f"{prof.label}: this process may reserve {cap / GiB:.2f} GiB (the card's {prof.card_bytes / GiB:.2f} GiB "
            f"less {(used - torch.cuda.memory_reserved(0)) / GiB:.2f} GiB held by CUDA contexts and other processes, "
            f"less {prof.headroom_bytes / GiB:.2f} GiB kept for the contexts to grow{group_note()})"
            + ("; flash and cuDNN attention off" if not prof.flash_attention else ""))


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


# ---------------------------------------------------------------------------------------------
# the devices an estimate assumes (course_utils.estimate), and the precision a recipe gets on them
# ---------------------------------------------------------------------------------------------
HARDWARE = {
    "gpu": Hardware("CUDA GPU with bf16 (compute capability 8.0+: A100, L4, RTX 30/40, H100, H200)",
                    "cuda", "bf16", True, short="a bf16 GPU", compute_capability=(9, 0)),  # the reference H200's
    "t4": Hardware("NVIDIA T4 (Colab free tier): fp16, no FlashAttention-2", "cuda", "fp16", False,
                   PROFILES["t4"].card_bytes / GiB,  # T4_CARD_GIB: one size of the T4 in the whole course
                   short="a T4 (fp16)", compute_capability=(7, 5)),
    "cpu": Hardware("CPU", "cpu", "fp32", False, short="a CPU"),
}


def get_hardware(hardware: str | Hardware) -> Hardware:
    """A Hardware from its name in HARDWARE (or itself)."""
    if isinstance(hardware, Hardware):
        return hardware
    try:
        return HARDWARE[hardware.lower()]
    except KeyError:
        raise HardwareError(f"Unknown hardware {hardware!r}; use one of {', '.join(HARDWARE)}.") from None


def resolve_precision(precision: str, hw: Hardware | None = None) -> str:
    """Turn 'auto' into what the hardware does best; check a forced choice is possible.

    hw: the device an estimate assumes (one of HARDWARE); None (the default): this machine. There bf16 is
    refused only where 'auto' is fp16 (a T4): the estimate's CPU stands for any CPU."""
    dev = device_type() if hw is None else hw.device
    if precision == "auto":
        if hw is not None:
            return hw.auto_precision
        if dev == "cuda":
            return "bf16" if bf16_supported() else "fp16"
        return "fp32"  # mixed precision on CPU saves little and, without bf16 instructions, is slow
    if precision == "bf16" and not (bf16_supported() if hw is None else hw.auto_precision != "fp16"):
        if hw is not None:
            where = hw.short or hw.name
        else:
            cc = compute_capability()
            where = f"this GPU ({device_name()}, compute capability {cc[0]}.{cc[1]})" if dev == "cuda" else "this CPU"
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
    """(usable, reason): whether bitsandbytes imports and can quantize to NF4 and back on this device (a
    64-number tensor: an import alone succeeds even where no library for this CUDA version is installed)."""
    try:
        with _no_hub_kernels():
            import bitsandbytes.functional as bf
        import torch
    except Exception as exc:  # ImportError, or a CUDA setup error raised at import
        return False, f"bitsandbytes does not import here ({type(exc).__name__}: {exc})"
    where, version = device_type(), md.version("bitsandbytes")
    try:
        x = torch.linspace(-1, 1, 64, device=where)
        packed, state = bf.quantize_4bit(x, quant_type="nf4")
        bf.dequantize_4bit(packed, state)
    except Exception as exc:  # e.g. no compiled library for this CUDA version
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        return False, (f"bitsandbytes {version} imports but cannot quantize to NF4 on {where} ({type(exc).__name__}: "
                       f"{first}); reinstall it for this machine (pip install --force-reinstall bitsandbytes)")
    return True, f"bitsandbytes {version} on {where} (NF4 quantize and dequantize checked)"


class _no_hub_kernels:
    """huggingface_hub's offline switch on while bitsandbytes imports: on a CPU with AVX512-BF16 its import asks the
    hub for a CPU kernel (the `kernels` package) with no time limit, so a hub that accepts and never answers hung
    `course env`. The course never uses that kernel (build.one_4bit_format_on_every_cpu turns it off)."""

    def __enter__(self):
        try:
            from huggingface_hub import constants
        except ImportError:
            self.constants = None
            return self
        self.constants, self.was = constants, constants.HF_HUB_OFFLINE
        constants.HF_HUB_OFFLINE = True
        return self

    def __exit__(self, *exc) -> None:
        if self.constants is not None:
            self.constants.HF_HUB_OFFLINE = self.was


def installed(names) -> dict[str, str]:
    """{name: installed version, or "missing"}."""
    out = {}
    for name in names:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "missing"
    return out


def versions() -> dict[str, str]:
    """Installed versions of the training stack (and Python)."""
    out = {"python": platform.python_version(), **installed(STACK)}
    for name in OPTIONAL_STACK:  # recorded where installed only, so that other machines' keys do not change
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


OPTIONAL_STACK = ("liger-kernel",)  # notebook 09's Liger kernels (CUDA only)


def total_memory_bytes() -> int:
    """Memory of the compute device: GPU memory on CUDA, physical RAM on CPU."""
    import torch

    if torch.cuda.is_available():
        prof = active_profile()
        return prof.card_bytes if prof else torch.cuda.get_device_properties(0).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class Machine:
    """This machine as a measurement records it: device, memory, bf16, CUDA and the library versions. Which
    stored results are comparable, and the course's own part of a result's provenance, are
    course_utils.provenance's (its Environment is a Machine with them)."""

    device: str
    device_type: str
    total_memory_gib: float
    bf16: bool
    compute_capability: str | None
    cuda: str | None
    driver: str | None
    versions: dict


def driver_version() -> str | None:
    """The NVIDIA driver's version, from nvidia-smi, or None (no CUDA GPU, or no nvidia-smi)."""
    import subprocess

    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip().splitlines()[0]
    except Exception:
        return None


def machine() -> Machine:
    """Read this machine."""
    import torch

    cc = compute_capability()
    return Machine(
        device=device_name(),
        device_type=device_type(),
        total_memory_gib=round(total_memory_bytes() / GiB, 2),
        bf16=bf16_supported(),
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        cuda=torch.version.cuda,
        driver=driver_version() if torch.cuda.is_available() else None,
        versions=versions(),
    )


def release_memory() -> int:
    """Give what this process's CUDA allocator caches back to the card (a notebook's kernel does this
    after each demonstration, so the measuring processes after it have the card to themselves).
    Returns the bytes this process's allocator still holds on the GPU (0 on a CPU): what is still
    referenced somewhere."""
    import gc

    import torch

    gc.collect()
    if _forget_finished_overrides():
        gc.collect()
    if torch.cuda.is_available():
        # cuBLAS keeps a workspace per handle (32 MiB each on a Hopper GPU) from the caching allocator, and it
        # can sit inside the one large block transformers reserves when it loads a model: two of them kept
        # notebook 07's whole 5.2 GiB loading block from being given back after `del model, trainer`
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        torch.cuda.empty_cache()
        return torch.cuda.memory_reserved()
    return 0


def _forget_finished_overrides() -> int:
    """Drop bitsandbytes' optimizer overrides for modules nothing else uses; return how many.

    transformers' Trainer registers every nn.Embedding of the model with bitsandbytes'
    GlobalOptimManager (32-bit state for embeddings) whenever it builds an 8-bit optimizer, and that
    singleton never lets go: after `del model, trainer` the embedding table, and the card's memory
    under it, would stay alive for as long as the kernel runs."""
    import gc
    import types

    bnb = sys.modules.get("bitsandbytes.optim.optimizer")
    if bnb is None:
        return 0
    manager = bnb.GlobalOptimManager.get_instance()
    entries = manager.module_weight_config_triple
    alive = [e for e in entries
             if any(r is not e and not isinstance(r, types.FrameType) for r in gc.get_referrers(e[0]))]
    dropped = len(entries) - len(alive)
    entries[:] = alive
    return dropped


def available_bytes() -> int:
    """Device memory this process can still take: under a profile, its share of the profile's card; on a
    GPU, what is free plus this process's own cached pool; on a CPU, the physical memory."""
    import torch

    if not torch.cuda.is_available():
        return total_memory_bytes()
    free, _ = torch.cuda.mem_get_info(0)
    own = torch.cuda.memory_reserved(0)
    prof = active_profile()
    if prof is None:
        return free + own
    return profile_cap_bytes(prof.card_bytes, _card_used_bytes(), own)

CARD_GROUP_ENV = "COURSE_CARD_GROUP"


def group_used_bytes(session: int | None = None) -> int:
    """GPU memory held by the processes of one session (default: this process's), from NVML."""
    return sum(used for _, used in group_processes(session))


def group_processes(session: int | None = None) -> list[tuple[int, int]]:
    """(pid, bytes) of every process of one session (default: this process's) that holds GPU memory, from NVML."""
    import pynvml

    session = os.getsid(0) if session is None else session
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        found = []
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            try:
                if os.getsid(proc.pid) == session:
                    found.append((proc.pid, proc.usedGpuMemory or 0))
            except (ProcessLookupError, PermissionError):
                continue
        return found
    finally:
        pynvml.nvmlShutdown()


def _command(pid: int) -> str:
    """A process's command line, short (for a diagnosis)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    return " ".join(os.path.basename(w) if i < 2 else w for i, w in enumerate(words[:4]))[:60]


def group_note() -> str:
    """Which processes a virtual card counted (pid: GiB, this one marked), for the measurement's note."""
    if not os.environ.get(CARD_GROUP_ENV):
        return ""
    try:
        procs = group_processes()
    except Exception as exc:  # the note is a diagnosis; the cap itself was already computed
        return f"; counted: unknown ({type(exc).__name__})"
    parts = [f"{pid}{'*' if pid == os.getpid() else ''} {used / GiB:.2f} ({_command(pid)})" for pid, used in procs]
    return f"; counted (pid GiB, * this one): {', '.join(parts) or 'none'}"
