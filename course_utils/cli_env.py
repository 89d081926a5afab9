"""`course env`: what this machine has for the chapter ([OK]/[FAIL] lines: the stack, bitsandbytes, bf16, the
notebook widgets, the hub) and the device profile in force (course_utils.machine's profiles)."""

from __future__ import annotations

import os

from course_utils import data
from course_utils.common import GiB
from course_utils.machine import PROFILE_ENV, STACK, active_profile, bitsandbytes_status, installed, machine
from course_utils.machine import resolve_precision


def env_report() -> tuple[str, bool]:
    """The `course env` text, with [OK]/[FAIL] lines for what the chapter needs, and overall OK."""
    env = machine()
    lines = [
        f"device:        {env.device}",
        f"memory:        {env.total_memory_gib:.1f} GiB",
        f"bf16 (native): {env.bf16}" + (f"  (compute capability {env.compute_capability})" if env.compute_capability else ""),
        f"precision=auto resolves to: {resolve_precision('auto')}",
    ]
    if env.cuda:
        lines.append(f"CUDA:          {env.cuda}, driver {env.driver}")
    lines += profile_lines()
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
    # what decides whether the quiz and the checklist render; not part of a result's environment, since they do
    # not change what a measurement finds
    for name, version in installed(NOTEBOOK_STACK).items():
        check(version != "missing", f"{name} {version}", required=False)
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    if offline:
        check(True, "hub access: off (HF_HUB_OFFLINE set; the embedded default is used)")
    else:
        data.LAST_HUB_ANSWER[0] = ""
        reachable = data.hub_reachable()
        why = data.LAST_HUB_ANSWER[0]  # e.g. accepted the connection but did not answer within 2 s
        host = data.hub_address()[0]  # huggingface.co, or where HF_ENDPOINT points
        check(reachable, f"hub access: {host} answers" if reachable else
              f"hub access: {host} does not answer{': ' + why if why else ''} (set HF_HUB_OFFLINE=1 to use "
              "the embedded default without waiting on it)", required=False)
    return "\n".join(lines + [""] + checks), ok_all


NOTEBOOK_STACK = ("ipywidgets", "jupyterlab_widgets", "widgetsnbextension", "ipykernel")


def profile_lines() -> list[str]:
    """What `course env` says of the device profile: which one, what it changes, what it cannot emulate."""
    name = os.environ.get(PROFILE_ENV, "").strip()
    prof = active_profile()
    if prof is None:
        return [f"profile:       {name} asked for, but there is no CUDA GPU here to stand in: off"] if name else []
    import torch

    return [f"profile:       {prof.label} ({prof.gpu}) on {torch.cuda.get_device_name(0)}: compute capability "
            f"{prof.compute_capability[0]}.{prof.compute_capability[1]} as far as the course decides, "
            f"{prof.card_bytes / GiB:.2f} GiB for the whole card, flash attention "
            f"{'on' if prof.flash_attention else 'off'}",
            f"               cannot emulate: {prof.cannot_emulate}"]
