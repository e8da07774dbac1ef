"""Text display: whole lines, rank prefixes, carriage returns handled as a terminal does."""

from __future__ import annotations

import io

from nbddp.display.text import LineAssembler, TextDisplay, apply_carriage_returns


def test_carriage_return_overwrites_like_a_terminal() -> None:
    assert apply_carriage_returns("10%\r20%\r30%") == "30%"
    assert apply_carriage_returns("abcdef\rXY") == "XYcdef"
    assert apply_carriage_returns("plain") == "plain"
    assert apply_carriage_returns("done\r") == "done"


def test_lines_are_assembled_per_rank_and_stream() -> None:
    lines = LineAssembler()
    assert lines.feed(0, "stdout", "hel") == []
    assert lines.feed(1, "stdout", "other\n") == ["other"]
    assert lines.feed(0, "stdout", "lo\nwor") == ["hello"]
    assert lines.drain() == [(0, "stdout", "wor")]


def test_display_writes_prefixed_whole_lines_and_flushes_partials_on_close() -> None:
    out, err = io.StringIO(), io.StringIO()
    display = TextDisplay(out, err)
    display.output(0, "stdout", "a\nb")
    display.output(1, "stderr", "warn\n")
    display.output(1, "stdout", " 50%\r100%\n")
    assert out.getvalue() == "[rank 0] a\n[rank 1] 100%\n"
    display.close()
    assert out.getvalue().endswith("[rank 0] b\n")
    assert err.getvalue() == "[rank 1] warn\n"


def test_display_for_rank0_only_skips_other_ranks() -> None:
    out = io.StringIO()
    display = TextDisplay(out, io.StringIO(), ranks={0})
    display.output(1, "stdout", "hidden\n")
    display.output(0, "stdout", "shown\n")
    assert out.getvalue() == "[rank 0] shown\n"
