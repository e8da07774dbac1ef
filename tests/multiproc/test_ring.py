"""Rank output through the shared-memory rings, on 2 gloo CPU ranks.

Each test also gets the leftover-process check (tests/conftest.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

import nbddp
from nbddp import ring

pytestmark = pytest.mark.skipif(not ring.enabled(), reason="rings are used on x86-64 only")


def stream_types() -> dict[str, str]:
    return {
        "stdout": type(sys.stdout.buffer).__name__,
        "stderr": type(sys.stderr.buffer).__name__,
        "fileno": f"{sys.stdout.fileno()},{sys.stderr.fileno()}",
    }


def flood(lines: int) -> int:
    """Far more than a ring holds, as fast as print goes: the writer must wait, not drop."""
    for i in range(lines):
        print(f"flood {i:09d} {'y' * 100}")
    return lines


def python_then_c(_: Any = None) -> None:
    print("python first", file=sys.stderr)
    os.write(2, b"c second\n")
    print("python third", file=sys.stderr, flush=True)


def forked_child_prints() -> str:
    # A DataLoader worker is a fork of the rank that inherits sys.stdout.
    print("parent before", flush=True)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        print("from the forked child", flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    print("parent after", flush=True)
    return "ok"


def test_python_output_goes_through_the_ring_and_fds_stay_the_pipes() -> None:
    value = nbddp.launch(stream_types, procs=2, output="none")
    assert value == {"stdout": "RingWriter", "stderr": "RingWriter", "fileno": "1,2"}


def test_a_flood_larger_than_the_ring_arrives_whole_and_in_order() -> None:
    lines = 3 * ring.CAPACITY // 116  # three rings' worth of 116-byte lines per rank
    run = nbddp.launch(flood, lines, procs=2, block=False, output="none")
    assert run.wait().values == {0: lines, 1: lines}
    for rank in (0, 1):
        got = run.output(rank).splitlines()
        assert len(got) == lines
        assert got[0].startswith("flood 000000000 ")
        assert all(line.startswith(f"flood {i:09d} ") for i, line in enumerate(got))


def test_python_output_before_c_output_keeps_its_order() -> None:
    # The relay drains a stream's ring before reading its pipe: a traceback
    # printed before a crash dump stays before it.
    run = nbddp.launch(python_then_c, procs=2, block=False, output="none")
    run.wait()
    for rank in (0, 1):
        lines = run.output(rank).splitlines()
        assert lines.index("python first") < lines.index("c second")
        assert "python third" in lines


def test_a_forked_child_writes_to_the_pipe_beside_its_parent() -> None:
    run = nbddp.launch(forked_child_prints, procs=2, block=False, output="none")
    assert run.wait().values == {0: "ok", 1: "ok"}
    for rank in (0, 1):
        lines = run.output(rank).splitlines()
        assert lines.index("parent before") < lines.index("parent after")
        # Its own line, whole: the child writes whole lines to the pipe. (Its
        # place relative to "parent after" is not fixed: see nbddp.ring, Order.)
        assert "from the forked child" in lines


def test_with_rings_off_output_takes_the_pipes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBDDP_RING", "0")
    value = nbddp.launch(stream_types, procs=2, output="none")
    assert value["stdout"] == "BufferedWriter"
    run = nbddp.launch(flood, 1000, procs=2, block=False, output="none")
    run.wait()
    assert len(run.output(1).splitlines()) == 1000
