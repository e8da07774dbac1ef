"""A real JupyterLab on localhost and a headless Chromium driven by Playwright.

``Lab`` starts ``jupyter lab`` from this interpreter (so its kernels run this
checkout's nbddp) on a free loopback port with a random token, in a fresh
root directory, with its config, data and runtime directories private to
the test (nothing from the user's own Jupyter settings leaks in), and with
the application object exposed in the page (``window.jupyterapp``) so tests
can run JupyterLab commands. ``browser()`` launches Debian's
``/usr/bin/chromium`` headless; nothing is downloaded, and the flags keep
Chromium from reaching for the network.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nbformat
import psutil

from tests.kernel.notebooks import kernel_env
from tests.procs import wait_procs_gone

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
START_TIMEOUT = 90.0
MS = 1000  # Playwright's timeouts are in milliseconds
KERNEL_IDLE = """() => {
    const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const kernel = w && w.sessionContext && w.sessionContext.session
        && w.sessionContext.session.kernel;
    return !!kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
}"""
"""Whether the open notebook's kernel is connected and idle (for ``wait_for_function``)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Lab:
    """A running JupyterLab server (see module contract)."""

    def __init__(self, root: Path, home: Path) -> None:
        self.root = root
        self.port = free_port()
        self.token = secrets.token_hex(16)
        env = kernel_env()
        env.update(
            HOME=str(home),
            JUPYTER_CONFIG_DIR=str(home / "config"),
            JUPYTER_DATA_DIR=str(home / "data"),
            JUPYTER_RUNTIME_DIR=str(home / "runtime"),
            JUPYTER_PLATFORM_DIRS="1",
        )
        # No "get notified about Jupyter news?" toast over the screenshots.
        notification = home / "settings" / "@jupyterlab" / "apputils-extension"
        notification.mkdir(parents=True)
        (notification / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
        self.log_path = home / "lab.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--allow-root",  # CI and sandboxes may run as root; the server is loopback-only
                "--ServerApp.terminals_enabled=False",
                "--LabApp.extension_manager=readonly",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={self.port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={root}",
                "--LabApp.expose_app_in_browser=True",
                f"--LabApp.workspaces_dir={home / 'workspaces'}",
                f"--LabApp.user_settings_dir={home / 'settings'}",
                "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
            ],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def notebook_url(self, name: str) -> str:
        """The notebook alone in a workspace of its own (no tabs restored from earlier)."""
        workspace = Path(name).stem
        return f"{self.url}/lab/workspaces/{workspace}/tree/{name}?token={self.token}"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        tick = threading.Event()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited: {self.log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(
                    f"{self.url}/api/status?token={self.token}", timeout=2
                ) as reply:
                    json.load(reply)
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"jupyter lab did not answer: {self.log_path.read_text()[-3000:]}"
                    ) from None
                tick.wait(0.2)

    def close(self) -> list[psutil.Process]:
        """Stop the server, which shuts its kernels down (and their ranks and
        forkservers go with them); return whatever it started that is still alive."""
        try:
            started = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            started = []
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        survivors = wait_procs_gone(started, timeout=15)
        for proc in survivors:
            proc.kill()
        return survivors


def write_notebook(path: Path, sources: list[str]) -> None:
    cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nb = nbformat.v4.new_notebook(
        cells=cells,
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )
    nbformat.write(nb, path)


@contextmanager
def lab() -> Iterator[Lab]:
    with tempfile.TemporaryDirectory(prefix="nbddp-lab-") as tmp:
        root, home = Path(tmp) / "root", Path(tmp) / "home"
        root.mkdir()
        home.mkdir()
        server = Lab(root, home)
        try:
            yield server
        finally:
            survivors = server.close()
        assert not survivors, f"the lab server left processes behind: {survivors}"


@contextmanager
def browser() -> Iterator[Any]:
    """A headless Debian Chromium under Playwright; yields the Browser."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            chromium.close()


def shot(target: Any, name: str) -> None:
    """Screenshot ``target`` (a page or a locator) into ``artifacts_dir()``; say where."""
    path = artifacts_dir() / name
    target.screenshot(path=str(path))
    print(f"screenshot: {path}")


def artifacts_dir() -> Path:
    """Where screenshots go: ``$NBDDP_ARTIFACTS`` or ``test-artifacts/browser``."""
    default = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"
    path = Path(os.environ.get("NBDDP_ARTIFACTS", default))
    path.mkdir(parents=True, exist_ok=True)
    return path
