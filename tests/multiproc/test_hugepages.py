"""The forkserver moves its preloaded memory into huge pages before it fills its pool,
and the ranks it forks run on them, using no more memory of their own for it.

Each test starts a forkserver of its own (``NBDDP_HUGEPAGES`` is read when it
starts) and waits for its pool (``tests.procs.wait_pool``): the collapse comes
before the first refill. Skipped where this kernel does not collapse pages.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import nbddp
from nbddp.launcher.config import first_pool
from nbddp.launcher.starters import FORKSERVER
from tests.multiproc import fns
from tests.procs import wait_pool
from tests.unit.test_hugepages import collapse_refused

pytestmark = pytest.mark.skipif(collapse_refused() is not None, reason=str(collapse_refused()))


def anon_huge_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError(f"no AnonHugePages for {pid}")


def started_forkserver(monkeypatch: pytest.MonkeyPatch, setting: str) -> int:
    """A new forkserver with ``NBDDP_HUGEPAGES=setting``, once its pool is full; its pid."""
    monkeypatch.setenv("NBDDP_HUGEPAGES", setting)
    FORKSERVER.close()
    FORKSERVER.prewarm()
    pid = FORKSERVER.pid
    assert pid is not None
    size, _ = first_pool(os.environ)
    wait_pool(pid, size, timeout=60)  # the import, the collapse, then the refill
    return pid


@pytest.fixture
def fresh() -> Iterator[None]:
    yield
    FORKSERVER.close()  # the next test's forkserver starts with the default again


def test_the_forkserver_and_its_ranks_run_on_huge_pages_with_no_more_private_memory(
    monkeypatch: pytest.MonkeyPatch, fresh: None
) -> None:
    without = started_forkserver(monkeypatch, "0")
    assert anon_huge_kb(without) == 0
    small = nbddp.launch(fns.memory_after_all_reduce, procs=2, output="none")

    forkserver = started_forkserver(monkeypatch, "1")
    assert anon_huge_kb(forkserver) >= 32 * 1024  # most of torch's import: about 100 MB
    huge = nbddp.launch(fns.memory_after_all_reduce, procs=2, output="none")

    assert small["AnonHugePages"] == 0
    assert huge["AnonHugePages"] > 0  # inherited, and what the rank did not write stays so
    # A write to a shared huge page copies 4 KiB, not 2 MiB: the rank's own pages
    # are about as many as without (5 MB against 7 measured); 2 MiB copies of
    # every page it writes would be tens of MB more.
    assert huge["Private_Dirty"] <= small["Private_Dirty"] + 4 * 1024


def test_a_launch_before_the_collapse_gets_keepers_renewed_after_it(
    monkeypatch: pytest.MonkeyPatch, fresh: None
) -> None:
    """A script, or a first cell, that launches right after ``import nbddp``: the request
    comes while the forkserver still imports torch, so its ranks' keepers are forked
    before the collapse. Once the forkserver has collapsed in the pause that
    follows, those keepers are replaced by ones forked from the collapsed memory."""
    monkeypatch.setenv("NBDDP_HUGEPAGES", "1")
    FORKSERVER.close()
    first = nbddp.launch(fns.pid_and_keeper, procs=2, output="none", block=False).wait()
    forkserver = FORKSERVER.pid
    assert forkserver is not None
    old_keepers = {pids[1] for pids in first.values.values()}
    size, _ = first_pool(os.environ)
    idle = wait_pool(forkserver, size, timeout=60)
    assert anon_huge_kb(forkserver) >= 32 * 1024
    assert not {p.ppid() for p in idle} & old_keepers  # replaced, not kept
    later = nbddp.launch(fns.memory_after_all_reduce, procs=2, output="none")
    assert later["AnonHugePages"] > 0
