"""Where a run's logs go, one directory per run, and how many old runs are kept.

Contract: ``new_run_dir(run_id)`` makes a run's private directory (mode
0700) ``run-<run_id>-<random>`` in the base directory, holds an exclusive
``flock`` on it for as long as the run goes (``RunDir.release()`` when it
has ended; closing the process releases it too), then prunes the base
directory. ``rank_log(log_dir, rank)`` is the one place that names a rank's
log file.

The base directory is ``NBDDP_LOG_DIR`` when set (made, mode 0700, when
missing; it must be a directory owned by this user), else
``$TMPDIR/nbddp-<uid>/`` (mode 0700; when that is someone else's or open to
others, a fresh private directory for this process instead).

Pruning keeps the newest runs within ``NBDDP_LOG_KEEP`` runs (default 50,
the new one included) and ``NBDDP_LOG_MAX_MB`` megabytes (default 500) in
all, removing the oldest (by their last write) first. It never removes a
run that is still going, in this process or another: one whose directory
lock is held, or (for a run whose process has not taken its lock yet, or
an nbddp without locks) one that was written to in the last ``RECENT``
seconds; those count towards the bound, so it can be exceeded while they
last. Only ``run-*`` directories in the base directory are touched, never
symlinks or other files. The settings are read, and checked, each time a
run starts (``launcher.settings``). Pruning
itself never fails a run: what cannot be removed is left. A new run skips
the prune while no run left by this process's last prune can have become
removable (each was written to in the last ``RECENT`` seconds): a sweep's
launches, seconds apart or less, would each walk every run directory to
remove nothing.
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
_MB = 1 << 20

_fallback: dict[Path, Path] = {}  # our private base instead of one we must not use
_quiet_until: dict[Path, float] = {}  # base -> time.time() before which no run there is removable


def run_base_dir(chosen: Path | None = None) -> Path:
    """Where run directories go: ``chosen`` (``NBDDP_LOG_DIR``), else the default (see
    module contract); made if missing."""
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
    if not base.is_dir():
        raise ConfigError(f"NBDDP_LOG_DIR='{base}' is not a directory; {fix}")
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
    """Make and lock a new run's directory, then prune old ones (see module contract)."""
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
    """(latest of ``last_write`` and every file's mtime, bytes in all) under ``path``.

    ``os.scandir`` rather than ``os.walk``: this runs at every launch over up to
    a minute's worth of runs (a sweep's), and the walk's own bookkeeping was
    most of the launch's time spent here."""
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
