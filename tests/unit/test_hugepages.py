"""Moving the forkserver's preloaded memory into huge pages (``launcher.hugepages``), and
when the forkserver does it (``Forkserver._tend_pool``).

The plan and the stepping are tested on texts and a fake ``madvise``; one test
collapses a mapping of this process for real, where the kernel can.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nbddp.launcher import hugepages
from nbddp.launcher.forkserver import Forkserver
from nbddp.launcher.hugepages import Collapser, huge_page_size, plan, regions
from nbddp.launcher.pool import Pool
from nbddp.rank import pooled
from tests.unit.test_pool_keepers import add

MB2 = 2 << 20

MAPS = """\
00400000-00421000 r-xp 00000000 fd:00 123  /usr/bin/python3.11
00621000-00622000 rw-p 00021000 fd:00 123  /usr/bin/python3.11
01000000-06a00000 rw-p 00000000 00:00 0    [heap]
7f0000100000-7f0001a00000 rw-p 00000000 00:00 0
7f0002000000-7f0002100000 rw-p 00000000 00:00 0
7f0003000000-7f0004000000 rw-s 00000000 00:05 77   /dev/shm/torch_1 (deleted)
7f0005000000-7f0006000000 r--p 00000000 00:00 0
7f0007000000-7f0008000000 rw-p 00000000 00:00 0    [anon:glibc: malloc]
7f0009000000-7f000a000000 rw-p 00000000 fd:00 9    /usr/lib/libtorch_cpu.so
7ffd00000000-7ffd00800000 rw-p 00000000 00:00 0    [stack]
"""


def test_regions_are_the_huge_aligned_parts_of_private_writable_anonymous_memory() -> None:
    assert regions(MAPS, MB2) == [
        (0x01000000, 0x06A00000),  # the heap, already aligned
        (0x7F0000200000, 0x7F0001A00000),  # rounded in at both ends
    ]  # not: under one huge page, shared, read-only, named, file-backed, the stack


def test_regions_skip_lines_that_are_not_mappings() -> None:
    assert regions("\nnot a mapping at all\nzz-yy rw-p 0 00:00 0\n", MB2) == []


def thp_dir(tmp_path: Path, enabled: str, size: str = "2097152") -> Path:
    (tmp_path / "enabled").write_text(enabled + "\n")
    (tmp_path / "hpage_pmd_size").write_text(size + "\n")
    return tmp_path


@pytest.mark.parametrize(
    ("enabled", "size", "expected"),
    [
        ("always [madvise] never", "2097152", MB2),
        ("[always] madvise never", "2097152", MB2),
        ("always madvise [never]", "2097152", None),
        ("always [madvise] never", "nonsense", None),
    ],
)
def test_huge_page_size_respects_never(
    tmp_path: Path, enabled: str, size: str, expected: int | None
) -> None:
    assert huge_page_size(thp_dir(tmp_path, enabled, size)) == expected


def test_no_transparent_huge_pages_no_size(tmp_path: Path) -> None:
    assert huge_page_size(tmp_path / "absent") is None


def test_plan_reads_this_process_maps_and_the_setting(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(MAPS)
    thp = thp_dir(tmp_path, "always [madvise] never")
    made = plan({}, thp, maps)
    assert made is not None and made.huge == MB2 and len(made.regions) == 2
    assert plan({"NBDDP_HUGEPAGES": "0"}, thp, maps) is None
    assert plan({}, thp_dir(tmp_path, "always madvise [never]"), maps) is None
    maps.write_text("")
    assert plan({}, thp, maps) is None  # nothing to collapse
    assert plan({}, thp, tmp_path / "no-maps") is None  # not Linux


def test_a_bad_setting_is_named_and_left_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    maps = tmp_path / "maps"
    maps.write_text(MAPS)
    made = plan({"NBDDP_HUGEPAGES": "yes"}, thp_dir(tmp_path, "always [madvise] never"), maps)
    assert made is not None
    err = capsys.readouterr().err
    assert "NBDDP_HUGEPAGES must be 0 (off) or 1 (on), got 'yes'; using 1" in err


class FakeAdvise:
    """``madvise`` that records its calls and fails as told, per address."""

    def __init__(self, failures: dict[int, int] | None = None) -> None:
        self.calls: list[tuple[int, int]] = []
        self.failures = failures or {}

    def __call__(self, start: int, length: int) -> int:
        self.calls.append((start, length))
        return self.failures.get(start, 0)


def run_out(collapser: Collapser) -> int:
    steps = 1
    while collapser.step():
        steps += 1
    assert not collapser.step()  # done stays done, and asks the kernel nothing more
    return steps


def test_one_step_is_one_huge_page_until_every_region_is_done() -> None:
    advise = FakeAdvise()
    collapser = Collapser([(0, 3 * MB2), (10 * MB2, 11 * MB2)], MB2, advise)
    assert run_out(collapser) == 4
    assert advise.calls == [(0, MB2), (MB2, MB2), (2 * MB2, MB2), (10 * MB2, MB2)]
    assert collapser.collapsed == 4 * MB2


def test_an_ineligible_region_is_passed_over_whole_and_a_busy_page_alone() -> None:
    advise = FakeAdvise({0: errno.EINVAL, 10 * MB2: errno.EAGAIN})
    collapser = Collapser([(0, 3 * MB2), (10 * MB2, 12 * MB2)], MB2, advise)
    run_out(collapser)
    assert advise.calls == [(0, MB2), (10 * MB2, MB2), (11 * MB2, MB2)]
    assert collapser.collapsed == MB2


def test_no_memory_for_a_huge_page_ends_the_collapse() -> None:
    advise = FakeAdvise({MB2: errno.ENOMEM})
    collapser = Collapser([(0, 3 * MB2), (10 * MB2, 12 * MB2)], MB2, advise)
    assert collapser.step()
    assert not collapser.step()
    assert not collapser.step()
    assert advise.calls == [(0, MB2), (MB2, MB2)]
    assert collapser.collapsed == MB2


def _anon_huge_kb(start: int) -> int:
    """AnonHugePages of the mapping of this process that holds ``start``, in kB."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= start < hi
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError("mapping not found")


def collapse_refused() -> str | None:
    """Why this machine's kernel does not move pages into huge pages; None when it does."""
    huge = huge_page_size()
    if huge is None:
        return "no transparent huge pages on this machine"
    area = mmap.mmap(-1, 2 * huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        area.write(b"x" * len(area))
        buf = (ctypes.c_char * len(area)).from_buffer(area)
        start = -(-ctypes.addressof(buf) // huge) * huge
        del buf
        failed = hugepages.madvise_collapse(start, huge)
    finally:
        area.close()
    return None if failed == 0 else f"this kernel does not collapse pages: {os.strerror(failed)}"


def test_the_kernel_collapses_a_private_mapping_and_its_bytes_stay() -> None:
    refused = collapse_refused()
    if refused is not None:
        pytest.skip(refused)
    huge = huge_page_size()
    assert huge is not None
    size = 3 * huge  # at least one whole, aligned huge page inside, wherever it lands
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    area = mmap.mmap(-1, size, flags=flags)
    try:
        for offset in range(0, size, 4096):  # written 4 KiB page by page
            area[offset : offset + 8] = offset.to_bytes(8, "little")
        buf = (ctypes.c_char * size).from_buffer(area)
        base = ctypes.addressof(buf)
        found = regions(Path("/proc/self/maps").read_text(), huge)
        mine = [(lo, hi) for lo, hi in found if base <= lo and hi <= base + size]
        assert mine, "the mapping has a whole aligned huge page"
        collapser = Collapser(mine, huge)
        run_out(collapser)
        assert _anon_huge_kb(base) * 1024 >= collapser.collapsed
        for offset in range(0, size, 4096):
            assert int.from_bytes(area[offset : offset + 8], "little") == offset
        del buf
    finally:
        area.close()


class StepRecorder:
    """A collapse with ``left`` steps to go, each collapsing ``each`` bytes; records
    each step."""

    def __init__(self, left: int, each: int = MB2) -> None:
        self.left, self.each, self.steps, self.collapsed = left, each, 0, 0

    def step(self) -> bool:
        self.steps += 1
        self.left -= 1
        self.collapsed += self.each
        return self.left > 0


@dataclass
class Loop:
    """A forkserver past its start-up (a refill due now), the notebook's end of its
    link, and the refills it made (recorded, not forked)."""

    server: Forkserver
    notebook: socket.socket
    refills: list[int]


@pytest.fixture
def loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[Loop]:
    notebook, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    made = Forkserver(theirs)
    made.pool.resize(2, 300.0)
    made.pool.last_used -= 10.0
    made.pool.last_request -= 10.0
    refills: list[int] = []
    monkeypatch.setattr(Pool, "warm_one", lambda self, close: refills.append(1))
    yield Loop(made, notebook, refills)
    made.pool.free.clear()
    notebook.close()
    theirs.close()
    os.close(made.wake_r)
    os.close(made.wake_w)
    made.selector.close()


def test_the_collapse_goes_before_the_first_refill_and_then_lets_it_run(loop: Loop) -> None:
    collapse = StepRecorder(2)
    loop.server.collapse = collapse  # type: ignore[assignment]
    assert loop.server._timeout() == 0.0
    loop.server._tend_pool()
    assert collapse.steps == 1 and loop.refills == []
    loop.server._tend_pool()
    assert collapse.steps == 2 and loop.server.collapse is None  # done: dropped
    loop.server._tend_pool()
    assert loop.refills == [1]


def test_a_request_goes_before_the_collapse(loop: Loop) -> None:
    collapse = StepRecorder(5)
    loop.server.collapse = collapse  # type: ignore[assignment]
    loop.notebook.sendall(b"F")  # a request waits: the loop serves it first
    loop.server._tend_pool()
    assert collapse.steps == 0 and loop.refills == []


def test_keepers_forked_before_the_collapse_are_replaced_after_it(
    loop: Loop, killed: list[int]
) -> None:
    """A launch during the preload forked keepers; the collapse goes on once the
    CPU is spare, and then they are not kept: the free one ends now, the busy one
    once its rank has ended. Ones forked afterwards are kept."""
    pool = loop.server.pool
    loop.server.collapse = StepRecorder(1)  # type: ignore[assignment]
    free, busy = add(pool, 7), add(pool, 8, busy=True)
    try:
        assert loop.server._collapse_in() == 0.0
        loop.server._tend_pool()
        assert loop.server.collapse is None and killed == [7]
        busy.sendall(pooled.FREE)
        pool.heard(8, listening=True)
        assert killed == [7, 8] and not pool.free
        pool.last_used -= 10.0  # no rank has run for a while: a refill is due
        loop.server._tend_pool()
        assert loop.refills == [1]
    finally:
        free.close()
        busy.close()


def test_a_collapse_that_collapsed_nothing_keeps_the_keepers(loop: Loop, killed: list[int]) -> None:
    loop.server.collapse = StepRecorder(1, each=0)  # type: ignore[assignment]
    keeper = add(loop.server.pool, 7)
    try:
        loop.server._tend_pool()
        assert loop.server.collapse is None and killed == [] and 7 in loop.server.pool.free
    finally:
        keeper.close()
