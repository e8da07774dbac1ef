"""Where a run's logs go, one directory per run, how many old runs are kept, and reading them.

Contract: ``new_run_dir(run_id)`` makes a run's private directory (mode 0700)
``run-<run_id>-<random>`` in the base directory (``NBDDP_LOG_DIR``, else ``$TMPDIR/nbddp-<uid>/``),
holds an exclusive ``flock`` on it while the run goes (``RunDir.release()``), then prunes the base
directory to ``NBDDP_LOG_KEEP`` runs and ``NBDDP_LOG_MAX_MB`` megabytes, oldest first, never a run
still going (locked, or written to in the last ``RECENT`` seconds) and never anything but ``run-*``
directories. ``rank_log(log_dir, rank)`` is the one place that names a rank's log; ``RankLogs``
appends to them, ``read_rank_log`` and ``last_lines`` read them.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from nbddp.errors import ConfigError
from nbddp.launcher import settings
from nbddp.launcher.fds import NOTEBOOK_FDS

RECENT = 60.0  # seconds: a run written to this recently may still be going
RUN_PREFIX = "run-"

_fallback: dict[Path, Path] = {}  # our private base instead of one we must not use
_quiet_until: dict[Path, float] = {}  # base -> time.time() before which no run there is removable


def run_base_dir(chosen: Path | None = None) -> Path:
    """Where run directories go: ``chosen`` (``NBDDP_LOG_DIR``), else the default; made if new."""
    if chosen is not None:
        return _chosen_dir(chosen)
    base = Path(tempfile.gettempdir()) / f"nbddp-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    info = base.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        # Someone else made it, or it is open to others: do not write logs there.
        # One private directory for this process, so its runs are pruned together.
        if base not in _fallback:
            _fallback[base] = Path(tempfile.mkdtemp(prefix="nbddp-"))
        base = _fallback[base]
    return base


def _chosen_dir(base: Path) -> Path:
    fix = "set NBDDP_LOG_DIR to a directory of yours, or unset it for $TMPDIR/nbddp-<uid>"
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"NBDDP_LOG_DIR='{base}' is not a directory; {fix}") from None
    except OSError as exc:
        raise ConfigError(
            f"NBDDP_LOG_DIR='{base}' cannot be made ({exc.strerror}); {fix}"
        ) from None
    if base.stat().st_uid != os.getuid():
        raise ConfigError(f"NBDDP_LOG_DIR='{base}' is not yours; {fix}")
    return base


class RunDir:
    """A run's log directory, locked while the run goes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        # A rank forked from the notebook must not hold the lock on after the run.
        NOTEBOOK_FDS.keep(self._fd)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh directory: never held

    def release(self) -> None:
        """The run has ended: its directory may be pruned from now on."""
        fd, self._fd = self._fd, None
        if fd is not None:
            NOTEBOOK_FDS.release(fd)
            os.close(fd)

    def __del__(self) -> None:
        # A run that never ended (its start failed) releases its lock with the job.
        try:
            self.release()
        except Exception:  # at interpreter exit, module globals may already be gone
            pass


def new_run_dir(run_id: str, environ: Mapping[str, str] | None = None) -> RunDir:
    """Make and lock a new run's directory, then prune old ones."""
    chosen = settings.read(environ)
    base = run_base_dir(chosen.log_dir)
    run = RunDir(Path(tempfile.mkdtemp(prefix=f"{RUN_PREFIX}{run_id}-", dir=base)))
    if time.time() >= _quiet_until.get(base, 0.0):
        prune(base, chosen.log_keep, chosen.log_max_bytes)
    return run


def prune(base: Path, keep: int, max_bytes: int, now: float | None = None) -> list[Path]:
    """Remove the oldest run directories of ``base`` beyond ``keep`` runs and
    ``max_bytes`` in all, skipping those still going; return what was removed."""
    now = time.time() if now is None else now
    runs = sorted(_survey(base), key=lambda run: run[1])  # oldest first
    count, total = len(runs), sum(size for _, _, size in runs)
    removed = []
    for path, last_write, size in runs:
        if count <= keep and total <= max_bytes:
            break
        if last_write > now - RECENT or not _remove_unless_locked(path):
            continue
        removed.append(path)
        count, total = count - 1, total - size
    # The oldest run left can be removed RECENT seconds after its last write at the
    # earliest; newer ones later still (a lock only delays it more).
    left = [last_write for path, last_write, _ in runs if path not in removed]
    _quiet_until[base] = min(left, default=now) + RECENT
    return removed


def _survey(base: Path) -> list[tuple[Path, float, int]]:
    """Each run directory of ``base``: (path, time of its last write, bytes it holds)."""
    runs = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.startswith(RUN_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            last_write, size = _tree_stats(entry.path, entry.stat(follow_symlinks=False).st_mtime)
        except OSError:
            continue  # removed meanwhile, or not ours to read: leave it
        runs.append((Path(entry.path), last_write, size))
    return runs


def _tree_stats(path: str, last_write: float) -> tuple[float, int]:
    """(latest of ``last_write`` and every file's mtime, bytes in all) under ``path``;
    ``os.scandir``, not ``os.walk``, whose bookkeeping was most of a launch's time here."""
    size = 0
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                sub_write, sub_size = _tree_stats(entry.path, last_write)
                last_write, size = max(last_write, sub_write), size + sub_size
            else:
                info = entry.stat(follow_symlinks=False)
                last_write, size = max(last_write, info.st_mtime), size + info.st_size
    return last_write, size


def _remove_unless_locked(path: Path) -> bool:
    """Remove ``path`` unless a run holds its lock; True when it was removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # a run is still going there
        # Holding its lock while removing: a second pruner skips it.
        shutil.rmtree(path, ignore_errors=True)
        return not path.exists()
    finally:
        os.close(fd)


def rank_log(log_dir: Path, rank: int) -> Path:
    """The file that keeps everything ``rank`` wrote."""
    return log_dir / f"rank{rank}.log"


def open_rank_log(log_dir: Path, rank: int) -> int:
    """An fd appending to ``rank``'s log (made private, 0600, if new)."""
    return os.open(rank_log(log_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


class RankLogs:
    """Appends to the logs of a run's ranks, each opened on its first write."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._fds: dict[int, int] = {}

    def write(self, rank: int, text: str) -> None:
        """Append ``text`` to ``rank``'s log."""
        fd = self._fds.get(rank)
        if fd is None:
            fd = self._fds[rank] = open_rank_log(self.log_dir, rank)
        os.write(fd, text.encode("utf-8", "backslashreplace"))

    def close(self) -> None:
        """Close every log opened."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)


def read_rank_log(log_dir: Path, rank: int, world_size: int, tail: int | None = None) -> str:
    """The text of ``rank``'s log in ``log_dir`` (all of it, or its last ``tail``
    lines; empty before the rank wrote anything). ``ValueError`` for a rank
    outside ``0 .. world_size - 1`` or a ``tail`` below 0, saying which."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r}: this run's ranks are 0 to {world_size - 1}")
    if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
        raise ValueError(f"tail={tail!r}: give a number of lines (0 or more), or None")
    path = rank_log(log_dir, rank)
    try:
        data = path.read_bytes() if tail is None else last_lines(path, tail)
    except FileNotFoundError:
        return ""
    return data.decode("utf-8", "replace")


def last_lines(path: Path, count: int, block: int = 1 << 16) -> bytes:
    """The last ``count`` lines of the file ``path`` (a line: up to and with its
    newline; the last may have none), read from its end."""
    if count == 0:
        return b""
    with path.open("rb") as file:
        end = file.seek(0, 2)
        start, data = end, b""
        # count + 1 newlines: the one before the first line kept marks its start.
        while start > 0 and data.count(b"\n", 0, len(data) - 1) < count:
            start = max(0, start - block)
            file.seek(start)
            data = file.read(end - start)
    cut = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(count):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return data
    return data[cut + 1 :]
