"""``NOTEBOOK_FDS``: what a forked rank must close, consistent while the fork happens."""

from __future__ import annotations

import threading

from nbddp.launcher.fds import NotebookFds


def test_kept_fds_are_listed_until_released() -> None:
    fds = NotebookFds()
    fds.keep(5, 6)
    fds.keep(7)
    fds.release(6)
    fds.release(42)  # never kept: nothing to do
    with fds.frozen() as kept:
        assert kept == {5, 7}


def test_no_fd_is_kept_or_released_while_frozen() -> None:
    fds = NotebookFds()
    fds.keep(3)
    done = threading.Event()

    def keep_more() -> None:
        fds.keep(4)
        done.set()

    with fds.frozen() as kept:
        thread = threading.Thread(target=keep_more)
        thread.start()
        # The other thread must wait for the block to end (a fork in it copies
        # exactly ``kept``).
        assert not done.wait(0.2)
        assert kept == {3}
    thread.join(5.0)
    with fds.frozen() as after:
        assert after == {3, 4}
