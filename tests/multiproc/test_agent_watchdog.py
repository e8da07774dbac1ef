"""A node's agent ends itself once the notebook's polls stop, even while one of its
threads holds the GIL (seen under Ray: a garbage collection blocked in Ray's code for
as long as Ray's own 30 s clean-up of a lost Ray Client driver)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).parents[2]

AGENT = textwrap.dedent(
    """
    import re, sys
    import nbddp.agent.node as node

    node._prewarm = lambda: None  # no forkserver: this agent runs nothing
    node.QUIET = 1.0

    class Agent(node.NodeAgent):
        def node_address(self):
            return "127.0.0.1"

    agent = Agent()
    agent.poll(0.0)  # the notebook's last poll
    print("polled", flush=True)
    # Native code that holds the GIL for minutes: no Python thread runs meanwhile.
    re.match(r"(a+)+$", "a" * 40 + "b")
    print("not ended", flush=True)
    """
)


def test_an_agent_whose_polls_stop_ends_itself_while_a_thread_holds_the_gil() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", AGENT],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    )
    took = time.monotonic() - started
    assert done.stdout == "polled\n", done.stdout + done.stderr
    assert done.returncode == 1, done.stderr
    assert "Timeout" in done.stderr  # the stacks of what held the agent are in its log
    print(f"agent ended {took:.1f}s after it started (quiet after 1s)")
