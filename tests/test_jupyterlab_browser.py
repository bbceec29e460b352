"""JupyterLab, the interactive interface the package promises, opened in a real browser.

The test starts the venv's `jupyter lab` on a free loopback port with a token, in a temporary
root holding a copy of notebook 01, opens the notebook's URL in headless Chromium (over the
DevTools protocol, tests/browser.py) and checks that the page shows the notebook: its tab,
its title heading rendered from the first markdown cell, and the stored output of its last
code cell rendered as a `.jp-OutputArea-output` with the same text; then, through the REST
API, that the page asked the server for a kernel session for it, and that the page logged no
console error. JupyterLab renders headless here, so the REST-only fallback the issue allows
is not needed. The server is shut down through /api/shutdown (which stops its kernels), then
its whole process tree and Chromium's are stopped and the temporary folders removed, on
every exit path.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.browser import CHROMIUM, NO_CHROMIUM, free_port, headless_chromium, stop_tree
from tests.conftest import NOTEBOOKS

NOTEBOOK = "01_sizing_endurance.ipynb"
TITLE_START = "01 · Sizing, endurance"
LAB_CONFIG = {"LabApp": {"news_url": None, "extension_manager": "readonly",
                         "check_for_updates_class": "jupyterlab.NeverCheckForUpdate"}}
"""Nothing fetched from the internet: no news feed, no PyPI extension listing, no update
check."""


@dataclass
class Lab:
    """A running JupyterLab: its base URL, token, root folder and log file."""

    url: str
    token: str
    root: Path
    log: Path

    def api(self, path: str, method: str = "GET") -> object:
        """JSON from the server's REST API (token in the Authorization header)."""
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            body = reply.read()
        return json.loads(body) if body else None


def _wait_ready(lab: Lab, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n"
                               f"{lab.log.read_text()[-3000:]}")
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
            lab.api("/api/status")
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"jupyter lab not ready in {timeout_s} s:\n"
                               f"{lab.log.read_text()[-3000:]}")
        time.sleep(0.3)


def _environment(work: Path) -> dict[str, str]:
    """Config, runtime, settings and workspaces in the temporary folder: the user's own
    JupyterLab state is neither read nor changed."""
    config = work / "config"
    config.mkdir()
    (config / "jupyter_lab_config.json").write_text(json.dumps(LAB_CONFIG))
    return {**os.environ, "JUPYTER_CONFIG_DIR": str(config),
            "JUPYTER_RUNTIME_DIR": str(work / "runtime"),
            "JUPYTERLAB_SETTINGS_DIR": str(work / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(work / "workspaces"),
            "IPYTHONDIR": str(work / "ipython")}


@pytest.fixture
def lab() -> Iterator[Lab]:
    """`jupyter lab --no-browser` on a free loopback port, rooted at a temporary folder with
    a copy of notebook 01; stopped with its kernels and removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="kvrepro-lab-") as tmp:
        work = Path(tmp)
        root = work / "root"
        root.mkdir()
        shutil.copy(NOTEBOOKS / NOTEBOOK, root / NOTEBOOK)
        port, token = free_port(), secrets.token_hex(16)
        lab = Lab(f"http://127.0.0.1:{port}", token, root, work / "jupyter.log")
        args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
                f"--port={port}", "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
                *(["--allow-root"] if os.geteuid() == 0 else [])]  # containers run as root
        with open(lab.log, "wb") as log:
            proc = subprocess.Popen(args, cwd=root, env=_environment(work), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        try:
            _wait_ready(lab, proc, timeout_s=30)
            yield lab
        finally:
            with contextlib.suppress(OSError):
                lab.api("/api/shutdown", method="POST")  # stops the kernels it started
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            stop_tree(proc)


def _stored_output_text() -> str:
    """The text of the notebook's last stored output, read from the .ipynb itself."""
    cells = json.loads((NOTEBOOKS / NOTEBOOK).read_text(encoding="utf-8"))["cells"]
    outputs = [o for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert outputs, f"{NOTEBOOK} has no stored output to look for"
    text = outputs[-1].get("text") or outputs[-1].get("data", {}).get("text/plain", "")
    return " ".join("".join(text).split())


# Scrolls the notebook to its end (a windowed notebook renders cells as they come into view)
# and returns the rendered h1 headings, output texts and the current tab's label once all exist.
_RENDERED = """(() => {
  const panel = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer');
  if (panel) panel.scrollTop = panel.scrollHeight;
  const norm = e => e.textContent.replace(/\\s+/g, ' ').trim();
  const h1 = [...document.querySelectorAll('.jp-Notebook .jp-RenderedMarkdown h1')].map(norm);
  const outputs = [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')]
    .map(norm).filter(t => t);
  const tab = document.querySelector(
    '.lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel');
  return h1.length && outputs.length && tab ? {h1, outputs, tab: norm(tab)} : null;
})()"""


def _sessions_for(lab: Lab, timeout_s: float) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        sessions = [s for s in lab.api("/api/sessions") if s["path"].endswith(NOTEBOOK)]
        if sessions or time.monotonic() > deadline:
            return sessions
        time.sleep(0.5)


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_jupyterlab_shows_notebook_01(lab: Lab) -> None:
    expected_output = _stored_output_text()
    with tempfile.TemporaryDirectory(prefix="kvrepro-chromium-") as tmp:
        with headless_chromium(Path(tmp), height=1000) as page:
            page.navigate(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}", timeout_s=40)
            shown = page.wait_for(_RENDERED, timeout_s=40)
            errors = page.console_errors()
            sessions = _sessions_for(lab, timeout_s=15)  # while the page is open
    assert shown, (f"JupyterLab did not render {NOTEBOOK} in 40 s; console errors: "
                   f"{errors}; server log:\n{lab.log.read_text()[-2000:]}")
    assert shown["h1"][0].startswith(TITLE_START), shown["h1"]
    assert shown["tab"] == NOTEBOOK, shown["tab"]
    assert any(expected_output[:200] in text for text in shown["outputs"]), (
        expected_output[:200], shown["outputs"])
    assert sessions and sessions[0]["kernel"]["name"] == "python3", sessions
    assert errors == [], errors  # e.g. a kernel that failed to start logs one
