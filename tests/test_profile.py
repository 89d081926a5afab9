"""The T4 profile (COURSE_PROFILE=t4) without a GPU: its precision and fit rules, the LoRA dtype rule
under fp16, out of memory while loading as a result, and the random-weight stand-in for the hub model."""

from __future__ import annotations

import pytest
import torch

from course_utils import machine as hardware
from course_utils import cli, cli_env
from course_utils.common import GiB
from course_utils.machine import HardwareError


@pytest.fixture
def fake_h200(monkeypatch):
    """torch says: one CUDA GPU, an H200 of compute capability 9.0 (nothing is allocated on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")


def test_without_a_profile_the_gpu_is_itself(fake_h200, monkeypatch):
    monkeypatch.delenv("COURSE_PROFILE", raising=False)
    assert hardware.active_profile() is None
    assert hardware.compute_capability() == (9, 0)
    assert hardware.bf16_supported() and hardware.resolve_precision("auto") == "bf16"
    assert hardware.device_name() == "NVIDIA H200"


def test_t4_profile_changes_the_course_view_not_torch(fake_h200, monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "t4")
    assert hardware.compute_capability() == (7, 5)
    assert torch.cuda.get_device_capability(0) == (9, 0)  # torch (and Triton) still see the real GPU
    assert not hardware.bf16_supported()
    assert hardware.resolve_precision("auto") == "fp16"
    assert hardware.resolve_precision("fp16") == "fp16"
    with pytest.raises(HardwareError, match="no native bf16"):
        hardware.resolve_precision("bf16")
    assert hardware.device_name() == "T4 profile on NVIDIA H200"  # its results never mix with the H200's
    assert hardware.total_memory_bytes() == int(14.75 * GiB)


def test_profile_is_off_without_a_gpu_and_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("COURSE_PROFILE", "t4")
    assert hardware.active_profile() is None
    assert hardware.resolve_precision("auto") == "fp32"
    assert "no CUDA GPU here" in cli_env.profile_lines()[0]


def test_unknown_profile_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "a100")
    with pytest.raises(HardwareError, match="COURSE_PROFILE='a100' is not a device profile; use one of t4"):
        hardware.active_profile()


def test_cap_counts_the_whole_card():
    card = int(14.75 * GiB)
    # alone on the card: only this process's context (0.5 GiB) is held outside its own pool
    assert hardware.profile_cap_bytes(card, int(0.5 * GiB), 0) == card - int(0.5 * GiB)
    # the notebook's kernel holds 1.35 GiB and a context: the measuring child gets that much less
    kernel = int(1.35 * GiB) + int(0.5 * GiB)
    child_ctx = int(0.5 * GiB)
    assert hardware.profile_cap_bytes(card, kernel + child_ctx, 0) == card - kernel - child_ctx
    # the process's own pool does not count against itself
    assert hardware.profile_cap_bytes(card, kernel + child_ctx + GiB, GiB) == card - kernel - child_ctx
    # a full card leaves nothing
    assert hardware.profile_cap_bytes(card, card + GiB, 0) == 0


def test_profile_report_names_what_it_cannot_emulate(fake_h200, monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "t4")
    lines = cli_env.profile_lines()
    assert "T4 profile" in lines[0] and "14.75 GiB for the whole card" in lines[0] and "flash attention off" in lines[0]
    assert "cannot emulate" in lines[1] and "speed" in lines[1]


def test_course_env_takes_the_profile(monkeypatch, capsys):
    from course_utils.cli import build_parser

    args = build_parser().parse_args(["env", "--profile", "t4"])
    assert args.profile == "t4"
    assert build_parser().parse_args(["run", "--profile", "t4"]).profile == "t4"


def test_load_time_out_of_memory_is_recognised():
    from course_utils.child import is_out_of_memory

    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert not is_out_of_memory(RuntimeError("element 0 of tensors does not require grad"))
    assert not is_out_of_memory(KeyError("out of memory"))


def test_load_time_out_of_memory_becomes_a_does_not_fit_result(monkeypatch, tiny_model):
    from course_utils import measure as measure_mod
    from course_utils import child
    from course_utils.recipe import Recipe

    def no_room(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 15.00 GiB")

    monkeypatch.setattr("course_utils.build.load_model", no_room)
    m = child.run_here(Recipe(steps=3, warmup_steps=0))
    assert m.status == "does_not_fit" and not m.fits
    assert m.error.startswith("out of memory while loading the model: OutOfMemoryError")
    assert m.precision == "fp32"


def test_gpu_notebooks_pick_the_random_weight_stand_in_offline(fake_h200, monkeypatch):
    from course_utils.chapter import every_notebook as notebook

    monkeypatch.delenv("COURSE_PROFILE", raising=False)
    monkeypatch.setattr("course_utils.data.hub_reachable", lambda *a, **k: False)
    assert notebook.choose_model() == notebook.SMALL_PRESET
    assert notebook.choose_model(use_llama_8b=True) == "llama-3.1-8b"
    from course_utils.models import PRESETS

    assert PRESETS[notebook.SMALL_PRESET]["hub_id"] == notebook.SMALL_HUB_MODEL


def test_notebook_08_teaches_its_changes_in_fp16_on_a_t4(fake_h200, monkeypatch):
    from course_utils.chapter import beyond_the_recipe as beyond

    monkeypatch.setenv("COURSE_PROFILE", "t4")
    path = beyond.path_here("llama-3.1-8b")
    assert {r.precision for r in path} == {"fp16"}
    assert path[0].label == "source recipe (1x16)"
    monkeypatch.delenv("COURSE_PROFILE")
    assert {r.precision for r in beyond.path_here("llama-3.1-8b")} == {"bf16"}


def test_chapter_script_keeps_lora_in_fp32_where_bf16_does_not_train():
    """Notebook 07's script carries the one line fp16 AMP needs, and build() applies the same rule."""
    import inspect
    import json
    from pathlib import Path

    from course_utils import build

    nb = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / "07_complete_recipe.ipynb").read_text())
    script = next("".join(c["source"]) for c in nb["cells"] if "SFTTrainer(model=model" in "".join(c["source"]))
    after = script[script.index("SFTTrainer(model=model"):]
    assert 'if precision != "bf16"' in after and "lora_weight.data = lora_weight.data.float()" in after
    assert after.index("lora_weight.data.float()") < after.index("trainer.train()")
    # the loop leaves no global that holds a frozen weight (the last parameter is lm_head's, 2 GiB on Llama-3.1-8B)
    assert "for lora_weight in [p for p in trainer.model.parameters() if p.requires_grad]" in after
    assert 'precision != "bf16"' in inspect.getsource(build.build)


def test_shipped_t4_records_cover_every_notebook_with_provenance():
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    records = [json.loads(line) for line in (root / "course_utils" / "reference" / "t4" / "t4-check.jsonl")
               .read_text().splitlines() if line.strip()]
    from course_utils.chapter.t4 import NO_RECORD, NOT_CHECKED, PENDING_T4, SPLIT_FROM

    # 11 needs two GPUs; the notebooks of issue 30's split wait for their first check; older names stay as shipped
    notebooks = ({p.stem for p in (root / "notebooks").glob("*.ipynb")} - set(NO_RECORD) - set(PENDING_T4)) | set(SPLIT_FROM)
    for variant in ("small", "llama-8b"):
        unchecked = {n for n, v in NOT_CHECKED if v == variant}  # not run, and why
        assert {r["notebook"] for r in records if r["variant"] == variant} == notebooks - unchecked, variant
    for r in records:
        assert r["env"]["device"].startswith("T4 profile on NVIDIA"), r["env"]["device"]
        assert r["profile"] == "T4 profile" and r["command"].startswith(("python scripts/t4_check.py", "python scripts/gpu/t4_check.py"))
        assert r["date"].startswith("20") and r["run_id"].startswith("t4-") and r["env"]["versions"]["trl"]
        assert r["ran_through"] == (r["first_failure"] == ""), r["notebook"]
        assert set(r["precisions"]) <= {"fp16", "fp32"}  # never bf16 on a T4
        if r["ran_through"]:
            assert r["card_peak_gib"] <= 14.75 + 0.1, r  # the whole card, contexts included
