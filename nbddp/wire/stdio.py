"""A rank's ``sys.stderr`` travels in its stdout pipe, marked, so that what it printed and
what it drew on stderr (a tqdm bar) arrive in the order written.

``StderrInStdout`` (rank) is ``sys.stderr``'s raw stream: each write goes to fd 1 as
``BEGIN + bytes + END`` in one ``os.write`` (whole beside other writers up to ``PIPE_BUF``);
``fileno()`` stays fd 2, the stderr pipe, for C-level writers (faulthandler), whose order
against Python's writes is not kept. ``Demux`` (relay) splits a stdout pipe's bytes back into
``(stream, bytes)`` pieces, a marker cut across reads included.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

BEGIN = b"\x1b]nbddp;stderr\x07"  # OSC sequences: a terminal shows neither
END = b"\x1b]nbddp;stdout\x07"


class StderrInStdout(io.RawIOBase):
    """``sys.stderr``'s raw stream in a rank (see the module's contract)."""

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return 2

    def write(self, data: ReadableBuffer) -> int:
        chunk = bytes(data)
        frame = memoryview(BEGIN + chunk + END)
        while frame:
            frame = frame[os.write(1, frame) :]
        return len(chunk)


class Demux:
    """Splits the bytes of a rank's stdout pipe into its two streams."""

    def __init__(self) -> None:
        self._stream = "stdout"
        self._held = b""  # the start of a marker, cut off by the end of a read

    def feed(self, data: bytes) -> list[tuple[str, bytes]]:
        """The ``(stream, bytes)`` pieces of ``data``, in order, markers left out."""
        data, self._held, pieces = self._held + data, b"", []
        while data:
            mark = BEGIN if self._stream == "stdout" else END
            at = data.find(mark)
            if at < 0:
                cut = max((n for n in range(1, len(mark)) if data.endswith(mark[:n])), default=0)
                data, self._held = data[: len(data) - cut], data[len(data) - cut :]
                at = len(data)
            if at:
                pieces.append((self._stream, data[:at]))
            if at == len(data):
                break
            data = data[at + len(mark) :]
            self._stream = "stderr" if mark is BEGIN else "stdout"
        return pieces

    def end(self) -> list[tuple[str, bytes]]:
        """What is held at the end of the pipe (the start of a marker that never finished)."""
        held, self._held = self._held, b""
        return [(self._stream, held)] if held else []
