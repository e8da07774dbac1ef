"""File descriptors that travel beside a message's bytes, and the values that carry them.

``Descriptors`` holds fds in order: on the sending side the objects they belong to stay alive
(``keep``) until sent; on the receiving side (``owned``) it closes them when closed or dropped.
It never pickles itself (``protocol.encode_with_fds`` sends its fds). ``OwnedFd``: one fd a
payload owns; ``memfd_with(data)``: a memory file holding ``data``; ``Packed``: a value on its
way (bytes, type name, shared memory). Only the standard library is imported here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass


class Descriptors:
    """File descriptors travelling beside a message, in order (see module doc); on the
    receiving side ``missing`` counts those sent that never arrived (its open-file limit)."""

    def __init__(
        self,
        fds: Sequence[int] = (),
        *,
        keep: Sequence[object] = (),
        owned: bool = False,
        missing: int = 0,
    ) -> None:
        self.fds = tuple(fds)
        self.keep = tuple(keep)
        self.owned = owned
        self.missing = missing

    def close(self) -> None:
        """Close owned descriptors now (the mappings made from them keep their own)."""
        fds, self.fds = self.fds, ()
        self.keep = ()
        if self.owned:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def __del__(self) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.fds) + self.missing

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("Descriptors travel beside a message (encode_with_fds), not inside it")


class OwnedFd:
    """A descriptor the payload owns: closed when the payload is dropped."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


@dataclass(frozen=True)
class Packed:
    """A value as a rank sends it: bytes, its type's name, the shared memory they refer to."""

    data: bytes
    """The value pickled, large data referred to by position in ``fds``."""
    type_name: str
    """The value's qualified type, for messages about it."""
    fds: Descriptors
    """The shared memory the bytes refer to."""


def memfd_with(data: bytes | memoryview, name: str = "nbddp") -> int:
    """A fresh memory file holding ``data``; the caller owns the descriptor."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view, done = memoryview(data), 0
        while done < len(view):
            done += os.write(fd, view[done : done + (1 << 26)])
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_all(fd: int, size: int) -> bytes:
    """The first ``size`` bytes of the regular file ``fd`` (fewer if it is shorter)."""
    parts, done = [], 0
    while done < size:
        chunk = os.pread(fd, min(size - done, 1 << 26), done)
        if not chunk:
            break
        parts.append(chunk)
        done += len(chunk)
    return b"".join(parts)
