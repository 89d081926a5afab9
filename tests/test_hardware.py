"""hardware: precision resolution (real CPU, simulated CUDA devices and the devices an estimate assumes),
bitsandbytes, the env report."""

from __future__ import annotations

import pytest
import torch

from course_utils import machine as hardware
from course_utils import cli, cli_env
from course_utils.machine import HardwareError, resolve_precision

needs_cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path of this machine")


@pytest.fixture
def cpu(monkeypatch):
    """Whatever the machine, look like a CPU."""
    monkeypatch.setattr(hardware, "device_type", lambda: "cpu")
    monkeypatch.setattr(hardware, "compute_capability", lambda: None)


def fake_gpu(monkeypatch, cc: tuple[int, int], name: str) -> None:
    monkeypatch.setattr(hardware, "device_type", lambda: "cuda")
    monkeypatch.setattr(hardware, "compute_capability", lambda: cc)
    monkeypatch.setattr(hardware, "device_name", lambda: name)


# --- this machine --------------------------------------------------------------------------------


@needs_cpu_only
def test_this_machine_is_a_cpu_and_auto_is_fp32():
    assert hardware.device_type() == "cpu"
    assert hardware.compute_capability() is None
    assert "CPU" in hardware.device_name()
    assert resolve_precision("auto") == "fp32"


def test_fp32_is_always_fine():
    assert resolve_precision("fp32") == "fp32"


# --- CPU -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("has_bf16", [True, False])
def test_auto_is_fp32_on_any_cpu(cpu, monkeypatch, has_bf16):
    monkeypatch.setattr(hardware, "bf16_supported", lambda: has_bf16)
    assert resolve_precision("auto") == "fp32"


def test_bf16_without_native_support_raises_with_advice(cpu, monkeypatch):
    monkeypatch.setattr(hardware, "bf16_supported", lambda: False)
    with pytest.raises(HardwareError) as exc:
        resolve_precision("bf16")
    msg = str(exc.value)
    assert "bf16" in msg
    assert "this CPU" in msg
    assert "'auto'" in msg and "'fp32'" in msg


def test_bf16_with_native_support_is_kept(cpu, monkeypatch):
    monkeypatch.setattr(hardware, "bf16_supported", lambda: True)
    assert resolve_precision("bf16") == "bf16"


def test_fp16_on_cpu_raises(cpu, monkeypatch):
    monkeypatch.setattr(hardware, "bf16_supported", lambda: True)
    with pytest.raises(HardwareError) as exc:
        resolve_precision("fp16")
    assert "fp16" in str(exc.value) and "CUDA" in str(exc.value)
    assert "'fp32'" in str(exc.value)


def test_hardware_error_is_a_runtime_error():
    assert issubclass(HardwareError, RuntimeError)


# --- simulated GPUs ------------------------------------------------------------------------------


def test_t4_auto_is_fp16_and_bf16_raises(monkeypatch):
    fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    assert hardware.bf16_supported() is False  # the real function, on the simulated capability
    assert resolve_precision("auto") == "fp16"
    assert resolve_precision("fp16") == "fp16"
    with pytest.raises(HardwareError) as exc:
        resolve_precision("bf16")
    msg = str(exc.value)
    assert "Tesla T4" in msg and "compute capability 7.5" in msg
    assert "'auto'" in msg


@pytest.mark.parametrize("cc, name", [((8, 0), "NVIDIA A100"), ((9, 0), "NVIDIA H100")])
def test_ampere_and_later_auto_is_bf16(monkeypatch, cc, name):
    fake_gpu(monkeypatch, cc, name)
    assert hardware.bf16_supported() is True
    assert resolve_precision("auto") == "bf16"
    assert resolve_precision("bf16") == "bf16"
    assert resolve_precision("fp16") == "fp16"


# --- the devices an estimate assumes (course_utils.estimate) -----------------------------------


@pytest.fixture
def not_this_machine(monkeypatch):
    """An estimate's device decides alone: asking this machine fails the test."""
    for name in ("device_type", "bf16_supported", "compute_capability", "device_name"):
        monkeypatch.setattr(hardware, name, lambda: pytest.fail("an estimate's device asked this machine"))


@pytest.mark.parametrize("name, auto", [("gpu", "bf16"), ("t4", "fp16"), ("cpu", "fp32")])
def test_auto_on_an_estimates_device_is_that_devices(not_this_machine, name, auto):
    device = hardware.HARDWARE[name]
    assert resolve_precision("auto", device) == auto == device.auto_precision
    assert resolve_precision("fp32", device) == "fp32"


def test_bf16_on_the_estimates_t4_raises_with_advice(not_this_machine):
    assert resolve_precision("fp16", hardware.HARDWARE["t4"]) == "fp16"
    with pytest.raises(HardwareError) as exc:
        resolve_precision("bf16", hardware.HARDWARE["t4"])
    msg = str(exc.value)
    assert "a T4 (fp16) has no native bf16" in msg and "'auto'" in msg and "'fp32'" in msg


def test_the_estimates_cpu_takes_bf16_and_refuses_fp16(not_this_machine):
    """The estimate's CPU stands for any CPU: bf16 is allowed there; fp16 needs CUDA, as on this machine."""
    cpu = hardware.HARDWARE["cpu"]
    assert resolve_precision("bf16", cpu) == "bf16"
    with pytest.raises(HardwareError) as exc:
        resolve_precision("fp16", cpu)
    assert "fp16" in str(exc.value) and "CUDA" in str(exc.value) and "'fp32'" in str(exc.value)


def test_get_hardware_by_name_and_a_clear_error():
    assert hardware.get_hardware("T4") is hardware.HARDWARE["t4"]
    assert hardware.get_hardware(hardware.HARDWARE["gpu"]) is hardware.HARDWARE["gpu"]
    with pytest.raises(HardwareError, match="Unknown hardware 'tpu'; use one of gpu, t4, cpu"):
        hardware.get_hardware("tpu")


def test_hardware_does_not_import_the_estimator():
    """Imports point down the layers: the estimator takes its devices from hardware, never the reverse."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(hardware))
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level}
    assert not {m for m in imported if m.split(".")[0] == "estimate"}, imported


# --- bitsandbytes, versions, environment ---------------------------------------------------------


def test_bitsandbytes_is_usable_here():
    usable, why = hardware.bitsandbytes_status()
    assert usable is True
    assert "bitsandbytes" in why
    assert hardware.versions()["bitsandbytes"] in why


def test_versions_lists_the_stack():
    v = hardware.versions()
    assert set(v) == {"python", *hardware.STACK}
    assert all(v[name] != "missing" for name in hardware.STACK)


def test_machine_describes_this_machine():
    here = hardware.machine()
    assert here.device == hardware.device_name()
    assert here.device_type == hardware.device_type()
    assert here.total_memory_gib > 0
    assert here.versions == hardware.versions()  # the machine's own; the course's are provenance's


def test_env_report_has_ok_lines_and_the_device():
    text, ok = cli_env.env_report()
    assert ok is True
    assert hardware.device_name() in text
    assert "[FAIL]" not in text
    ok_lines = [line for line in text.splitlines() if line.startswith("[OK]")]
    assert len(ok_lines) >= len(hardware.STACK) + 2
    assert any("bitsandbytes" in line for line in ok_lines)
    assert f"precision=auto resolves to: {resolve_precision('auto')}" in text
    assert "HF_HUB_OFFLINE set" in text  # conftest sets it


def test_env_report_fails_without_bitsandbytes(monkeypatch):
    monkeypatch.setattr(cli_env, "bitsandbytes_status", lambda: (False, "simulated failure"))
    text, ok = cli_env.env_report()
    assert ok is False
    assert any(line.startswith("[FAIL]") and "simulated failure" in line for line in text.splitlines())


def test_env_report_fails_on_a_missing_package(monkeypatch):
    real = hardware.versions
    monkeypatch.setattr(hardware, "versions", lambda: real() | {"peft": "missing"})
    text, ok = cli_env.env_report()
    assert ok is False
    assert "[FAIL] peft installed (missing)" in text


def test_missing_bf16_is_only_a_warning(monkeypatch):
    monkeypatch.setattr(hardware, "bf16_supported", lambda: False)
    text, ok = cli_env.env_report()
    assert ok is True
    assert "[WARN] native bf16" in text


def test_release_memory_lets_go_of_a_finished_trainers_embedding():
    """transformers' Trainer registers every nn.Embedding with bitsandbytes' GlobalOptimManager when it builds
    an 8-bit optimizer; after `del model, trainer` that registration alone kept the table (and, on a GPU,
    the card's memory under it) alive. release_memory drops registrations of modules nothing else uses."""
    import gc
    import weakref

    import torch
    from bitsandbytes.optim import GlobalOptimManager

    from course_utils.machine import release_memory

    manager = GlobalOptimManager.get_instance()
    finished, in_use = torch.nn.Embedding(8, 4), torch.nn.Embedding(8, 4)
    for module in (finished, in_use):
        manager.register_module_override(module, "weight", {"optim_bits": 32})
    gone = weakref.ref(finished.weight)
    del finished
    gc.collect()
    assert gone() is not None  # bitsandbytes still holds it
    assert release_memory() == 0  # on a CPU nothing is cached on a GPU
    assert gone() is None
    assert any(entry[0] is in_use for entry in manager.module_weight_config_triple)  # a live model keeps its override
    manager.module_weight_config_triple[:] = [e for e in manager.module_weight_config_triple if e[0] is not in_use]


def test_requires_python_is_what_the_pinned_stack_needs():
    """pyproject's requires-python is the highest lower bound the installed stack declares (transformers 5.24 and
    trl 1.16 need 3.11), so pip refuses an older Python with that message instead of a resolver error."""
    import importlib.metadata as md
    import re
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    ours = tuple(int(x) for x in re.match(r">=\s*(\d+)\.(\d+)", project["requires-python"]).groups())
    needed = []
    for name in hardware.STACK:
        spec = md.metadata(name).get("Requires-Python") or ""
        found = re.search(r">=\s*(\d+)\.(\d+)", spec)
        if found:
            needed.append(tuple(int(x) for x in found.groups()))
    assert ours == max(needed), (ours, max(needed))


def test_env_report_names_the_widget_packages_and_a_hub_check_that_can_fail(monkeypatch):
    from course_utils import data

    for name in cli_env.NOTEBOOK_STACK:
        assert name in cli_env.env_report()[0]
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(data, "hub_reachable", lambda timeout=2.0: False)
    text, _ = cli_env.env_report()
    assert "[WARN] hub access: huggingface.co does not answer" in text


def test_bitsandbytes_that_imports_but_cannot_quantize_is_not_usable(monkeypatch):
    import bitsandbytes.functional as bf

    def broken(*a, **k):
        raise RuntimeError("CUDA Setup failed despite GPU being available.\nmore")

    monkeypatch.setattr(bf, "quantize_4bit", broken)
    usable, why = hardware.bitsandbytes_status()
    assert usable is False and "imports but cannot quantize" in why and "CUDA Setup failed" in why and "more" not in why


# --- CUDA-only techniques, refused by their TECHNIQUES row -----------------------------------------


def test_a_cuda_only_technique_is_refused_by_what_its_row_needs(monkeypatch):
    from course_utils import checks
    from course_utils.recipe import base_recipe_for

    base = base_recipe_for("tiny", "cpu")
    monkeypatch.setattr(checks, "device_type", lambda: "cuda")
    monkeypatch.setattr(hardware, "device_name", lambda: "Tesla T4")
    monkeypatch.setattr(hardware, "compute_capability", lambda: (7, 5))
    with pytest.raises(HardwareError, match=r"tf32=True runs fp32 matmuls on TF32 tensor cores .* compute capability "
                                            r"8\.0 or later; this machine trains on Tesla T4 \(compute capability 7\.5\)"
                                            r"\. Set tf32=False here\."):
        checks.check_hardware(base.with_(tf32=True))
    monkeypatch.setattr(hardware, "compute_capability", lambda: (9, 0))
    checks.check_hardware(base.with_(tf32=True))  # an H200 has TF32
    monkeypatch.setattr(checks.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(HardwareError, match=r"liger_kernels=True .* needs liger_kernel, which is not installed "
                                            r"\(pip install liger-kernel\)"):
        checks.check_hardware(base.with_(liger_kernels=True))
    checks.check_hardware(base.with_(offload_activations=True))  # on CUDA, with nothing more to ask for
