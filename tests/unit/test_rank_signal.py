"""Stopping a rank reaches it even in the moment after its fork, before it leads its own
process group (a stop right after a launch, on a loaded machine)."""

from __future__ import annotations

import signal
import subprocess

from nbddp.launcher.core import RankRecord


def test_a_rank_not_yet_leading_its_group_is_still_signalled() -> None:
    # A child in this process's group, as a rank is between its fork and its setsid.
    child = subprocess.Popen(["sleep", "60"])
    try:
        record = RankRecord(rank=0, pid=child.pid)
        assert record.signal(signal.SIGTERM)  # was False: killpg found no such group
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()
