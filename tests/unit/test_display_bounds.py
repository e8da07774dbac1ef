"""Nothing a rank writes can make a display raise or grow without bound.

Cursor moves to huge columns, escape sequences with thousands of digits or no
end, lines of megabytes without a newline: the ``Screen`` (kernel blocks and
the panel) and the text display keep every line within their width, say how
much more is in the log, and take the bytes in linear time.
"""

from __future__ import annotations

import io
import time

from nbddp.display.screen import Screen
from nbddp.display.text import LineAssembler, TextDisplay

MARK = "more characters in the log"


def test_the_escape_sequences_seen_to_break_a_run_give_short_lines() -> None:
    screen = Screen()
    screen.feed("\x1b[1000000000000C")  # raised MemoryError
    screen.feed("x\n\x1b[10000000Cy\n")  # made a 10,000,001-character line
    assert [len(line) for line in screen.lines()] == [screen.width, screen.width]


def test_a_cursor_move_to_a_huge_column_stops_at_the_width() -> None:
    screen = Screen(tail=5, width=80)
    screen.feed("a\x1b[1000000000000Cb\nc\x1b[10000000Cd\n")
    first, second = screen.lines()
    assert first == "a" + " " * 78 + "b"
    assert second == "c" + " " * 78 + "d"


def test_a_column_with_thousands_of_digits_is_clamped_not_parsed() -> None:
    screen = Screen(tail=5, width=80)
    screen.feed("e\x1b[" + "9" * 5000 + "Gf\n")
    screen.feed("g\x1b[" + "9" * 5000 + "Ah\n")
    # Up by 10**5000 lines stops at the first kept line; column 10**5000 at the last column.
    assert screen.lines() == ["eh" + " " * 77 + "f", "g"]


def test_a_line_longer_than_the_width_is_cut_and_says_how_much_more_there_is() -> None:
    screen = Screen(tail=5, width=100)
    screen.feed("x" * 1000 + "\nshort\n" + "y" * 250)
    assert screen.lines() == [
        "x" * 100 + f" … 900 {MARK}",
        "short",
        "y" * 100 + f" … 150 {MARK}",
    ]


def test_a_cut_line_names_the_log_it_is_in() -> None:
    screen = Screen(tail=5, width=10, where="/logs/rank0.log")
    screen.feed("z" * 30)
    assert screen.lines() == ["z" * 10 + " … 20 more characters in /logs/rank0.log"]


def test_a_redrawn_bar_wider_than_the_width_counts_its_length_not_its_redraws() -> None:
    screen = Screen(tail=5, width=10)
    for i in range(100):
        screen.feed(f"\r{i:02d}" + "#" * 28)
    assert screen.lines() == ["99" + "#" * 8 + f" … 20 {MARK}"]


def test_erasing_a_cut_line_forgets_what_was_cut() -> None:
    screen = Screen(tail=5, width=10)
    screen.feed("q" * 30 + "\r\x1b[Kfresh\n")
    assert screen.lines() == ["fresh"]


def test_cut_lines_keep_their_marks_as_the_tail_scrolls() -> None:
    screen = Screen(tail=3, width=10)
    screen.feed("".join(f"{i:03d}" + "w" * 20 + "\n" for i in range(50)))
    for i in range(50, 60):
        screen.feed(f"{i:03d}" + "w" * 20 + "\n")
        screen.feed("short\n")
    lines = screen.lines()
    assert lines == ["short", "059" + "w" * 7 + f" … 13 {MARK}", "short"]


def test_fifty_megabytes_without_a_newline_take_linear_time() -> None:
    screen = Screen(tail=40)
    chunk = "0123456789" * 6554  # about 64 KiB, as the relay reads
    start = time.perf_counter()
    for _ in range(800):
        screen.feed(chunk)
    seconds = time.perf_counter() - start
    (line,) = screen.lines()
    assert line.startswith("0123456789" * 10)
    assert line.endswith(f" … {800 * len(chunk) - screen.width:,} {MARK}")
    # Quadratic copying of the unfinished line took minutes here; linear takes milliseconds.
    assert seconds < 5, f"{seconds:.1f} s"


def test_an_escape_sequence_that_never_ends_is_not_held_forever() -> None:
    screen = Screen(tail=5, width=50)
    screen.feed("\x1b]0;")
    for _ in range(200):
        screen.feed("t" * 65536)
    screen.feed("\nafter\n")
    lines = screen.lines()
    assert lines[-1] == "after"
    assert all(len(line) <= 50 + len(f" … 99,999,999 {MARK}") for line in lines)


def test_the_text_display_cuts_long_lines_and_names_the_log(tmp_path: object) -> None:
    out = io.StringIO()
    display = TextDisplay(out=out, err=io.StringIO(), width=20)
    display.attach(tmp_path, 1)  # type: ignore[arg-type]
    display.output(0, "stdout", "a" * 50 + "\nok\n")
    display.output(0, "stdout", "b" * 30)
    display.close()
    log = f"{tmp_path}/rank0.log"
    assert out.getvalue().splitlines() == [
        f"[rank 0] {'a' * 20} … 30 more characters in {log}",
        "[rank 0] ok",
        f"[rank 0] {'b' * 20} … 10 more characters in {log}",
    ]


def test_the_text_display_takes_a_50mb_line_in_linear_time() -> None:
    lines = LineAssembler(width=100)
    chunk = "0123456789" * 6554
    start = time.perf_counter()
    for _ in range(800):
        assert lines.feed(0, "stdout", chunk) == []
    done = lines.feed(0, "stdout", "\n")
    seconds = time.perf_counter() - start
    assert done == ["0123456789" * 10 + f" … {800 * len(chunk) - 100:,} {MARK}"]
    assert seconds < 5, f"{seconds:.1f} s"


def test_the_text_display_keeps_a_long_bar_bounded_and_redrawn() -> None:
    lines = LineAssembler(width=10)
    for i in range(1000):
        lines.feed(0, "stderr", f"\r{i:04d}" + "#" * 20)
    assert lines.progress() == [(0, "stderr", "0999" + "#" * 6 + f" … 14 {MARK}")]
    assert lines.feed(0, "stderr", "\n") == ["0999" + "#" * 6 + f" … 14 {MARK}"]


def test_the_text_display_redraws_the_start_of_a_cut_line() -> None:
    lines = LineAssembler(width=10)
    lines.feed(0, "stdout", "a" * 30 + "\rb")
    lines.feed(0, "stdout", "c")
    assert lines.drain() == [(0, "stdout", "bc" + "a" * 8 + f" … 20 {MARK}")]
