"""A rank's stderr inside its stdout pipe: split back exactly, however the reads cut it."""

from __future__ import annotations

import random

from nbddp.wire.stdio import BEGIN, END, Demux


def merged(pieces: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for stream, data in pieces:
        if out and out[-1][0] == stream:
            out[-1] = (stream, out[-1][1] + data)
        elif data:
            out.append((stream, data))
    return out


def test_pieces_come_back_in_order_across_any_cut_of_the_reads() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        written = [
            (
                rng.choice(("stdout", "stderr")),
                bytes(rng.choices(b"ab\x1b]\x07\n", k=rng.randint(1, 6))),
            )
            for _ in range(rng.randint(1, 8))
        ]
        raw = b"".join(BEGIN + data + END if s == "stderr" else data for s, data in written)
        demux, got, at = Demux(), [], 0
        while at < len(raw):
            step = rng.randint(1, 20)
            got += demux.feed(raw[at : at + step])
            at += step
        got += demux.end()
        assert merged(got) == merged(written)


def test_a_marker_cut_short_at_the_end_of_the_pipe_is_kept_as_text() -> None:
    demux = Demux()
    assert demux.feed(b"done" + BEGIN[:5]) == [("stdout", b"done")]
    assert demux.end() == [("stdout", BEGIN[:5])]
