"""Huge pages under the forkserver's preloaded memory, so that its forks and their exits are cheap.

Runs in the forkserver (``nbddp.launcher.forkserver``): ``plan`` once after
its preload, then ``Collapser.step`` one huge page at a time, while nothing
else is due.

Why: a fork copies a page-table entry for every page of the parent's
private memory, and the child's exit tears them down again. Importing
torch leaves about 150 MB of it, 38,000 entries of 4 KiB pages, so every
keeper and rank the forkserver starts pays for them twice, on the launch's
path. ``MADV_COLLAPSE`` (Linux 6.1 and later) moves pages already there
into 2 MiB huge pages, each one entry. Measured on a 2-core VM with torch
imported: a fork 3.0 ms -> 1.0 ms, from fork to reaped exit 5.3 -> 2.2 ms,
with about 120 MB collapsed; the forkserver's memory does not grow (the
collapse copies each page once and frees the small ones). A child that
writes to a huge page it shares gets only that 4 KiB page copied (the
kernel splits its own mapping; Linux 5.8 and later), so ranks use no more
memory than before: 5 MB of private pages after a gloo all_reduce, against
7 MB without.

Contract: ``plan`` returns None where there is nothing to do (turned off
with ``NBDDP_HUGEPAGES=0``; no transparent huge pages, or set to "never" by
the system's administrator; not Linux). Only the pages of private, writable,
anonymous mappings and the heap are collapsed; the mappings' own settings
are not changed, so what a rank allocates later is backed as the system's
THP setting says, as in any other process. Nothing here raises: a kernel
that cannot collapse a mapping (too old, or the mapping not eligible) leaves
it as it was. A page the forkserver shares with a child it forked before is
copied for it, not collapsed, and the child keeps the old one: the caller
replaces those children once the collapse is done (``Pool.renew``).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

MADV_COLLAPSE = 25
"""``madvise`` advice from Linux's ``<asm-generic/mman-common.h>``."""
THP = Path("/sys/kernel/mm/transparent_hugepage")


@functools.cache
def _madvise() -> Callable[[int, int, int], int]:
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def madvise_collapse(start: int, length: int) -> int:
    """``madvise(start, length, MADV_COLLAPSE)``: 0, or the errno it failed with."""
    if _madvise()(start, length, MADV_COLLAPSE) == 0:
        return 0
    return ctypes.get_errno() or errno.EINVAL


@dataclass
class Collapser:
    """What is left to collapse: ``regions`` of ``huge``-aligned addresses."""

    regions: list[tuple[int, int]]
    huge: int
    advise: Callable[[int, int], int] = madvise_collapse
    collapsed: int = field(default=0)
    """Bytes collapsed so far."""

    def step(self) -> bool:
        """Collapse the next huge page; False once nothing is left to try.

        A mapping the kernel calls ineligible (``EINVAL``: also what a kernel
        without ``MADV_COLLAPSE`` says) is passed over whole; a page it could not
        collapse for now (``EAGAIN``) is passed over; any other failure (no
        memory for a huge page) ends the collapse: it is only ever a saving."""
        if not self.regions:
            return False
        start, end = self.regions[0]
        failed = self.advise(start, self.huge)
        if failed == 0:
            self.collapsed += self.huge
        if failed not in (0, errno.EAGAIN):
            if failed != errno.EINVAL:
                self.regions.clear()
                return False
            self.regions.pop(0)
        elif start + self.huge >= end:
            self.regions.pop(0)
        else:
            self.regions[0] = (start + self.huge, end)
        return bool(self.regions)


def regions(maps: str, huge: int) -> list[tuple[int, int]]:
    """The ``huge``-aligned parts, at least one huge page long, of the private,
    writable, anonymous mappings and the heap listed in ``maps`` (the text of
    ``/proc/self/maps``). Not the stack, named anonymous memory, or files."""
    found = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5:
            continue
        span, perms = fields[0], fields[1]
        name = fields[5].strip() if len(fields) == 6 else ""
        if "w" not in perms or "p" not in perms or name not in ("", "[heap]"):
            continue
        low, _, high = span.partition("-")
        try:
            lo, hi = int(low, 16), int(high, 16)
        except ValueError:
            continue
        start = -(-lo // huge) * huge
        end = hi // huge * huge
        if end > start:
            found.append((start, end))
    return found


def huge_page_size(thp: Path = THP) -> int | None:
    """The size of a transparent huge page here; None where there are none, or
    the system's administrator set them to "never"."""
    try:
        enabled = (thp / "enabled").read_text()
        size = int((thp / "hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return None
    return None if "[never]" in enabled or size <= 0 else size


def plan(
    environ: Mapping[str, str], thp: Path = THP, maps: Path = Path("/proc/self/maps")
) -> Collapser | None:
    """The collapse of this process's memory as it is now; None when there is nothing
    to do (see module contract). ``NBDDP_HUGEPAGES``: 0 turns it off; another value
    than 0 or 1 is named on stderr and left at its default, on."""
    setting = environ.get("NBDDP_HUGEPAGES", "1").strip()
    if setting == "0":
        return None
    if setting != "1":
        print(
            f"nbddp forkserver: NBDDP_HUGEPAGES must be 0 (off) or 1 (on), got {setting!r}; "
            "using 1",
            file=sys.stderr,
        )
    huge = huge_page_size(thp)
    if huge is None:
        return None
    try:
        text = maps.read_text()
    except OSError:
        return None
    found = regions(text, huge)
    return Collapser(found, huge) if found else None
