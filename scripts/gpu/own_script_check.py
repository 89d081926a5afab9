"""The "In your own script" cells, trained on a GPU, beside the course's measurement of the same recipe (issue 29:
"the memory-stats lines ... with the course's own measurement of the same run beside it (they must agree on a GPU)").

    python scripts/gpu/own_script_check.py --out own-script.jsonl [--notebooks 03,05,07] [--model smollm2-360m]
    python scripts/gpu/own_script_check.py --print-only --out course_utils/reference/own_script/smollm2-360m.jsonl

For each notebook, two fresh processes, one after the other on the same GPU:
- "script": the notebook's script cell as committed, run as plain Python, with only these changes: TRAIN_HERE = True,
  the model id (meta-llama/Llama-3.1-8B) replaced by the random-weight preset's local folder (models.preset_path: the
  same architecture family, no download), and max_steps=--steps added to SFTConfig. Notebook 07's script takes
  MODEL from the notebook: the preset's name. The cell prints its own `torch.cuda.max_memory_allocated()` /
  `max_memory_reserved()` after `trainer.train()` (reset before it); that line is read back.
- "course": course_utils.measure of the recipe the cell's `# recipe:` line names (chapter.own_script.cell_recipes),
  with model=--model, in a fresh process (isolate=True, no store): cuda_max_allocated / cuda_max_reserved.
One JSON line per notebook with both figures, their ratio, the GPU, the environment and the command; a table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GIB = 2**30
PRINTED = re.compile(r"max allocated (?P<alloc>[\d.]+) GiB, max reserved (?P<res>[\d.]+) GiB")
HUB_ID = '"meta-llama/Llama-3.1-8B"'


def script_cell(stem: str) -> str:
    """The notebook's "In your own script" cell (or notebook 07's script) as committed."""
    from course_utils.chapter import own_script

    path = ROOT / "notebooks" / f"{stem}.ipynb"
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and own_script.RECIPE_LINE.search(source) and "trainer.train()" in source:
            return source
    raise SystemExit(f"{path.name}: no script cell that trains")


def runnable(source: str, model: str, steps: int) -> str:
    """The cell with the three changes the docstring names, each checked to have happened."""
    from course_utils.models import resolve_model

    out = source.replace("TRAIN_HERE = False", "TRAIN_HERE = True", 1)
    out = out.replace(HUB_ID, repr(str(resolve_model(model))))
    if re.search(r"max_steps=\d+", out):  # notebook 07 sets its own
        out = re.sub(r"max_steps=\d+", f"max_steps={steps}", out, count=1)
    elif "SFTConfig(" in out:
        out = out.replace("SFTConfig(", f"SFTConfig(max_steps={steps}, ", 1)
    else:
        raise SystemExit("no SFTConfig( in the cell")
    return f"MODEL = {model!r}\n" + out


def run_script(stem: str, model: str, steps: int, timeout: int) -> dict:
    code = runnable(script_cell(stem), model, steps)
    with tempfile.NamedTemporaryFile("w", suffix=f"-{stem}.py", delete=False) as f:
        f.write(code)
    t0 = time.time()
    proc = subprocess.run([sys.executable, f.name], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    m = PRINTED.search(proc.stdout)
    if proc.returncode or not m:
        return dict(status="failed", seconds=round(time.time() - t0, 1), tail=(proc.stdout + proc.stderr)[-2000:])
    return dict(status="ok", seconds=round(time.time() - t0, 1), max_allocated_gib=float(m["alloc"]),
                max_reserved_gib=float(m["res"]))


def run_course(stem: str, model: str, timeout: int) -> dict:
    from course_utils.chapter import own_script
    from course_utils.measure import measure
    from course_utils.results import ResultStore

    recipe, _ = own_script.cell_recipes(script_cell(stem))
    recipe = recipe.with_(model=model)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as home:
        m = measure(recipe, store=ResultStore(Path(home) / "results.jsonl"), force=True, progress=False,
                    timeout_s=timeout, isolate=True)
    return dict(status=m.status, seconds=round(time.time() - t0, 1), label=recipe.label, recipe=recipe.to_dict(),
                max_allocated_gib=round((m.cuda_max_allocated or 0) / GIB, 3),
                max_reserved_gib=round((m.cuda_max_reserved or 0) / GIB, 3), tokens_per_s=m.tokens_per_s)


def table(lines: list[dict]) -> str:
    rows = [f"{'notebook':<28} {'script GiB alloc/res':>22} {'course GiB alloc/res':>22} {'alloc ratio':>11}"]
    for r in lines:
        s, c = r["script"], r["course"]
        ss = f"{s['max_allocated_gib']:.2f} / {s['max_reserved_gib']:.2f}" if s["status"] == "ok" else s["status"]
        cs = f"{c['max_allocated_gib']:.2f} / {c['max_reserved_gib']:.2f}" if c["status"] == "ok" else c["status"]
        ratio = f"{r['ratio']:.3f}" if r.get("ratio") else "-"
        rows.append(f"{r['notebook']:<28} {ss:>22} {cs:>22} {ratio:>11}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--notebooks", default="03,05,07")
    ap.add_argument("--model", default="smollm2-360m")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--print-only", action="store_true")
    a = ap.parse_args(argv)
    if a.print_only:
        print(table([json.loads(x) for x in Path(a.out).read_text().splitlines() if x.strip()]))
        return
    from course_utils.results import environment_record

    env = environment_record()
    lines = []
    for nb in a.notebooks.split(","):
        stem = next((ROOT / "notebooks").glob(f"{nb}_*.ipynb")).stem
        script = run_script(stem, a.model, a.steps, a.timeout)
        course = run_course(stem, a.model, a.timeout)
        ok = script["status"] == "ok" and course["status"] == "ok" and course["max_allocated_gib"]
        line = dict(notebook=stem, model=a.model, script=script, course=course,
                    ratio=round(script["max_allocated_gib"] / course["max_allocated_gib"], 4) if ok else None,
                    device=env["device"], env=env, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    command=" ".join(["scripts/gpu/own_script_check.py", *(sys.argv[1:] if argv is None else argv)]))
        lines.append(line)
        with open(a.out, "a") as f:
            f.write(json.dumps(line) + "\n")
        print(table([line]).splitlines()[-1], flush=True)
    print(table(lines))


if __name__ == "__main__":
    main()
