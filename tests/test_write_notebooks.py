"""The one notebook writer (scripts/notebooks/write_notebooks.py): every writer is idempotent, so running it on the
committed notebooks changes nothing, and `--check` says so without writing."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _writer():
    spec = importlib.util.spec_from_file_location("write_notebooks", ROOT / "scripts" / "notebooks" / "write_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_writer_changes_nothing_in_the_committed_notebooks(tmp_path, monkeypatch):
    """Each writer run for real (not --check) over copies of the committed notebooks leaves every byte as it was."""
    mod = _writer()
    copies = tmp_path / "notebooks"
    copies.mkdir()
    for p in NOTEBOOKS:
        shutil.copy(p, copies / p.name)
    monkeypatch.setattr(mod, "NOTEBOOKS", copies)
    for name in (*mod.ALL, "clean"):
        paths = [copies / p.name for p in mod.WRITERS[name][1]()]
        assert paths and all(p.parent == copies for p in paths), name
        changed, problems = mod.run(name, paths)
        assert changed == [] and problems == [], f"{name} changed {[p.name for p in changed]}: {problems}"
    assert {p.name: p.read_bytes() for p in copies.iterdir()} == {p.name: p.read_bytes() for p in NOTEBOOKS}


def test_check_names_a_stale_notebook_and_writing_mends_it(tmp_path, capsys):
    """A notebook whose troubleshooting cell and setup cell were edited: --check exits 1 and writes nothing; the
    writer puts both back as they were."""
    mod = _writer()
    original = NOTEBOOKS[1]
    path = tmp_path / original.name
    nb = json.loads(original.read_text())
    trouble = next(c for c in nb["cells"] if mod.tagged(c, mod.TROUBLE_TAG))
    trouble["source"] = ["stale\n"]
    setup = next(c for c in nb["cells"] if c["cell_type"] == "code")
    setup["source"] = ["# google.colab, an old setup cell\n"]
    stale = mod.dump(nb)
    path.write_text(stale)
    assert mod.main(["troubleshooting", "--check", str(path)]) == 1 and path.read_text() == stale
    assert "would change" in capsys.readouterr().out
    assert mod.main(["setup", str(path)]) == 0 and mod.main(["troubleshooting", str(path)]) == 0
    assert path.read_text() == original.read_text()
    assert mod.main(["all", "--check", str(path)]) == 0


def test_a_writer_that_cannot_place_its_cell_says_what_to_add(tmp_path):
    mod = _writer()
    path = tmp_path / NOTEBOOKS[0].name
    nb = json.loads(NOTEBOOKS[0].read_text())
    nb["cells"] = [c for c in nb["cells"] if c["cell_type"] == "markdown"]
    path.write_text(mod.dump(nb))
    try:
        mod.main(["setup", str(path)])
    except SystemExit as e:
        assert "setup cell" in str(e) and path.name in str(e)
    else:
        raise AssertionError("a notebook without a setup cell was accepted")
