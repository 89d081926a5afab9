"""Screenshots of the course notebooks as a learner sees them: JupyterLab 4 in headless Chromium.

Each notebook is opened with its stored outputs (nothing is executed: the kernel that JupyterLab starts
is left idle and shut down after), in a 1366 x 768 window with the file browser open (JupyterLab's
default layout), then scrolled one screen at a time; each screen is saved as
test-artifacts/screens/<notebook>-NN.png (test-artifacts/ is git-ignored).

Besides the pictures, the page itself is measured and written to test-artifacts/screens/report.json:
figures shown smaller than their own pixels (JupyterLab shrinks an image wider than the output area),
text outputs whose lines wrap or scroll sideways, tables wider than their output, and empty output areas.

    flock /tmp/cpu.lock .venv/bin/python scripts/notebooks/screenshot_notebooks.py [notebooks/03*.ipynb ...] [--rev HEAD]

Without paths: every notebook git tracks under notebooks/. By default the copies in the working tree are
shown; `--rev` takes them from a commit instead. The JupyterLab start-up is tests/jupyterlab_browser.py's
(`Lab`, the Chromium path and flags), loaded from that file.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "test-artifacts" / "screens"
VIEWPORT = {"width": 1366, "height": 768}
OVERLAP_PX = 48  # each screen repeats the bottom of the one before, so nothing is cut unseen


def _browser_helpers():
    """Lab, CHROMIUM and CHROMIUM_ARGS from the browser tests' helpers (one copy of the start-up code)."""
    spec = importlib.util.spec_from_file_location("_jupyterlab_browser", ROOT / "tests" / "jupyterlab_browser.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Lab, module.CHROMIUM, module.CHROMIUM_ARGS


def tracked_notebooks() -> list[str]:
    out = subprocess.run(["git", "ls-files", "notebooks/*.ipynb"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    return sorted(line for line in out.splitlines() if line.strip())


def copy_notebooks(paths: list[str], dest: Path, rev: str | None) -> list[Path]:
    """The notebooks (and the folder's other files, for relative links) under dest/notebooks/."""
    target = dest / "notebooks"
    target.mkdir(parents=True, exist_ok=True)
    for extra in (ROOT / "notebooks").iterdir():
        if extra.is_file() and extra.suffix != ".ipynb":
            shutil.copy(extra, target / extra.name)
    copied = []
    for rel in paths:
        name = Path(rel).name
        if rev:
            text = subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=ROOT, capture_output=True, text=True,
                                  check=True).stdout
            (target / name).write_text(text)
        else:
            shutil.copy(ROOT / rel, target / name)
        copied.append(target / name)
    return copied


def lab_settings(base: Path) -> None:
    """Render every cell at once (no windowing), so a screenshot never catches a cell still being drawn."""
    tracker = base / "lab-settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True, exist_ok=True)
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))


# Measured in the page: what the eye would have to find in the pictures.
MEASURE_JS = r"""
() => {
  const cells = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')];
  const out = {images: [], wrapped: [], wide: [], empty_outputs: [], errors: 0, tables: [], quizzes: []};
  const sc = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer');
  const top = el => Math.round(el.getBoundingClientRect().top - sc.getBoundingClientRect().top + sc.scrollTop);
  cells.forEach((cell, i) => {
    cell.querySelectorAll('.jp-OutputArea-output img').forEach(img => {
      const shown = img.getBoundingClientRect().width;
      out.images.push({cell: i, top: top(img), natural: img.naturalWidth, shown: Math.round(shown),
                       scale: img.naturalWidth ? +(shown / img.naturalWidth).toFixed(2) : null});
    });
    cell.querySelectorAll('.jp-OutputArea-output pre').forEach(pre => {
      const style = getComputedStyle(pre);
      const lh = parseFloat(style.lineHeight) || 17;
      const lines = pre.textContent.replace(/\n$/, '').split('\n');
      const rendered = Math.round(pre.getBoundingClientRect().height / lh);
      const longest = Math.max(...lines.map(l => l.length));
      if (pre.scrollWidth > pre.clientWidth + 1 || rendered > lines.length + 0.5)
        out.wrapped.push({cell: i, lines: lines.length, rendered_lines: rendered, longest_chars: longest,
                          first: lines.find(l => l.length === longest).slice(0, 80)});
    });
    cell.querySelectorAll('.jp-OutputArea-output table').forEach(t => {
      out.tables.push({cell: i, top: top(t), rows: t.rows.length});
      const area = t.closest('.jp-OutputArea-output');
      if (t.getBoundingClientRect().width > area.getBoundingClientRect().width + 1)
        out.wide.push({cell: i, table: Math.round(t.getBoundingClientRect().width),
                       area: Math.round(area.getBoundingClientRect().width)});
    });
    cell.querySelectorAll('.jp-OutputArea-output').forEach(o => {
      if (!o.textContent.trim() && !o.querySelector('img,svg,table,canvas'))
        out.empty_outputs.push({cell: i, mime: o.getAttribute('data-mime-type')});
    });
    if (/Quiz:|checklist/i.test(cell.querySelector('.jp-OutputArea') ? cell.querySelector('.jp-OutputArea').textContent.slice(0, 200) : ''))
      out.quizzes.push({cell: i, top: top(cell)});
    out.errors += cell.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]').length;
  });
  return out;
}
"""

SCROLLER = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer"


def shoot(page, lab, nb: Path, prefix: str) -> dict:
    page.goto(f"{lab.url}/lab/tree/notebooks/{nb.name}?reset&token={lab.token}", wait_until="domcontentloaded",
              timeout=90_000)
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=90_000)
    page.wait_for_selector(".jp-DirListing-content", timeout=30_000)  # the file browser, open
    page.wait_for_function("() => [...document.images].every(i => i.complete)", timeout=60_000)
    page.wait_for_timeout(2500)  # MathJax, fonts, the status bar
    for dialog in page.locator(".jp-Dialog button.jp-mod-reject").all():  # e.g. a kernel prompt
        dialog.click()
    scroller = page.locator(SCROLLER)
    # the end of the last cell (JupyterLab pads the scroll area below it with empty space)
    total, view = scroller.evaluate("""e => {
      const cells = e.querySelectorAll('.jp-Cell'), last = cells[cells.length - 1];
      const bottom = last.getBoundingClientRect().bottom - e.getBoundingClientRect().top + e.scrollTop;
      return [Math.min(e.scrollHeight, Math.ceil(bottom) + 16), e.clientHeight];
    }""")
    step = max(200, view - OVERLAP_PX)
    shots, top, n = [], 0, 1
    while True:
        scroller.evaluate(f"e => e.scrollTop = {top}")
        page.wait_for_timeout(250)
        path = OUT / f"{prefix}-{n:02d}.png"
        page.screenshot(path=str(path))
        shots.append(path.name)
        if top + view >= total:
            break
        top, n = top + step, n + 1
    report = page.evaluate(MEASURE_JS)
    for item in report["images"] + report["tables"] + report["quizzes"]:  # the first screen that shows it
        item["screen"] = min(len(shots), item["top"] // step + 1)
    report.update(screens=shots, scroll_height=total, view_height=view)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="paths under notebooks/ (default: every tracked one)")
    parser.add_argument("--rev", help="take the notebooks from this commit instead of the working tree")
    args = parser.parse_args(argv)
    paths = [str(Path(p)) for p in args.notebooks] or tracked_notebooks()

    from playwright.sync_api import sync_playwright

    Lab, chromium, chromium_args = _browser_helpers()
    OUT.mkdir(parents=True, exist_ok=True)
    reports = {}
    report_path = OUT / "report.json"
    if report_path.exists() and args.notebooks:
        reports = json.loads(report_path.read_text())
    with tempfile.TemporaryDirectory(prefix="screens-") as tmp:
        base = Path(tmp)
        lab_settings(base)
        lab = Lab(base)
        try:
            lab.wait_ready()
            copied = copy_notebooks(paths, lab.root, args.rev)
            with sync_playwright() as pw:
                context = pw.chromium.launch_persistent_context(
                    str(base / "chromium-profile"), executable_path=str(chromium), headless=True,
                    args=chromium_args, viewport=VIEWPORT)
                context.set_default_timeout(30_000)
                page = context.new_page()
                try:
                    for nb in copied:
                        prefix = nb.stem
                        for old in OUT.glob(f"{prefix}-[0-9][0-9].png"):
                            old.unlink()
                        t0 = time.monotonic()
                        reports[prefix] = shoot(page, lab, nb, prefix)
                        for s in lab.api("sessions"):  # the kernel JupyterLab started: nothing runs in it
                            lab.api(f"sessions/{s['id']}", method="DELETE")
                        r = reports[prefix]
                        print(f"{prefix}: {len(r['screens'])} screens, {len(r['images'])} figures "
                              f"(scales {[i['scale'] for i in r['images']]}), {len(r['wrapped'])} wrapping "
                              f"text outputs, {len(r['wide'])} wide tables, {len(r['empty_outputs'])} empty "
                              f"outputs, {r['errors']} stderr outputs ({time.monotonic() - t0:.0f} s)", flush=True)
                finally:
                    context.close()
        finally:
            lab.stop()
    report_path.write_text(json.dumps(reports, indent=1))
    print(f"screens and report.json in {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
