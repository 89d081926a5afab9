"""The named figures (course_utils.chapter.figures): texts pin figures by name, one registry holds each figure's
expression once, and prose is checked against the shipped values (course_utils/reference/facts.json) without torch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils.chapter import facts, figures, texts
from course_utils.common import GiB, MiB

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "peft", "bitsandbytes", "trl", "datasets", "accelerate")

NO_TORCH_CHECK = f"""
import json, sys
from pathlib import Path
from course_utils.chapter import facts, figures, texts
from course_utils.chapter.quiz.bank import load_bank, quiz_dir
with figures.from_shipped():
    problems = [f"{{where}}: {{u}}" for where, text in texts.every_text() for u in facts.unsourced(text)]
    banks = [load_bank(p).title for p in sorted(quiz_dir().glob("*.yaml"))]
print(json.dumps({{"problems": problems, "banks": len(banks), "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def test_every_text_checks_against_the_shipped_values_without_torch():
    """Every quiz bank, notebook's Markdown and README figure checked (and every bank rendered) from facts.json in a
    fresh interpreter, which never imports torch or the training stack."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", NO_TORCH_CHECK], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert not result["problems"], "\n".join(result["problems"])
    assert result["banks"] >= 10
    assert result["heavy"] == [], f"checking prose imported {result['heavy']}"


def test_a_text_names_its_figure_and_may_do_arithmetic_over_names():
    values = figures.shipped_values()
    with figures.from_shipped():
        assert facts.render("{{ ref_qlora_16x1_allocated_gib :.2f }} GiB") == \
            f"{values['ref_qlora_16x1_allocated_gib']:.2f} GiB"
        drop = (values["tiny_baseline_peak_bytes"] - values["tiny_ckpt_peak_bytes"]) / MiB
        assert facts.render("{{ (tiny_baseline_peak_bytes - tiny_ckpt_peak_bytes) / MiB :.1f }}") == f"{drop:.1f}"
        with pytest.raises(facts.FactError, match="not named figures of figures.yaml"):
            facts.render("{{ ref('QLoRA 16x1').cuda_max_allocated / GiB :.2f }}")  # a source typed in a text
        with pytest.raises(facts.FactError, match="not named figures"):
            facts.render("{{ no_such_figure }}")


def test_the_shipped_check_still_catches_an_unsourced_a_stale_and_a_wrong_figure():
    now = f"{figures.shipped_values()['ref_qlora_16x1_allocated_gib']:.2f}"
    with figures.from_shipped():
        assert facts.unsourced(f"it allocated {now}<!--{{{{ ref_qlora_16x1_allocated_gib :.2f }}}}--> GiB") == []
        stale = facts.unsourced("it allocated 9.99<!--{{ ref_qlora_16x1_allocated_gib :.2f }}--> GiB")
        assert len(stale) == 1 and "stale" in stale[0].context
        assert [u.number for u in facts.unsourced("the run peaked at 42.7 MiB")] == ["42.7"]
        assert "does not hold" in facts.unsourced("4 + 4 + 8 = 20 bytes")[0].context


def test_outside_the_shipped_check_a_name_follows_its_source(monkeypatch):
    m = facts.ref("QLoRA 16x1")
    assert facts.render_value("ref_qlora_16x1_allocated_gib") == m.cuda_max_allocated / GiB
    monkeypatch.setattr(m, "cuda_max_allocated", 3 * GiB)
    assert facts.render("{{ ref_qlora_16x1_allocated_gib :.2f }}") == "3.00"


def test_the_registry_names_each_figure_once_and_every_name_is_used():
    names = figures.registry()
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", n) for n in names)
    assert not set(names) & set(facts.namespace()), "a figure's name hides a source's"
    assert len({f.expr for f in names.values()}) == len(names), "two names for one expression"
    assert all(f.about.strip() for f in names.values())
    every = " ".join(text for _, text in texts.every_text())
    unused = [n for n in names if not re.search(rf"\b{n}\b", every)]
    assert not unused, f"named figures no text uses: {unused}"


def test_one_t4_memory_figure():
    """The T4's memory is one figure, machine.T4_CARD_GIB: the profile's card, the estimator's T4 and the texts'
    t4_gib; no module or text types it again, except pinned to t4_gib (and one shell comment, held to it here)."""
    from course_utils.machine import HARDWARE, PROFILES, T4_CARD_GIB

    assert figures.registry()["t4_gib"].expr == "lib.t4_gib"
    assert figures.shipped_values()["t4_gib"] == PROFILES["t4"].card_bytes / GiB == HARDWARE["t4"].memory_gib == \
        T4_CARD_GIB
    shown = re.escape(f"{T4_CARD_GIB:g}")
    shell = f"course plan --model llama-3.1-8b --hardware t4         # fp16, {T4_CARD_GIB:g} GiB"
    assert shell in (ROOT / "README.md").read_text(encoding="utf-8")
    copies = [f"{path.name}: ...{text[max(0, m.start() - 40):m.end() + 20]}..."
              for path in [*sorted((ROOT / "course_utils").rglob("*.py")), ROOT / "README.md"]
              if path.name != "machine.py"
              for text in [path.read_text(encoding="utf-8").replace(shell, "")]
              for m in re.finditer(rf"(?<![\d.]){shown}(?![\d]|<!--\{{\{{ t4_gib)", text)]
    copies += [f"{where}: {m.group(0)}" for where, text in texts.every_text() if not where.startswith("README")
               for m in re.finditer(rf"(?<![\d.]){shown}(?![\d]|<!--\{{\{{ t4_gib)", text)]
    assert not copies, "the T4's memory typed again:\n" + "\n".join(copies)


def test_stale_lists_what_changed():
    values = figures.shipped_values()
    assert figures.stale(values) == []
    changed = figures.stale({**values, "t4_gib": 15.0})
    assert len(changed) == 1 and changed[0].startswith("t4_gib:")


@pytest.mark.truth
def test_the_shipped_values_are_those_of_the_sources(capsys):
    """facts.json against every name's expression rendered now (needs the estimator and the shipped runs): what
    `python -m course_utils.chapter.facts --check` says."""
    code = facts.main(["--check"])
    out = capsys.readouterr().out
    assert code == 0, f"facts.json is stale; run {figures.COMMAND}:\n{out}"
    assert f"{len(figures.registry())} named figures, 0 stale" in out
