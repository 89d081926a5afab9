"""README.md's marker blocks (`<!-- name -->` ... `<!-- /name -->`) are the output of course functions.

The figure checker (course_utils.facts, tests/test_truth.py) skips what is between a block's markers, so every block must be
kept equal to its source here (or in tests/test_t4check.py and tests/test_estimate.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from course_utils.chapter import facts
from course_utils.chapter import texts

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TESTED_ELSEWHERE = {"t4-table": "tests/test_t4check.py::test_readme_table_is_the_shipped_records",
                    "expected-table": "tests/test_estimate.py::test_readme_shows_the_expected_table_as_printed",
                    "library-table": "tests/test_library_objects.py::test_readme_field_table_is_generated",
                    "config-estimates": "tests/test_from_library.py::test_readme_config_estimates_are_printed"}
TESTED_HERE = {"ladder-table", "beyond-table", "peer-table", "host-table", "module-map", "peer31-table", "peer31-repeats",
               "compiled-table"}


def block(name: str) -> str:
    text = README.read_text(encoding="utf-8")
    return text.split(f"<!-- {name} -->\n", 1)[1].split(f"\n<!-- /{name} -->", 1)[0]


def test_readme_marker_blocks_are_all_tested():
    names = [m.group(2) for m in texts.MARKER_BLOCK.finditer(README.read_text(encoding="utf-8"))]
    assert len(names) == len(set(names))
    assert set(names) == TESTED_HERE | set(TESTED_ELSEWHERE), "a new marker block needs a test that keeps it equal"


def test_readme_module_map_names_every_module():
    """The Layout section's map is every module of the package with its docstring's first sentence."""
    assert block("module-map") == texts.module_map()
    assert all(f"`{p.relative_to(ROOT).as_posix()}`" in block("module-map") for p in (ROOT / "course_utils").rglob("*.py"))


def test_readme_beyond_table_is_the_shipped_run():
    from course_utils.chapter import beyond_the_recipe as beyond
    from course_utils.chapter import toward_the_limit
    from course_utils.chapter.every_notebook import describe_reference

    ms = beyond.reference()
    assert block("beyond-table") == describe_reference(ms) + "\n\n```\n" + beyond.format_rows(beyond.rows(ms)) + "\n```"


def test_readme_peer_table_is_the_shipped_peer_run():
    """Issue 16's table: our recipes and the peer's from one run (one run id on every line), as shipped."""
    from course_utils.chapter import beyond_the_recipe as beyond
    from course_utils.chapter import toward_the_limit

    ours, theirs = beyond.reference(run="peer-run"), beyond.peer_reference()
    assert ours and theirs and len({m.run_id for m in ours + theirs}) == 1
    assert {beyond.batching(m) for m in theirs} == {f"{mb}x{ga}" for mb, ga in toward_the_limit.PEER_BATCHES}
    assert block("peer-table") == toward_the_limit.peer_run_report()


def test_readme_issue_31_peer_run_and_its_repeat_are_as_shipped():
    """Issue 31's peer run (beyond/checks/peer1-): ours and Unsloth, one run id, both settings; and the spread
    between it and the same command's second run (peer2-)."""
    from course_utils.chapter import beyond_the_recipe as beyond
    from course_utils.chapter import toward_the_limit

    runs = beyond.reference(run="peer1")
    theirs = [m for m in runs if toward_the_limit.peer_name(m)]
    assert len({m.run_id for m in runs}) == 1 and len(runs) > len(theirs)
    assert {beyond.batching(m) for m in theirs} == {f"{mb}x{ga}" for mb, ga in toward_the_limit.PEER_BATCHES}
    assert block("peer31-table") == toward_the_limit.peer_run_report(run="peer1")
    assert block("peer31-repeats") == "```\n" + str(toward_the_limit.peer_repeats()) + "\n```"
    assert block("compiled-table") == toward_the_limit.peer_run_report(run="compiled-peer")


def test_readme_host_table_is_every_change_tried_as_shipped():
    """Issue 31's count table: each change tried, without and with it, from the run of scripts/gpu/count_launches.py
    that measured it, as shipped."""
    from course_utils.chapter import host_work

    assert block("host-table") == "```\n" + str(host_work.changes_table()) + "\n```"


def test_readme_ladder_table_memory_is_the_estimate():
    """`course run`'s table as printed on a CPU: its memory columns are the estimate of each rung of the ladder
    (which the tensor tracker matches to the byte on the tiny model); tokens/s and loss are that run's."""
    from course_utils.recipe import ladder

    lines = block("ladder-table").strip("`\n").splitlines()
    assert lines[0].split()[:7] == ["recipe", "params", "grads", "optim", "activ", "temps", "peak"]
    rows = {}
    joined = []  # a row's reason may wrap onto indented lines (the table fits 100 characters a line)
    for line in lines[2:]:
        if line.startswith(" ") and joined:
            joined[-1] += " " + line.strip()
        else:
            joined.append(line)
    for line in joined:
        found = re.match(r"^(.*?)\s{2,}(skipped: .*|[\d.]+(?:\s+[\d.]+){6}(?:\s+±\s+\d+)?\s+[\d.]+)$", line)
        assert found, line
        rows[found.group(1)] = found.group(2)
    base = facts.rung("baseline (LoRA, fp32)")
    assert list(rows) == [r.name for r in ladder(base)]
    for label, shown in rows.items():
        if shown.startswith("skipped"):
            continue
        e = facts.est(facts.rung(label), "cpu")
        cats = [e.by_category.get(c, 0) for c in ("parameters", "gradients", "optimizer", "activations", "temporaries")]
        want = [f"{b / facts.MiB:.1f}" for b in cats + [e.peak_bytes]]
        assert shown.split()[:6] == want, label


def test_readme_figures_are_pinned_to_their_sources():
    problems = [str(u) for _, text in texts.markdown_texts(README) for u in facts.unsourced(text)]
    assert not problems, "\n".join(problems)
    assert len(facts.pinned(README.read_text(encoding="utf-8"))) >= 50


def test_readme_starts_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    commands = re.findall(r"```bash\n(.*?)\n```", text, re.S)[:2]
    assert commands == ['python -m venv .venv && . .venv/bin/activate && python -m pip install torch==2.13.0 && '
                        'python -m pip install -e ".[dev]" && course run', "python -m pytest"]
