"""The quiz in a real browser: JupyterLab on localhost, driven in headless Chromium by Playwright.

It runs a notebook cell that shows the gradient-checkpointing quiz, picks a wrong answer, checks it,
then the right one, and reads the feedback and the score off the page. The screenshot is saved in the
test's tmp_path and copied to test-artifacts/quiz_browser.png (the first question after the wrong
answer: quiz_browser_wrong.png; test-artifacts/ is git-ignored).

Needs Debian's `chromium` (.ci/run installs it: apt-get install chromium); Playwright drives that
binary and never downloads a browser. Skipped, with the reason, when /usr/bin/chromium is missing.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest

from course_utils.quiz import _plain, load_bank

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",  # small /dev/shm in containers
]
BANK = "01_gradient_checkpointing"
QUIZ_CELL = f'from course_utils.quiz import show_quiz; show_quiz("{BANK}")'
ARTIFACT = ROOT / "test-artifacts" / "quiz_browser.png"

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's Chromium at /usr/bin/chromium (apt-get update && apt-get install -y chromium; .ci/run does)",
)


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

    def wait_kernel_idle(self, timeout: float = 60) -> None:
        """Wait until the notebook's kernel is started and idle."""
        deadline = time.monotonic() + timeout
        kernels = None
        while time.monotonic() < deadline:
            try:
                kernels = self.api("kernels")
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


@pytest.fixture
def lab(tmp_path):
    server = Lab(tmp_path)
    try:
        server.wait_ready()
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(QUIZ_CELL)]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
        nbformat.write(nb, server.root / "quiz.ipynb")
        yield server
    finally:
        server.stop()


def test_quiz_in_jupyterlab_in_headless_chromium(lab, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    question = load_bank(BANK).questions[0]
    assert question.type == "single"
    right = question.right_choices[0]
    wrong = next(i for i, c in enumerate(question.choices) if not c.correct)
    total = len(load_bank(BANK))
    shot = tmp_path / "quiz_browser.png"
    console: list[str] = []

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 1800})
        context.set_default_timeout(30_000)
        page = context.new_page()
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
        try:
            page.goto(f"{lab.url}/lab/tree/quiz.ipynb?reset&token={lab.token}", wait_until="domcontentloaded",
                      timeout=60_000)
            page.wait_for_selector(".jp-Notebook .jp-CodeCell .cm-content", timeout=60_000)
            lab.wait_kernel_idle()

            # run the quiz cell
            page.locator(".jp-CodeCell .cm-content").first.click()
            page.keyboard.press("Shift+Enter")
            first = page.locator(".course-quiz .course-quiz-question").first
            first.wait_for(state="visible", timeout=60_000)

            # a wrong answer, then Check
            first.locator("label", has_text=_plain(question.choices[wrong].text)).click()
            first.locator("button.course-quiz-check").click()
            feedback = first.locator(".course-quiz-feedback")
            expect(feedback).to_contain_text("Not quite")
            expect(feedback).to_contain_text(_plain(question.choices[wrong].explanation)[:60])
            expect(page.locator(".course-quiz-score")).to_contain_text(f"Score: 0/{total}")
            first.screenshot(path=str(tmp_path / "quiz_browser_wrong.png"))

            # the right answer, then Check
            first.locator("label", has_text=_plain(question.choices[right].text)).click()
            first.locator("button.course-quiz-check").click()
            expect(feedback).to_contain_text("Correct!")
            expect(feedback).to_contain_text(_plain(question.choices[right].explanation)[:60])
            expect(page.locator(".course-quiz-score")).to_contain_text(f"Score: 1/{total}")
            expect(first.locator("button.course-quiz-again")).to_be_visible()

            page.locator(".course-quiz").scroll_into_view_if_needed()
            page.screenshot(path=str(shot))
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"))
            ARTIFACT.parent.mkdir(exist_ok=True)
            shutil.copy(tmp_path / "failure.png", ARTIFACT.with_name("quiz_browser_failure.png"))
            print("browser console errors:\n" + "\n".join(console[-20:]))
            print("JupyterLab log:\n" + lab.log_tail())
            raise
        finally:
            context.close()

    assert shot.stat().st_size > 10_000
    ARTIFACT.parent.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACT)
    shutil.copy(tmp_path / "quiz_browser_wrong.png", ARTIFACT.with_name("quiz_browser_wrong.png"))
    ARTIFACT.with_name("quiz_browser_failure.png").unlink(missing_ok=True)  # from an earlier failed run
