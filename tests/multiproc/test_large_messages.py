"""Messages to a rank arrive whole whatever their size: answers to its prompts, a
session's cells and their arguments."""

from __future__ import annotations

import hashlib
import os

import pytest

import nbddp
from tests.answers import MB, SIZES, answer_with, expected, line_of
from tests.multiproc import fns


def test_answers_of_1_16_and_64_mb_reach_the_ranks_input_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = [line_of(size) for size in SIZES]
    answer_with(monkeypatch, lines)
    got = nbddp.launch(fns.read_lines, len(lines), procs=1, output="none", timeout=60)
    assert [(n, sha) for n, sha, _ in got] == expected(lines)
    for size, (_, _, took) in zip(SIZES, got, strict=True):
        print(f"answer of {size // MB} MB on one machine: {took:.2f}s")


def test_session_cells_with_1_and_64_mb_of_arguments_reach_the_ranks_whole() -> None:
    with nbddp.session(procs=2, output="none") as session:
        for size in (MB, 64 * MB):
            data = os.urandom(size)
            want = (size, hashlib.sha256(data).hexdigest())
            assert session.run(fns.length_and_sha256, data) == want
