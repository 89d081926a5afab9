"""TROUBLESHOOTING.md quotes real messages (course_utils.troubleshooting).

(a) every quoted message is made by the course's code, occurs in the installed library's source, or is a run's
error in the shipped T4 check; (b) the committed guide is the rendering; (c) every `course ...` command in it
parses. Rendering runs each producer once (the reentrant one a forward and backward of the tiny model; no training).
"""

from __future__ import annotations

import json
import re
import shlex

import pytest

from course_utils.chapter import facts
from course_utils.chapter import texts
from course_utils.chapter.troubleshooting import sources as S
from course_utils.chapter.troubleshooting import guide as T
from course_utils.cli import build_parser
from course_utils.cli_recipe import FLAGS

# The words each entry exists for: one of its messages must hold them (the issue names most of them).
KEY_WORDS = {
    "no-course": "No module named 'course_utils'",
    "restart": "Restart the runtime (Runtime > Restart session), then run the notebook from the next cell",
    "pip-failed": "pip failed (exit 1)",
    "gated": "You are trying to access a gated repo",
    "hub": "did not answer within",
    "gpu-preset": "is a GPU preset and there is no CUDA GPU here",
    "bf16": "precision='bf16' was requested, but this GPU (Tesla T4, compute capability 7.5) has no native bf16",
    "fp16-bf16-adapters": "\"_amp_foreach_non_finite_check_and_unscale_cuda\" not implemented for 'BFloat16'",
    "bitsandbytes": "Paged optimizers are not supported on CPU",
    "oom": "CUDA out of memory. Tried to allocate",
    "reentrant": "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn",
    "data": "the shipped data packs into at most",
    "positions": "is longer than 'tiny' can take",
}


@pytest.fixture(scope="module")
def rendered(tiny_model) -> str:
    return T.render()


def _in_source(piece: str, source: str) -> bool:
    """A piece as the learner reads it, found in the source as written (a newline there is `\\n`)."""
    return piece in source or piece.replace("\n", "\\n") in source


def _check_library(lib: T.Library) -> None:
    source = lib.source()
    for piece in lib.pieces + lib.backing:
        assert _in_source(piece, source) == lib.present, (lib.package, lib.file, piece)
    for piece in lib.pieces if lib.shown else ():
        assert piece in lib.shown, (piece, lib.shown)


def _shipped_errors() -> dict[str, list[str]]:
    """Every run's error in the shipped T4 check, by label, read straight from the file."""
    errors: dict[str, list[str]] = {}
    for line in (texts.ROOT / "course_utils/reference/t4/t4-check.jsonl").read_text().splitlines():
        for run in json.loads(line)["runs"] if line.strip() else ():
            if run.get("error"):
                errors.setdefault(run["recipe"]["label"], []).append(run["error"])
    return errors


def test_the_entries_are_what_the_issue_asks_for():
    keys = [e.key for e in T.ENTRIES]
    assert keys == list(KEY_WORDS) and len(set(keys)) == len(keys)
    assert len({e.anchor for e in T.ENTRIES}) == len(keys)
    assert all(e.messages for e in T.ENTRIES)


# --- (a) every message is the real one ------------------------------------------------------------
def test_every_library_message_and_fact_is_in_the_installed_source():
    for e in T.ENTRIES:
        for lib in [m for m in e.messages if isinstance(m, T.Library)] + list(e.evidence):
            _check_library(lib)


def test_a_message_the_library_no_longer_raises_is_caught():
    changed = T.Library("", "transformers", "training_args.py", ("Your setup does not support bf16",))
    with pytest.raises(AssertionError):
        _check_library(changed)


def test_every_logged_message_is_a_shipped_run_error():
    errors = _shipped_errors()
    for m in (m for e in T.ENTRIES for m in e.messages if isinstance(m, T.Logged)):
        quoted = m.text().removesuffix(" …")
        assert any(err.startswith(quoted) for err in errors[m.label]), m.label
        assert "CUDA out of memory. Tried to allocate" in quoted


def test_every_produced_message_comes_from_the_code(rendered):
    for e in T.ENTRIES:
        for m in (m for m in e.messages if isinstance(m, T.Produced)):
            raw, shown = m.raw, m.text()
            assert raw and "Traceback" not in raw, e.key
            if not m.elide:
                assert shown == raw
            else:  # only what varies is elided: the rest stands in the raw message, in order
                assert shown != raw and "…" in shown
                assert re.fullmatch(".*?".join(map(re.escape, shown.split("…"))), raw, re.S), (shown, raw)


def test_each_entry_quotes_the_message_it_is_for(rendered):
    for e in T.ENTRIES:
        assert any(KEY_WORDS[e.key] in m.text() for m in e.messages), e.key


def test_a_broken_producer_says_the_guide_is_stale():
    broken = T.Produced("", lambda: 1 / 0, "a producer")
    with pytest.raises(T.TroubleshootingError, match="a producer no longer gives its message"):
        broken.raw  # noqa: B018


def test_the_gated_fix_reaches_the_measuring_process(monkeypatch):
    """The guide puts HF_TOKEN in the environment because the measuring child is a fresh process: it gets the
    notebook's environment, and huggingface_hub reads Colab's secrets only under IPython."""
    from course_utils.measure import child_env
    from course_utils.recipe import Recipe

    monkeypatch.setenv("HF_TOKEN", "hf_test")
    assert child_env(Recipe(model=S.GATED_MODEL))["HF_TOKEN"] == "hf_test"


# --- (b) the committed guide is the rendering -----------------------------------------------------
def _versions_masked(text: str) -> str:
    """The guide with each cited library's version number blanked: the small print says which versions
    it was checked against when it was rendered, and a new release of a library within the pins must not
    make the committed guide stale by that alone (the messages themselves are checked against the
    installed source above, whatever its version)."""
    packages = sorted({lib.package for e in T.ENTRIES for lib in e.evidence if isinstance(lib, T.Library)})
    return re.sub(rf"\b({'|'.join(map(re.escape, packages))}) \d+(?:\.\d+)+\S*", r"\1 <version>", text)


def test_committed_guide_is_the_rendering(rendered):
    assert _versions_masked(T.block_of(T.GUIDE.read_text(encoding="utf-8"))) == _versions_masked(rendered), \
        "TROUBLESHOOTING.md is stale: run python -m course_utils.chapter.troubleshooting.guide"
    for e in T.ENTRIES:
        assert f"\n## {e.title}\n" in rendered and f"(#{e.anchor})" in rendered


def test_write_fills_the_block_and_keeps_the_rest(tmp_path, rendered):
    guide = tmp_path / "TROUBLESHOOTING.md"
    guide.write_text("# Title\n\nintro\n<!-- troubleshooting -->\n<!-- /troubleshooting -->\ntail\n")
    assert T.write(guide) and not T.write(guide)
    text = guide.read_text()
    assert text.startswith("# Title\n\nintro\n") and text.endswith("<!-- /troubleshooting -->\ntail\n")
    assert T.block_of(text) == rendered
    guide.write_text("no markers")
    with pytest.raises(T.TroubleshootingError, match="no `<!-- troubleshooting -->`"):
        T.write(guide)


def test_prose_has_no_unsourced_figure():
    for e in T.ENTRIES:
        assert facts.unsourced(e.prose) == [], e.key
    guide = [text for where, text in texts.every_text() if where == "TROUBLESHOOTING.md"]  # `pytest -m truth` reads it
    assert len(guide) == 1 and facts.unsourced(guide[0]) == []


def test_links_point_at_the_release_and_an_entry():
    from course_utils.chapter.every_notebook import RELEASE_TAG

    url = T.link("oom")
    assert url.endswith(f"/blob/{RELEASE_TAG}/TROUBLESHOOTING.md#cuda-out-of-memory-on-a-t4")
    assert T.slug("`element 0 of tensors`: x's") == "element-0-of-tensors-xs"
    with pytest.raises(KeyError, match="no troubleshooting entry"):
        T.link("nope")
    links = T.links_by_notebook()
    assert list(links) == sorted(p.name[:2] for p in (texts.ROOT / "notebooks").glob("*.ipynb"))  # the setup cell's
    assert T.link("reentrant") in links["01"] and T.link("bf16") in links["04"]


# --- (c) every command parses ---------------------------------------------------------------------
def _commands(text: str) -> list[str]:
    fenced = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()]
    inline = re.findall(r"`(course [^`]*--[^`]*)`", text)
    return [c for c in fenced + inline if c.startswith("course ")]


def test_every_course_command_parses(rendered):
    commands = _commands(rendered)
    assert len(commands) >= len([e for e in T.ENTRIES if e.command_lines()])
    parser = build_parser()
    for command in commands:
        parser.parse_args(shlex.split(command)[1:])  # SystemExit (a failed test) when it does not parse
    named = set(re.findall(r"`course (\w+)", rendered))
    assert named <= {"run", "env", "estimate", "plan"}


def test_every_fix_command_runs(rendered, capsys):
    """The commands of the fixes (the bash blocks) work as shown: estimates, plans and `course env`, no training."""
    from course_utils.cli import main

    fixes = [line for block in re.findall(r"```bash\n(.*?)```", rendered, re.S) for line in block.splitlines()]
    assert fixes and not [c for c in fixes if c.startswith("course run")]
    for command in dict.fromkeys(fixes):
        assert main(shlex.split(command)[1:]) == 0, (command, capsys.readouterr().err)


def test_on_a_t4_the_8b_runs_that_do_not_fit_are_those_without_4bit_weights():
    """What the out-of-memory entry says of USE_LLAMA_8B = True, from the shipped T4 check."""
    from course_utils.chapter.t4 import defect, records

    runs = [run for rec in records(usable=lambda r: not defect(r))
            if rec["variant"] == "llama-8b" and not rec["notebook"].startswith("06") for run in rec["runs"]]
    assert runs and all((run["status"] == "does_not_fit") == (not run["recipe"]["load_in_4bit"]) for run in runs)
    sweep = [run for rec in records(usable=lambda r: not defect(r))
             if rec["variant"] == "llama-8b" and rec["notebook"].startswith("06") for run in rec["runs"]]  # notebook 06 sweeps in 4-bit: the long sequences and large batches do not fit
    assert all(run["recipe"]["load_in_4bit"] for run in sweep) and {run["status"] for run in sweep} == {"ok", "does_not_fit"}


def test_the_estimate_command_describes_the_recipe(rendered):
    from course_utils.cli import _recipe_from_args

    recipe = T.OOM_TRAINING.run().recipe_obj
    command = S.estimate_command(recipe)
    args = build_parser().parse_args(shlex.split(command)[1:])
    parsed = _recipe_from_args(args)
    knobs = ("model", *FLAGS["estimate"])  # every knob the estimator reads, as the CLI derives them
    assert {k: getattr(parsed, k) for k in knobs} == {k: getattr(recipe, k) for k in knobs}
    assert args.hardware == "t4" and command in rendered


def test_the_estimate_command_spells_every_estimate_flag_the_parser_reads():
    """A recipe away from the base in every knob the estimator reads: the command parses back to it."""
    from course_utils.cli import _recipe_from_args
    from course_utils.recipe import Recipe

    recipe = Recipe(model="smollm2-360m", precision="fp32", load_in_4bit=True, double_quant=False, lora_r=8,
                    lora_dropout=0.1, lora_targets=("q_proj", "v_proj"), gradient_checkpointing=True, micro_batch=2,
                    grad_accum=3, optimizer="adamw_8bit", max_seq_length=128, prepare_kbit=False,
                    offload_embeddings=True, liger_kernels=True, offload_activations=True)
    command = S.estimate_command(recipe, "cpu")
    parsed = _recipe_from_args(build_parser().parse_args(shlex.split(command)[1:]))
    assert {k: getattr(parsed, k) for k in FLAGS["estimate"]} == {k: getattr(recipe, k) for k in FLAGS["estimate"]}
    assert "--no-double-quant" in command and "--no-prepare-kbit" in command


def test_every_notebook_links_its_troubleshooting_entries():
    import json

    from course_utils.chapter.troubleshooting.guide import notebook_markdown

    for path in sorted((texts.ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        tagged = [c for c in cells if "troubleshooting" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, f"{path.name}: run python scripts/notebooks/write_notebooks.py troubleshooting {path}"
        assert "".join(tagged[0]["source"]) == notebook_markdown(path.name[:2]), path.name
        setup = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
        assert cells[setup + 1] is tagged[0], f"{path.name}: the troubleshooting cell belongs right after the setup"
