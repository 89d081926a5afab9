"""JupyterLab on localhost and headless Chromium driven by Playwright, for the browser tests
(tests/test_quiz_browser.py): the server, the browser fixture, a notebook's page and what a test reads off it.
Needs Debian's `chromium` at /usr/bin/chromium (.ci/run installs it); Playwright never downloads a browser."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",  # small /dev/shm in containers
]
ARTIFACTS = ROOT / "test-artifacts"
# JupyterLab renders a stderr stream and an error output (its traceback) with this mime type; a widget
# that fails to render leaves one of ERROR_TEXTS.
ERROR_OUTPUT = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
ERROR_TEXTS = ("Error displaying widget", "Error creating widget", "Javascript Error")
VIEWPORT = {"width": 1366, "height": 2000}  # 1366: the learner width; the answered quiz fits


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A JupyterLab server on localhost with its own config, data, runtime and root folders."""

    def __init__(self, base: Path):
        self.root = base / "root"
        self.root.mkdir()
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = base / "jupyterlab.log"
        config = base / "jupyter-config"
        (config / "labconfig").mkdir(parents=True)
        # no "get Jupyter news?" toast over the page
        (config / "labconfig" / "page_config.json").write_text(json.dumps(
            {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_DATA_DIR": str(base / "jupyter-data"),
               "JUPYTER_RUNTIME_DIR": str(base / "jupyter-runtime"), "IPYTHONDIR": str(base / "ipython"),
               "JUPYTER_PLATFORM_DIRS": "1"}
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={self.root}", f"--LabApp.user_settings_dir={base / 'lab-settings'}",
               f"--LabApp.workspaces_dir={base / 'lab-workspaces'}", "--LabApp.news_url=None"]
        if os.geteuid() == 0:  # CI containers run as root
            cmd.append("--allow-root")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.api("status")
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.3)
        raise TimeoutError(f"JupyterLab did not answer in {timeout} s:\n{self.log_tail()}")

    def wait_kernel_idle(self, timeout: float = 60, path: str | None = None) -> None:
        """Wait until the notebook's kernel is started and idle (with `path`: the kernel of that notebook's
        session; without: every kernel, and at least one)."""
        deadline = time.monotonic() + timeout
        kernels = None
        while time.monotonic() < deadline:
            try:
                if path is None:
                    kernels = self.api("kernels")
                else:
                    kernels = [s["kernel"] for s in self.api("sessions") if s.get("path") == path and s.get("kernel")]
            except urllib.error.HTTPError as e:
                # jupyter_server 2.x answers 500 while a kernel is half started (last_activity is None)
                kernels = f"HTTP {e.code}"
            else:
                if kernels and all(k["execution_state"] == "idle" for k in kernels):
                    return
            time.sleep(0.3)
        raise TimeoutError(f"the kernel was not idle in {timeout} s: {kernels}\n{self.log_tail()}")

    def stop(self) -> None:
        try:
            self.api("shutdown", method="POST")  # also shuts down the kernels it started
            self.proc.wait(timeout=20)
        except Exception:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=10)
        finally:
            self._log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium (Debian's), one context for the module's pages."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=15_000)  # a kernel's answer on a busy 2-core machine, with room to spare

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium") / "profile"), executable_path=str(CHROMIUM), headless=True,
            args=CHROMIUM_ARGS, viewport=VIEWPORT)
        context.set_default_timeout(30_000)
        try:
            yield context
        finally:
            context.close()


@contextlib.contextmanager
def notebook_page(browser, lab: Lab, notebook: str, name: str):
    """A page with `notebook` open in JupyterLab and its kernel idle. When the block fails: a screenshot in
    test-artifacts/<name>_failure.png, and the browser's console errors and the server's log printed."""
    page = browser.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
    failure = ARTIFACTS / f"{name}_failure.png"
    try:
        page.goto(f"{lab.url}/lab/tree/{notebook}?reset&token={lab.token}", wait_until="domcontentloaded",
                  timeout=60_000)
        page.wait_for_selector(".jp-Notebook .jp-CodeCell .cm-content", timeout=60_000)
        lab.wait_kernel_idle(path=notebook)  # this notebook's own kernel, not another page's
        yield page
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(failure), full_page=True)
        print("browser console errors:\n" + "\n".join(console[-20:]))
        print("JupyterLab log:\n" + lab.log_tail())
        raise
    else:
        failure.unlink(missing_ok=True)  # from an earlier failed run
    finally:
        page.close()


def shot(target, name: str) -> None:
    """A screenshot of a page or an element into test-artifacts/."""
    ARTIFACTS.mkdir(exist_ok=True)
    target.screenshot(path=str(ARTIFACTS / name))
    assert (ARTIFACTS / name).stat().st_size > 5_000


def code_cell(page, source_line: str):
    """The code cell whose source holds this line."""
    return page.locator(".jp-Notebook .jp-CodeCell").filter(
        has=page.locator(".jp-InputArea .cm-content", has_text=source_line))


def assert_no_error_output(page) -> None:
    """No error or stderr output, and no widget that failed to render, anywhere in the notebook."""
    errors = page.locator(ERROR_OUTPUT)
    assert errors.count() == 0, "error output on the page:\n" + "\n---\n".join(
        t[-1500:] for t in errors.all_text_contents())
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
    for text in ERROR_TEXTS:
        assert notebook.get_by_text(text).count() == 0, f"{text!r} on the page"


# Run All has finished: no cell queued or running ("[*]:"), and the last cell's live quiz is shown (the
# committed notebook has only its static copy) or an error stopped the run (JupyterLab then leaves the
# cells after it unrun).
RUN_ALL_DONE_JS = """
(error) => {
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')];
  if (!prompts.length || prompts.some(p => p.textContent.includes('*'))) return false;
  return document.querySelector('.course-quiz') !== null || document.querySelector(error) !== null;
}
"""


def run_all(page, timeout_s: float = 420) -> None:
    """Run > Run All Cells, then wait until it has finished (RUN_ALL_DONE_JS)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    page.wait_for_function(RUN_ALL_DONE_JS, arg=ERROR_OUTPUT, timeout=timeout_s * 1000, polling=250)
