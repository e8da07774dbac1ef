"""Run log directories: where they go, and that old ones are pruned within a bound."""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nbddp.errors import ConfigError
from nbddp.launcher import logs, settings
from nbddp.launcher.logs import RECENT, new_run_dir, prune, rank_log, run_base_dir

MB = 1 << 20
NOW = time.time()


def make_run(base: Path, name: str, age: float, size: int = 0) -> Path:
    """A finished run directory whose last write was ``age`` seconds ago."""
    path = base / name
    path.mkdir(mode=0o700)
    log = path / "rank0.log"
    log.write_bytes(b"x" * size)
    when = NOW - age
    os.utime(log, (when, when))
    os.utime(path, (when, when))
    return path


def names(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir())


def test_the_oldest_runs_beyond_the_count_are_removed(tmp_path: Path) -> None:
    for i, age in enumerate([500, 400, 300, 200, 100]):
        make_run(tmp_path, f"run-{i}", age)
    removed = prune(tmp_path, keep=2, max_bytes=500 * MB, now=NOW)
    assert sorted(p.name for p in removed) == ["run-0", "run-1", "run-2"]
    assert names(tmp_path) == ["run-3", "run-4"]


def test_the_oldest_runs_beyond_the_size_are_removed(tmp_path: Path) -> None:
    make_run(tmp_path, "run-old", 300, size=3 * MB)
    make_run(tmp_path, "run-mid", 200, size=2 * MB)
    make_run(tmp_path, "run-new", 100, size=2 * MB)
    prune(tmp_path, keep=50, max_bytes=4 * MB + 1, now=NOW)
    assert names(tmp_path) == ["run-mid", "run-new"]


def test_a_run_within_the_bound_is_kept(tmp_path: Path) -> None:
    make_run(tmp_path, "run-a", 300, size=MB)
    make_run(tmp_path, "run-b", 200, size=MB)
    assert prune(tmp_path, keep=2, max_bytes=2 * MB, now=NOW) == []
    assert names(tmp_path) == ["run-a", "run-b"]


def test_a_run_written_to_in_the_last_minute_is_never_removed(tmp_path: Path) -> None:
    quiet = make_run(tmp_path, "run-a", 600)
    # run-a's directory is old, but a rank wrote to its log just now.
    os.utime(quiet / "rank0.log", (NOW - RECENT / 2, NOW - RECENT / 2))
    make_run(tmp_path, "run-b", RECENT / 3)
    make_run(tmp_path, "run-c", RECENT / 4)
    make_run(tmp_path, "run-d", RECENT * 2)
    prune(tmp_path, keep=1, max_bytes=1, now=NOW)
    assert names(tmp_path) == ["run-a", "run-b", "run-c"]


def test_a_locked_run_is_never_removed_however_old(tmp_path: Path) -> None:
    live = make_run(tmp_path, "run-a", 3600, size=2 * MB)
    make_run(tmp_path, "run-b", 500)
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as another process's run holds it
        prune(tmp_path, keep=1, max_bytes=MB, now=NOW)
        assert names(tmp_path) == ["run-a"]
    finally:
        os.close(fd)
    make_run(tmp_path, "run-c", 400)
    prune(tmp_path, keep=1, max_bytes=500 * MB, now=NOW)  # released: the oldest goes
    assert names(tmp_path) == ["run-c"]


def test_only_run_directories_are_touched(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    (tmp_path / "run-file").write_text("not a run directory")
    (tmp_path / "run-link").symlink_to(elsewhere)
    (tmp_path / "notes").mkdir()
    old = NOW - 3600
    for path in (elsewhere, tmp_path / "notes"):
        os.utime(path, (old, old))
    prune(tmp_path, keep=1, max_bytes=1, now=NOW)
    assert names(tmp_path) == ["elsewhere", "notes", "run-file", "run-link"]
    assert (elsewhere / "keep.txt").read_text() == "mine"


@pytest.fixture
def log_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    yield {"NBDDP_LOG_DIR": str(tmp_path / "logs")}


def test_a_new_run_dir_is_private_locked_and_prunes_the_old(log_env: dict[str, str]) -> None:
    base = Path(log_env["NBDDP_LOG_DIR"])
    base.mkdir()
    for i in range(4):
        make_run(base, f"run-old{i}", 1000 - i)
    run = new_run_dir("20240101-000000-abcdef", {**log_env, "NBDDP_LOG_KEEP": "3"})
    try:
        assert run.path.parent == base
        assert run.path.name.startswith("run-20240101-000000-abcdef-")
        assert stat.S_IMODE(run.path.stat().st_mode) == 0o700
        assert names(base) == sorted(["run-old2", "run-old3", run.path.name])
        # Its own run is protected by its lock while it goes, old or not.
        os.utime(run.path, (NOW - 3600, NOW - 3600))
        prune(base, keep=1, max_bytes=500 * MB, now=NOW)
        assert names(base) == [run.path.name]
    finally:
        run.release()
    prune(base, keep=0, max_bytes=500 * MB, now=NOW)
    assert names(base) == []


def test_the_log_dir_is_made_private_when_missing(tmp_path: Path) -> None:
    where = tmp_path / "a" / "b"
    assert run_base_dir(where) == where
    assert stat.S_IMODE(where.stat().st_mode) == 0o700


def test_the_default_log_dir_is_the_users_own_in_tmp() -> None:
    expected = Path(tempfile.gettempdir()) / f"nbddp-{os.getuid()}"
    assert run_base_dir(None) == expected


def test_a_log_dir_that_is_a_file_says_what_to_set(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(
        ConfigError, match=r"^NBDDP_LOG_DIR=.* is not a directory.*set NBDDP_LOG_DIR"
    ):
        run_base_dir(path)


def test_a_log_dir_of_someone_else_says_what_to_set(tmp_path: Path) -> None:
    theirs = Path("/")
    if os.getuid() == 0:  # root owns "/": give a directory to someone else instead
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
    with pytest.raises(ConfigError, match=r"^NBDDP_LOG_DIR='.*' is not yours.*set NBDDP_LOG_DIR"):
        run_base_dir(theirs)


def test_the_test_suite_writes_its_logs_in_its_own_directory() -> None:
    # conftest.py sets it before nbddp is imported; kernels and ranks inherit it.
    ours = Path(os.environ["NBDDP_LOG_DIR"])
    assert run_base_dir(settings.read().log_dir) == ours
    assert ours != Path(tempfile.gettempdir()) / f"nbddp-{os.getuid()}"


def test_rank_log_names_the_rank() -> None:
    assert rank_log(Path("/logs/run-x"), 3) == Path("/logs/run-x/rank3.log")


def test_a_new_run_skips_the_prune_while_no_run_can_be_removable_yet(
    log_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = Path(log_env["NBDDP_LOG_DIR"])
    base.mkdir()
    env = {**log_env, "NBDDP_LOG_KEEP": "1"}
    surveys: list[Path] = []
    real_survey = logs._survey

    def counting_survey(where: Path) -> list[tuple[Path, float, int]]:
        surveys.append(where)
        return real_survey(where)

    monkeypatch.setattr(logs, "_survey", counting_survey)
    runs = [new_run_dir(f"20240101-00000{i}-abcdef", env) for i in range(3)]
    for run in runs:
        run.release()
    # Every run is fresh: none can be removed for a minute, so only the first walked them.
    assert surveys == [base]
    assert len(names(base)) == 3
    # A minute on, the oldest left may go: the next run walks them again and prunes.
    later = time.time() + logs.RECENT + 1
    monkeypatch.setattr(logs.time, "time", lambda: later)
    new_run_dir("20240101-000009-abcdef", env).release()
    assert surveys == [base, base]
    assert names(base) == [n for n in names(base) if n.startswith("run-20240101-000009-")]
    assert len(names(base)) == 1
