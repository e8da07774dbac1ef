"""A script that imports nbddp and never launches exits at once, quietly, and leaves
no forkserver behind; the background warm-up still runs where it helps."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from tests.procs import wait_procs_gone

REPO = Path(__file__).resolve().parents[2]
IMPORT_AND_EXIT = textwrap.dedent(
    """
    import sys, time
    import nbddp
    from nbddp.launcher.forkserver_link import FORKSERVER
    time.sleep(float(sys.argv[1]))
    print(FORKSERVER.pid, flush=True)
    """
)
# Makes the forkserver's start hang (as a slow torch import would, for longer): an
# exit that waited for the forkserver would wait for this.
SLOW_FORKSERVER = textwrap.dedent(
    """
    import os, time
    if os.environ.get("NBDDP_ROLE") == "forkserver":
        time.sleep(600)
    """
)
EXIT_BOUND = 3.0  # seconds; waiting for the forkserver to start takes at least 5 (its timeout)


def python(args: list[str], extra_path: Path | None = None) -> subprocess.Popen[str]:
    paths = [str(p) for p in (extra_path, REPO) if p is not None]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    env.pop("NBDDP_PREWARM", None)
    return subprocess.Popen(
        [sys.executable, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def assert_gone(pid: int) -> None:
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    survivors = wait_procs_gone([proc], timeout=0.5)  # reaped by now, or a zombie orphan
    for left in survivors:
        left.kill()
    assert not survivors, f"the forkserver {pid} outlived the script"


def test_the_exit_does_not_wait_for_a_forkserver_that_is_still_starting(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(SLOW_FORKSERVER)
    proc = python(["-c", IMPORT_AND_EXIT, "0"], extra_path=tmp_path)
    assert proc.stdout is not None and proc.stderr is not None
    pid = int(proc.stdout.readline())  # the script's last line: from here on it exits
    exiting = time.monotonic()
    try:
        proc.wait(timeout=30)
    finally:
        proc.kill()
    took = time.monotonic() - exiting
    assert proc.returncode == 0, proc.stderr.read()
    assert_gone(pid)
    assert took < EXIT_BOUND, f"the exit took {took:.1f} s: it waited for the forkserver"


def test_an_exit_during_the_warm_up_is_quiet_and_leaves_no_forkserver() -> None:
    # 0: the forkserver is still importing torch; 1: it is part-way through.
    for pause in ("0", "1"):
        done = subprocess.run(
            [sys.executable, "-c", IMPORT_AND_EXIT, pause],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""  # e.g. no "Exception ignored in: <finalize object ...>"
        assert_gone(int(done.stdout))


def test_the_store_support_warms_up_in_an_interactive_session_only() -> None:
    show = "import threading, nbddp; print([t.name for t in threading.enumerate()])\n"
    script = python(["-c", show])
    interactive = python(["-i", "-q"])
    out, err = script.communicate(timeout=60)
    assert script.returncode == 0, err
    assert "nbddp-prewarm" not in out  # a script gets no head start from it, only a slow exit
    out, err = interactive.communicate(show, timeout=60)
    assert interactive.returncode == 0, err
    assert "nbddp-prewarm" in out
