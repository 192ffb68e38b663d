"""Fixtures for the browser tests: a throwaway JupyterLab on 127.0.0.1 and a headless Chromium.

The notebooks are copied to a temporary folder first, so running them never touches the
committed ones. Chromium and its driver come from the system (Debian: `chromium` and
`chromium-driver`, which `make test` installs when it can); nothing is downloaded at run time.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
HOW_TO_RUN = ("the browser tests need Chromium and its driver: as root on Debian or Ubuntu, `make "
              "test` installs them (apt-get install chromium chromium-driver); elsewhere install "
              "both, then run `make test` or `.venv/bin/python -m pytest tests/browser`")


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (make setup installs it)"
    for name, path in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)):
        if not (path and os.access(path, os.X_OK)):
            return f"{name} was not found"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _missing()
    if reason is None:
        return
    browser_items = [item for item in items if "tests/browser" in str(item.fspath)]
    if browser_items:
        line = f"BROWSER TESTS SKIPPED: {reason}; {HOW_TO_RUN}"
        print(f"\n{'!' * 8} {line}", file=sys.stderr)
        for item in browser_items:
            item.add_marker(pytest.mark.skip(reason=line))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Lab:
    """A JupyterLab server over a temporary copy of notebooks/."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.token = os.urandom(16).hex()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        scratch = Path(tempfile.mkdtemp(prefix="minicb-lab-"))
        settings = scratch / "settings" / "@jupyterlab" / "notebook-extension"
        settings.mkdir(parents=True)
        # render every cell (JupyterLab 4 otherwise only renders the cells in view)
        (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
        news = scratch / "settings" / "@jupyterlab" / "apputils-extension"
        news.mkdir(parents=True)
        (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(scratch / "config"),
                   JUPYTER_RUNTIME_DIR=str(scratch / "runtime"),
                   JUPYTERLAB_SETTINGS_DIR=str(scratch / "settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(scratch / "workspaces"))
        self.log = scratch / "lab.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
             "--ip=127.0.0.1", f"--port={self.port}", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={folder}", "--LabApp.news_url=",
             "--ServerApp.open_browser=False",
             # window.jupyterapp: a chapter that is only looked at opens in the page already
             # loaded (JupyterLab's own open command), not in a fresh load of the whole app
             "--LabApp.expose_app_in_browser=True"],
            env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                self.api("GET", "/api/status")
                return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError("JupyterLab did not start within 60 s; its log: "
                           f"{self.log.read_text()[-2000:]}")

    def api(self, method: str, path: str):
        request = urllib.request.Request(self.url + path, method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shut_down_kernels(self) -> None:
        for session in self.api("GET", "/api/sessions"):
            self.api("DELETE", f"/api/sessions/{session['id']}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """JupyterLab over a copy of notebooks/ (each .ipynb with its .md pair) that sits where the
    real one does: the rest of the repository is linked beside it, so the chapters' relative
    paths (../scripts, ../benchmarks) resolve as they do for a reader."""
    root = tmp_path_factory.mktemp("repository")
    for entry in ROOT.iterdir():
        if entry.name not in ("notebooks", ".git", ".venv") and not entry.name.startswith(".venv"):
            (root / entry.name).symlink_to(entry)
    (root / "notebooks").mkdir()
    # each notebook with its jupytext text file, as a reader's clone has them (jupytext's
    # JupyterLab extension opens the pair)
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        for path in (notebook, notebook.with_suffix(".md")):
            if path.exists():
                shutil.copy(path, root / "notebooks" / path.name)
    server = Lab(root / "notebooks")
    yield server
    server.stop()


def start_chromium(console_log: bool = False):
    """A headless Chromium under chromedriver; with `console_log`, the page's console messages
    can be read with driver.get_log("browser")."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                     "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                     f"--user-data-dir={tempfile.mkdtemp(prefix='minicb-chromium-')}",
                     "--window-size=1400,1000"):
        options.add_argument(argument)
    if console_log:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.fixture(scope="session")
def browser():
    driver = start_chromium()
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def console_browser():
    """A headless Chromium whose console messages the test reads (driver.get_log("browser"))."""
    driver = start_chromium(console_log=True)
    yield driver
    driver.quit()
