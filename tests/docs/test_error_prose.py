"""Messages the pages quote in their prose (notices and errors, not in a ``text``
block or a table): each is on its page as written here, and is what its call says,
as the error raised or a notice on stderr. ``<...>`` stands for any text."""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import re
import socket
import sys
from collections.abc import Callable, Iterator

import pytest

import nbddp
from tests.docs import error_fns as fns
from tests.docs.pages import ROOT


@contextlib.contextmanager
def port_taken(port: int) -> Iterator[None]:
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with contextlib.suppress(OSError):  # taken already, which is as good
            taken.bind(("127.0.0.1", port))
            taken.listen()
        yield


def accelerate_port() -> None:
    with port_taken(29500):
        nbddp.notebook_launcher(fns.returns, num_processes=2, use_port=29500)


def session_exit() -> None:
    with nbddp.session(procs=2) as session:
        session.exec("import sys\nsys.exit(2) if rank == 1 else 0")


def queue_to_a_cluster() -> None:
    queue = multiprocessing.get_context("spawn").Queue()
    nbddp.launch(fns.takes, queue, nodes=2, procs=1, cluster="ray://head:10001")


def panel_without_ipywidgets(mp: pytest.MonkeyPatch) -> None:
    mp.setitem(sys.modules, "ipywidgets", None)
    nbddp.panel(fns.returns)


def fork_lock_unreachable(mp: pytest.MonkeyPatch) -> None:
    """A fork-context lock sent to forkserver ranks, where /proc/self/map_files is closed."""
    from nbddp.wire import mpobjects

    mp.setattr(mpobjects, "_mapped", lambda lock, address: None)
    nbddp.launch(fns.takes, multiprocessing.get_context("fork").Lock(), procs=2)


# (page, the quote as the page writes it) -> a call that says it.
PROSE: dict[tuple[str, str], Callable[[pytest.MonkeyPatch], object]] = {
    (
        "docs/troubleshooting.md",
        "no GPU visible: running 2 CPU processes (gloo); pass procs=N to choose how many",
    ): lambda mp: nbddp.launch(fns.returns),
    ("docs/troubleshooting.md", "backend 'nccl' needs GPUs"): lambda mp: nbddp.launch(
        fns.returns, procs=2, backend="nccl"
    ),
    (
        "docs/troubleshooting.md",
        "for a run on this machine use master_addr='127.0.0.1'",
    ): lambda mp: nbddp.launch(fns.returns, procs=2, master_addr="10.255.255.1"),
    (
        "docs/troubleshooting.md",
        "port 29500 on 127.0.0.1 is in use; using port <N> instead",
    ): lambda mp: accelerate_port(),
    (
        "docs/troubleshooting.md",
        "a multiprocessing object (queue, pipe, lock, event) cannot be sent to ranks on other "
        "machines",
    ): lambda mp: queue_to_a_cluster(),
    (
        "docs/troubleshooting.md",
        "rank <r> called sys.exit(<n>) in the cell; in a session that ends the cell, not the rank",
    ): lambda mp: session_exit(),
    (
        "docs/troubleshooting.md",
        "this multiprocessing <type> was made in the 'fork' context, whose semaphores only "
        "forked processes can reach; make it with multiprocessing.get_context('spawn') (as "
        "torch's spawn requires), or launch with start_method='fork'",
    ): fork_lock_unreachable,
    (
        "docs/panel.md",
        "nbddp.panel needs ipywidgets: pip install 'nbddp[panel]' (or ipywidgets)",
    ): panel_without_ipywidgets,
}


def pattern(quote: str) -> re.Pattern[str]:
    parts = re.split(r"<[^<>]+>", quote)
    return re.compile(".+?".join(re.escape(p) for p in parts), re.S)


@pytest.mark.parametrize(("page", "quote"), list(PROSE), ids=[q[:40] for _, q in PROSE])
def test_the_quoted_message_is_what_nbddp_says(
    page: str, quote: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = " ".join((ROOT / page).read_text().split())
    assert quote in text, f"{page} no longer quotes {quote!r}: update PROSE"
    stderr = io.StringIO()
    said = ""
    with contextlib.redirect_stderr(stderr):
        try:
            PROSE[(page, quote)](monkeypatch)
        except Exception as exc:
            said = str(exc)
    said += "\n" + stderr.getvalue()
    assert pattern(quote).search(said), f"{page} quotes\n  {quote}\nnbddp says\n  {said}"


# (page, a part of the quote) -> the test that asserts it on the real message (a
# prompt, an interrupt, a cluster: what this module cannot do in its own process).
ASSERTED_BY: dict[tuple[str, str], str] = {
    ("docs/debugging.md", "no longer asks: it ended, so its prompt takes no answer"): (
        "tests/kernel/test_prompt_beside_run.py"
    ),
    ("docs/debugging.md", "input is not available in this frontend"): (
        "tests/kernel/test_debug_kernel.py"
    ),
    ("docs/troubleshooting.md", "every rank was stopped; their output is in"): (
        "tests/kernel/test_kernel_faults.py"
    ),
    ("docs/troubleshooting.md", "interrupted while the ranks were starting; none was left"): (
        "tests/unit/test_failures.py"
    ),
    ("docs/sessions.md", "every rank returned to idle: the session keeps its state"): (
        "tests/kernel/test_session_kernel.py"
    ),
    ("docs/troubleshooting.md", "raised on rank 1 of 2"): "tests/kernel/test_magic.py",
    ("docs/troubleshooting.md", "stopped in a collective after rank 1 failed"): (
        "tests/unit/test_failures.py"
    ),
    ("docs/troubleshooting.md", "is gone; the cluster has"): "tests/cluster/test_cluster.py",
    ("docs/clusters.md", "is gone; the cluster has"): "tests/cluster/test_cluster.py",
    ("docs/troubleshooting.md", "cannot connect to the Ray cluster"): (
        "tests/unit/test_cluster_config.py"
    ),
    ("docs/troubleshooting.md", "the run was stopped"): "tests/multiproc/test_launch.py",
    ("docs/clusters.md", "rank 1 was killed by signal SIGKILL"): (
        "tests/cluster/test_cluster_session.py"
    ),
    ("docs/troubleshooting.md", "the run was interrupted"): "tests/unit/test_failures.py",
}


@pytest.mark.parametrize(("page", "part"), list(ASSERTED_BY), ids=[p[:40] for _, p in ASSERTED_BY])
def test_the_quoted_message_is_asserted_by_its_test(page: str, part: str) -> None:
    text = " ".join((ROOT / page).read_text().split())
    assert part in text, f"{page} no longer quotes {part!r}: update ASSERTED_BY"
    test = ASSERTED_BY[(page, part)]
    assert part in (ROOT / test).read_text(), f"{test} does not assert {part!r}"
