"""The last lines of a rank's log: ``run.last_lines``."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbddp.launcher.run import last_lines


@pytest.mark.parametrize(
    ("text", "count", "expected"),
    [
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc", 2, b"b\nc"),
        (b"a\nb\n", 5, b"a\nb\n"),
        (b"a\nb\n", 0, b""),
        (b"", 3, b""),
    ],
)
def test_last_lines(tmp_path: Path, text: bytes, count: int, expected: bytes) -> None:
    path = tmp_path / "log"
    path.write_bytes(text)
    assert last_lines(path, count) == expected


def test_last_lines_reads_across_blocks(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"".join(f"line {i}\n".encode() for i in range(1000)))
    assert last_lines(path, 3, block=16) == b"line 997\nline 998\nline 999\n"
