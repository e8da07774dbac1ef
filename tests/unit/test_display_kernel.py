"""The kernel display's logic, with a fake publisher and a fake clock (no IPython)."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest

from nbddp.display.blocks import STATE_COLORS
from nbddp.display.kernel import KernelDisplay
from nbddp.launcher.events import RankState


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakePublisher:
    """Records blocks as a notebook would hold them."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, str]] = []
        self.messages = 0
        self.cell_token: object = 1

    def show(self, bundle: dict[str, str]) -> Any:
        self.blocks.append(bundle)
        self.messages += 1
        return len(self.blocks) - 1

    def update(self, handle: Any, bundle: dict[str, str]) -> None:
        self.blocks[handle] = bundle
        self.messages += 1

    def cell(self) -> object:
        return self.cell_token

    def plain(self) -> list[str]:
        return [b["text/plain"] for b in self.blocks]


def make(**kwargs: Any) -> tuple[KernelDisplay, FakePublisher, Clock]:
    clock, publisher = Clock(), FakePublisher()
    display = KernelDisplay(clock=clock, publisher=publisher, err=io.StringIO(), **kwargs)
    display.attach(Path("/runs/x"), 2)
    return display, publisher, clock


def test_blocks_in_rank_order_with_header() -> None:
    display, pub, clock = make()
    display.state(1, "running")
    display.output(1, "stdout", "hello from 1\n")
    clock.now += 3.2
    display.refresh()
    assert pub.plain() == ["rank 0 · starting · 3s", "rank 1 · running · 3s\nhello from 1"]
    assert "<pre" in pub.blocks[1]["text/html"]


def test_updates_are_rate_limited_and_nothing_is_lost_at_close() -> None:
    display, pub, clock = make(interval=0.1)
    display.refresh()
    first = pub.messages
    for i in range(100_000):
        display.output(0, "stdout", f"line {i}\n")
        if i % 100 == 0:
            clock.now += 0.001  # 100k lines in one simulated second
            display.refresh()
    display.state(0, "done")
    display.state(1, "done")
    display.close()
    assert pub.messages - first <= 12
    assert pub.plain()[0].splitlines()[-1] == "line 99999"
    assert "99,960 earlier lines in /runs/x/rank0.log" in pub.plain()[0]


def test_refresh_says_when_to_come_back() -> None:
    display, _, clock = make(interval=0.1)
    display.refresh()
    display.output(0, "stdout", "x\n")
    assert display.refresh() == pytest.approx(0.1)  # dirty, limited: retry when allowed
    clock.now += 0.1
    wait = display.refresh()
    assert wait is not None and wait <= 1.0  # running: the elapsed time ticks
    for rank in (0, 1):
        display.state(rank, "done")
    clock.now += 0.1
    display.refresh()
    assert display.refresh() is None  # all ended, all drawn


def test_unchanged_blocks_are_not_redrawn() -> None:
    display, pub, clock = make()
    for rank in (0, 1):
        display.state(rank, "done")
    display.refresh()
    before = pub.messages
    for _ in range(10):
        clock.now += 1.0
        display.refresh()
    assert pub.messages == before


def test_tqdm_bar_redraws_in_place() -> None:
    display, pub, _ = make()
    for i in range(101):
        display.output(0, "stderr", f"\r{i:3d}%|{'#' * (i // 10):<10}|")
    display.output(0, "stderr", "\n")
    display.close()
    assert pub.plain()[0].splitlines()[1:] == ["100%|##########|"]


def test_output_rank0_and_none_show_headers_only_for_hidden_ranks() -> None:
    display, pub, _ = make(live={0})
    display.output(0, "stdout", "zero\n")
    display.output(1, "stdout", "one\n")
    display.close()
    assert pub.plain() == ["rank 0 · starting · 0s\nzero", "rank 1 · starting · 0s"]
    display, pub, _ = make(live=set())
    display.output(0, "stdout", "zero\n")
    display.close()
    assert pub.plain() == ["rank 0 · starting · 0s", "rank 1 · starting · 0s"]


def test_metrics_in_header_and_chart_block() -> None:
    display, pub, _clock = make(chart_interval=0.5)
    for step in range(50):
        display.metric(0, {"rank": 0, "step": step, "time": 0.0, "loss": 1 / (step + 1)})
    display.refresh()
    assert pub.plain()[0] == "rank 0 · starting · 0s · step 49 loss=0.02"
    assert pub.plain()[2] == "metrics rank 0: step 49 loss=0.02"
    assert "<svg" in pub.blocks[2]["text/html"]
    display.close()
    assert "step 49" in pub.plain()[2]


def test_the_headers_metric_is_the_last_drawn_charts() -> None:
    display, pub, clock = make(interval=0.1, chart_interval=0.5)

    def log(step: int) -> None:
        display.metric(0, {"rank": 0, "step": step, "time": 0.0, "loss": 1 / (step + 1)})

    for step in range(60):  # six seconds of a row every 0.1 s, a refresh after each
        log(step)
        display.refresh()
        clock.now += 0.1
        header = pub.plain()[0].split("\n")[0]
        chart = pub.plain()[2]
        assert header.endswith(chart.removeprefix("metrics rank 0: ")), (header, chart)
    log(60)
    display.close()  # the final frame has the final chart, and headers that agree
    assert pub.plain()[0].endswith("step 60 loss=0.01639")
    assert pub.plain()[2] == "metrics rank 0: step 60 loss=0.01639"


def test_new_cell_gets_new_blocks() -> None:
    display, pub, clock = make()
    display.output(0, "stdout", "a\n")
    display.refresh()
    assert len(pub.blocks) == 2
    pub.cell_token = 2  # run.wait() again in another cell
    clock.now += 1
    display.refresh()
    assert len(pub.blocks) == 4
    assert pub.plain()[2].endswith("\na")


def test_html_is_escaped() -> None:
    display, pub, _ = make()
    display.output(0, "stdout", "<script>alert(1)</script>\n")
    display.close()
    assert "<script>alert" not in pub.blocks[0]["text/html"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pub.blocks[0]["text/html"]


def test_notice_before_the_run_is_shown_goes_to_stderr() -> None:
    err = io.StringIO()
    display = KernelDisplay(publisher=FakePublisher(), err=err)
    display.notice("port 29500 busy")
    assert err.getvalue() == "nbddp: port 29500 busy\n"


def test_a_rank_at_a_prompt_reads_as_waiting_in_a_colour_of_its_own() -> None:
    display, pub, _ = make()
    display.state(0, "running")
    display.state(1, "waiting for input")
    display.output(1, "stdout", "(Pdb) ")
    display.close()
    running, waiting = pub.blocks[0]["text/html"], pub.blocks[1]["text/html"]
    assert pub.plain()[1].startswith("rank 1 · waiting for input · ")
    assert 'data-state="waiting for input"' in waiting
    colour = re.search(r"color:(#[0-9a-f]{6})", waiting)
    assert colour is not None and "color:" not in running
    assert colour.group(1) not in {STATE_COLORS[s] for s in RankState if s.ended}


def opened(bundle: dict[str, str]) -> bool:
    """Whether a block's tail shows unfolded."""
    match = re.search(r"<details [^>]*>", bundle["text/html"])
    assert match is not None, bundle
    return match.group(0).endswith(" open>")


def test_live_output_shows_unfolded_and_a_long_finished_tail_folds() -> None:
    display, pub, clock = make(tail=40)
    for rank in (0, 1):
        display.state(rank, "running")
        display.output(rank, "stdout", "".join(f"line {i}\n" for i in range(100)))
    clock.now += 1
    display.refresh()
    assert [opened(b) for b in pub.blocks] == [True, True]  # running: the tail is in view
    assert pub.plain()[0].splitlines()[-1] == "line 99" and len(pub.plain()[0].splitlines()) <= 42
    # In view, a running rank's last lines only: a page of them would push the rest away.
    shown = re.search(r"<pre[^>]*>(.*)</pre>", pub.blocks[0]["text/html"], re.S)
    assert shown is not None and shown.group(1).split("\n") == [f"line {i}" for i in range(90, 100)]
    assert "last 10 of 100 lines; all in" in pub.blocks[0]["text/html"]
    display.state(0, "done")
    display.state(1, "failed")
    display.close()
    assert [opened(b) for b in pub.blocks] == [False, True]  # done folds; failed stays open
    assert "last 40 of 100 lines" in pub.blocks[0]["text/html"]  # the whole tail, once ended


def test_a_debugging_transcript_stays_open_after_the_rank_continues() -> None:
    display, pub, _ = make()
    display.state(1, "running")
    display.state(1, "waiting for input")
    display.output(1, "stdout", "".join(f"(Pdb) p {i}\n{i}\n" for i in range(10)))
    display.refresh()
    assert opened(pub.blocks[1])
    display.state(1, "running")
    display.output(1, "stdout", "done\n")
    display.state(1, "done")
    display.close()
    assert opened(pub.blocks[1]) and pub.plain()[1].endswith("(Pdb) p 9\n9\ndone")


def test_a_failed_ranks_block_names_its_log() -> None:
    display, pub, _ = make()
    display.output(1, "stdout", "about to fail\n")
    display.state(0, "done")
    display.state(1, "failed")
    display.close()
    assert "full output in /runs/x/rank1.log" in pub.blocks[1]["text/html"]
    assert "rank0.log" not in pub.blocks[0]["text/html"]  # a rank that did not fail: no note
