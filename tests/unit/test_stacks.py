"""The rank's stack text: the user's frames first, nbddp's own threads named, not shown."""

from __future__ import annotations

import threading

from nbddp.rank import errors as stacks
from nbddp.rank.errors import format_stacks


def _park(ready: threading.Event, release: threading.Event) -> None:
    ready.set()
    release.wait()


def test_the_main_thread_comes_first_and_nbddp_threads_are_only_named() -> None:
    ready, release = threading.Event(), threading.Event()
    mine = threading.Thread(target=_park, args=(ready, release), name="user-loader")
    # A thread of nbddp's own: everything it runs is in the package (Event.wait
    # is threading.py's, which counts as launching code).
    own = threading.Thread(target=release.wait, name="nbddp-link")
    mine.start()
    own.start()
    ready.wait()
    try:
        text = format_stacks(3)
    finally:
        release.set()
        mine.join()
        own.join()
    assert text.startswith("nbddp: rank 3 (pid ")
    threads = [line for line in text.splitlines() if line.startswith("Thread ")]
    assert threads[0] == "Thread 'MainThread':"
    assert "Thread 'user-loader':" in threads
    assert "Thread 'nbddp-link':" not in threads
    assert text.rstrip().endswith("(nbddp's own threads, not shown: nbddp-link)")
    loader = text.split("Thread 'user-loader':\n")[1]
    # threading's bootstrap frames are cut: the first frame is the user's target.
    assert loader.splitlines()[0].endswith("in _park")


def test_a_stack_with_no_user_frame_is_shown_whole() -> None:
    import sys

    frame = sys._getframe()
    frames, users = stacks.user_frames(frame)
    assert users and frames[-1].name == "test_a_stack_with_no_user_frame_is_shown_whole"

    import unittest.mock

    with unittest.mock.patch.object(stacks, "_launches", lambda _: True):
        whole, users = stacks.user_frames(frame)
    assert not users and len(whole) > len(frames)
