"""The relay reports a rank's last messages before its exit, however its fds were resting."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

from nbddp.forkserver.keeper import STATUS
from nbddp.launcher.relay import RankPipes, Relay
from nbddp.wire import protocol


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.changed = threading.Condition()

    def _add(self, event: tuple[str, Any]) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()

    def on_output(self, rank: int, stream: str, text: str) -> None:
        self._add(("output", text))

    def on_message(self, rank: int, kind: str, body: Any) -> None:
        self._add(("message", kind))

    def on_link_closed(self, rank: int, unsent: list[str]) -> None:
        self._add(("link_closed", unsent))

    def on_exit(self, rank: int, code: int | None) -> None:
        self._add(("exit", code))

    def on_closed(self, rank: int) -> None:
        self._add(("closed", None))

    def wait_for(self, event: tuple[str, Any]) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: event in self.events, timeout=10)


def test_an_error_sent_just_before_exiting_is_reported_before_the_exit(tmp_path: Path) -> None:
    for _ in range(20):  # the race it guards against needed the fds to be resting
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        status_r, status_w = os.pipe()
        ours, theirs = socket.socketpair()
        sink = Recorder()
        relay = Relay(tmp_path, sink)
        relay.attach(0, RankPipes(out_r, err_r, ours, status_r))
        # Traffic first, so that the relay reads and then rests every fd.
        theirs.sendall(protocol.encode("state", "running"))
        os.write(out_w, b"step\n")
        sink.wait_for(("message", "state"))
        sink.wait_for(("output", "step\n"))
        # Then what a failing rank does last: report its error, exit.
        theirs.sendall(protocol.encode("error", None))
        os.write(out_w, b"last words\n")
        for fd in (out_w, err_w):
            os.close(fd)
        theirs.close()
        os.write(status_w, STATUS.pack(1))
        os.close(status_w)
        sink.wait_for(("closed", None))
        kinds = [e for e in sink.events if e[0] != "link_closed"]
        assert ("link_closed", []) in sink.events
        assert kinds.index(("message", "error")) < kinds.index(("exit", 1)), kinds
        assert kinds.index(("output", "last words\n")) < kinds.index(("exit", 1)), kinds


def test_a_line_cut_by_a_read_is_logged_whole_beside_the_other_pipe(tmp_path: Path) -> None:
    # The relay reads a rank's two pipes separately: what it reads of stderr while
    # the stdout pipe still holds the rest of a line must not land inside that line.
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    status_r, status_w = os.pipe()
    ours, theirs = socket.socketpair()
    sink = Recorder()
    relay = Relay(tmp_path, sink)
    relay.attach(0, RankPipes(out_r, err_r, ours, status_r))
    os.write(out_w, b"line 0\nline 1\nli")  # a read ends inside line 2
    sink.wait_for(("output", "line 0\nline 1\nli"))
    os.write(err_w, b"last words on fd 2\n")
    sink.wait_for(("output", "last words on fd 2\n"))
    os.write(out_w, b"ne 2\nline 3")
    for fd in (out_w, err_w):
        os.close(fd)
    theirs.close()
    os.write(status_w, STATUS.pack(0))
    os.close(status_w)
    sink.wait_for(("closed", None))
    lines = relay.log_path(0).read_text().splitlines()
    assert [ln for ln in lines if ln.startswith("line ")] == [f"line {i}" for i in range(4)]
    assert "last words on fd 2" in lines
