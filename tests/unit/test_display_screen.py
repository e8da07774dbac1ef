"""The terminal model behind each rank's block: \\r, ANSI cursor moves, bounded tail."""

from __future__ import annotations

import pytest

from nbddp.display.screen import Screen, strip_cursor_codes


def shown(*chunks: str, tail: int = 40) -> list[str]:
    screen = Screen(tail)
    for chunk in chunks:
        screen.feed(chunk)
    return screen.lines()


def test_plain_lines_and_partial_line() -> None:
    assert shown("a\nb\n", "c") == ["a", "b", "c"]


def test_carriage_return_overwrites_the_line() -> None:
    assert shown("hello\rHE\n") == ["HEllo"]
    assert shown("10%\r", "20%\r", "100%\n") == ["100%"]


def test_carriage_return_split_across_chunks() -> None:
    assert shown("abc", "\r", "X", "\n") == ["Xbc"]


def test_tqdm_like_redraws_end_as_one_line() -> None:
    chunks = [f"\r{i:3d}%|{'#' * (i // 10):<10}| {i}/100" for i in range(101)]
    assert shown(*chunks, "\n") == ["100%|##########| 100/100"]


def test_cursor_up_redraws_an_earlier_line() -> None:
    # tqdm's nested bars: position 1 is drawn one line down, then the cursor goes back up.
    outer = "\router 1/2"
    inner = "\n\rinner 5/5\x1b[A"
    assert shown(outer, inner, "\router 2/2", inner) == ["outer 2/2", "inner 5/5"]


def test_erase_in_line_and_backspace() -> None:
    assert shown("abcdef\r\x1b[K", "xy\n") == ["xy"]
    assert shown("abc\x08\x08Z\n") == ["aZc"]
    assert shown("abcdef\x1b[3D\x1b[1K!\n") == ["   !ef"]
    assert shown("abcdef\x1b[2KX\n") == ["      X"]


def test_colours_and_titles_are_dropped() -> None:
    assert shown("\x1b[31mred\x1b[0m \x1b]0;title\x07ok\n") == ["red ok"]


def test_escape_split_across_chunks_is_held() -> None:
    assert shown("abc\x1b[", "31mdef\n") == ["abcdef"]
    assert shown("ab\x1b", "[Dc\n") == ["ac"]


def test_tail_is_bounded_and_counts_what_scrolled_out() -> None:
    screen = Screen(tail=5)
    screen.feed("".join(f"line {i}\n" for i in range(1000)))
    assert screen.lines() == [f"line {i}" for i in range(995, 1000)]
    assert screen.total == 1000
    assert screen.hidden == 995


def test_tail_bounded_line_by_line_too() -> None:
    screen = Screen(tail=3)
    for i in range(100):
        screen.feed(f"{i}\n")
        assert len(screen._lines) <= 2 * 3 + 1  # memory stays bounded
    assert screen.lines() == ["97", "98", "99"]
    assert screen.total == 100


def test_cursor_cannot_leave_the_kept_lines() -> None:
    assert shown("a\nb\n", "\x1b[99Atop\n", tail=2) == ["top", "b"]


def test_other_stream_starts_a_new_line_after_an_unfinished_one() -> None:
    screen = Screen()
    screen.feed("\r 50%|#####", "stderr")
    screen.feed("epoch 1\n", "stdout")
    assert screen.lines() == [" 50%|#####", "epoch 1"]


def test_a_stream_goes_back_to_its_own_unfinished_line() -> None:
    # tqdm on stderr, prints on stdout: the bar redraws in place and ends as one line.
    screen = Screen()
    screen.feed("\r 50%|#####", "stderr")
    screen.feed("epoch 1\n", "stdout")
    screen.feed("\r 75%|#######", "stderr")
    screen.feed("epoch 2\nepoch 3\n", "stdout")
    screen.feed("\r100%|##########\n", "stderr")
    screen.feed("done\n", "stdout")
    assert screen.lines() == ["100%|##########", "epoch 1", "epoch 2", "epoch 3", "done"]


def test_after_going_back_the_next_lines_go_below_everything() -> None:
    screen = Screen()
    screen.feed("progress", "stderr")
    screen.feed("a\nb\n", "stdout")
    screen.feed(" more\nwarning 1\nwarning 2\n", "stderr")
    assert screen.lines() == ["progress more", "a", "b", "warning 1", "warning 2"]


def test_an_unfinished_line_that_scrolled_out_is_not_gone_back_to() -> None:
    screen = Screen(tail=2)
    screen.feed("\r10%", "stderr")
    screen.feed("".join(f"line {i}\n" for i in range(10)), "stdout")
    screen.feed("\r100%\n", "stderr")
    assert screen.lines() == ["line 9", "100%"]


def test_other_stream_after_a_finished_line_continues_normally() -> None:
    screen = Screen()
    screen.feed("out\n", "stdout")
    screen.feed("err\n", "stderr")
    assert screen.lines() == ["out", "err"]


def test_tail_must_be_positive() -> None:
    with pytest.raises(ValueError, match="tail"):
        Screen(0)


def test_strip_cursor_codes_keeps_colours() -> None:
    assert strip_cursor_codes("a\x1b[A\x1b[2Kb\x1b[1mc") == "ab\x1b[1mc"
    assert strip_cursor_codes("plain") == "plain"
