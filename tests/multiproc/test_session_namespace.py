"""A session's namespace on 2 gloo ranks: what stays, what goes, what a call shares.

Notebook values a cell reads are dropped after it (their memory goes, a name the
notebook deleted is undefined next time); functions defined in ``__main__`` and
given to ``Session.run`` run in the session's namespace; the default process group
can be destroyed and initialised again; an idle session wakes for nothing of ours.
Each test also gets the leftover-process check (tests/conftest.py).
"""

from __future__ import annotations

import gc
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

import nbddp
from nbddp.notebook.session import Session
from tests.multiproc import session_fns as fns

MiB = 1 << 20


@pytest.fixture
def session() -> Iterator[Session]:
    with nbddp.session(procs=2, output="none", timeout=60) as s:
        yield s


def _shared_mapped(pid: int) -> int:
    """Bytes ``pid`` maps from shared memory (``/dev/shm`` files and memfds)."""
    total = 0
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and ("/dev/shm/" in fields[5] or "memfd:" in fields[5]):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            total += end - start
    return total


def _shm_used() -> int:
    return shutil.disk_usage("/dev/shm").used


def _main_functions(source: str) -> dict[str, Any]:
    """The functions ``source`` defines, as a notebook (``__main__``) defines them."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(source, "<notebook cell>", "exec"), namespace)
    return namespace


def test_notebook_tensors_a_cell_read_go_from_the_ranks_once_the_notebook_drops_them(
    session: Session,
) -> None:
    pids = [pid for pid, _ in session.run(fns.identity)]
    session.exec("warm = 1")  # the first cell's own allocations are not the baseline
    gc.collect()
    shm, mapped = _shm_used(), [_shared_mapped(pid) for pid in pids]
    size = 256 * MiB
    for n in range(3):
        big = torch.full((size // 4,), float(n))
        assert session.exec(f"seen{n} = float(big{n}[0])\nseen{n}", {f"big{n}": big}) == n
        del big
        gc.collect()
        session.exec("1")  # one cell after the notebook dropped it
        grew = _shm_used() - shm
        grew_mapped = [_shared_mapped(pid) - m for pid, m in zip(pids, mapped, strict=True)]
        print(f"after tensor {n}: /dev/shm {grew / MiB:+.1f} MiB, mapped {grew_mapped}")
        assert abs(grew) <= size // 100, f"/dev/shm still {grew / MiB:.1f} MiB higher"
        assert all(abs(g) <= size // 100 for g in grew_mapped), grew_mapped
    assert {"seen0", "seen1", "seen2"} <= set(session.names)
    assert not {"big0", "big1", "big2"} & set(session.names)


def test_a_name_the_notebook_no_longer_has_is_undefined_in_the_next_cell(
    session: Session,
) -> None:
    assert session.exec("lr_adv * 2", {"lr_adv": 0.5}) == 1.0
    with pytest.raises(NameError, match="lr_adv"):
        session.exec("lr_adv * 2", {})
    # What the ranks bound stays theirs, whatever the notebook has.
    session.exec("mine = lr_adv * 4", {"lr_adv": 0.5})
    assert session.exec("mine", {}) == 2.0


def test_a_function_the_ranks_keep_reads_the_notebooks_current_values(
    session: Session,
) -> None:
    session.exec("def step():\n    return lr * 2", {"lr": 0.1})
    assert session.exec("step()", {"lr": 0.3}) == 0.6  # edited in the notebook
    with pytest.raises(NameError, match="lr"):
        session.exec("step()", {})  # deleted in the notebook


def test_a_value_a_cell_stored_in_an_object_the_ranks_keep_stays(session: Session) -> None:
    session.exec("kept = {}\nkept['w'] = w", {"w": torch.arange(3)})
    assert session.exec("kept['w'].tolist()", {}) == [0, 1, 2]


def test_functions_from_the_notebook_share_the_session_namespace_across_runs(
    session: Session,
) -> None:
    cell = _main_functions(
        "scale = 10\n"
        "def setup(value):\n"
        "    global model_state\n"
        "    model_state = value * scale\n"
        "def train():\n"
        "    return model_state + helper()\n"
        "def helper():\n"
        "    return 1\n"
    )
    session.run(cell["setup"], 4)
    assert session.run(cell["train"]) == 41
    assert "model_state" in session.names
    # A %%ddp cell sees it too, and a run sees what a cell bound.
    assert session.exec("model_state", {}) == 40
    session.exec("model_state = 7")
    assert session.run(cell["train"]) == 8
    # A function imported from a module keeps its own module's globals.
    session.run(fns.keep, "k", 3)
    assert session.run(fns.kept, "k") == 3
    assert "_KEPT" not in session.names


def test_the_default_process_group_can_be_destroyed_and_initialised_again(
    session: Session,
) -> None:
    all_reduce = "t = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)\nt.item()"
    session.exec("import time, torch\nimport torch.distributed as dist")
    session.exec("dist.destroy_process_group()")
    started = time.monotonic()
    # Rank 0 comes late: rank 1 must not take the first group's address for its.
    late = "if rank == 0:\n    time.sleep(1.0)\n"
    assert session.exec(f"{late}dist.init_process_group('gloo')\n{all_reduce}", {}) == 3.0
    # Twice in one cell, then once more in the next.
    twice = f"dist.destroy_process_group()\n{late}dist.init_process_group('gloo')\n"
    assert session.exec(f"{twice}{twice}{all_reduce}", {}) == 3.0
    assert session.exec(f"{twice}{all_reduce}", {}) == 3.0
    assert time.monotonic() - started < 30
    assert session.run(fns.identity)  # nbddp's own calls use the new group


def test_an_idle_session_wakes_for_nothing_of_nbddps(session: Session) -> None:
    """Over 60 s idle: the CPU each rank uses (printed) and which threads woke.

    Gloo's transport thread (``gloo_tcp_loop``) polls every 10 ms while a gloo
    process group exists: that is torch's cost, the same in any gloo run, and
    what docs/sessions.md states. No other thread of a rank, nor the notebook's
    relay, may wake."""
    pids = [pid for pid, _ in session.run(fns.identity)]
    procs = [psutil.Process(pid) for pid in pids]
    watched = [*procs, psutil.Process()]
    cpu = [sum(p.cpu_times()[:2]) for p in procs]
    before = _switches(watched)
    window = 60.0
    time.sleep(window)  # a measurement window, not synchronisation
    after = _switches(watched)
    used = [sum(p.cpu_times()[:2]) - c for p, c in zip(procs, cpu, strict=True)]
    woke = {key: after[key] - n for key, n in before.items() if key in after}
    print(f"idle {window:.0f} s: CPU per rank {[round(u, 3) for u in used]} s")
    for (pid, tid, name), n in sorted(woke.items()):
        print(f"  pid {pid} thread {tid} {name}: woke {n} times")
    relay = {t.native_id for t in threading.enumerate() if t.name.startswith("nbddp-")}
    ours = {
        key: n
        for key, n in woke.items()
        if key[2] != "gloo_tcp_loop" and (key[0] != os.getpid() or key[1] in relay)
    }
    # A rank finishes its last cell's bookkeeping after its value reached the
    # notebook, so a thread may wake once or twice at the window's start; a
    # thread that polls, even once a second, would wake 60 times.
    assert {key: n for key, n in ours.items() if n > 2} == {}
    assert max(used) < 1.0, used  # gloo's polling only: about 0.1 s a minute


def _switches(procs: list[psutil.Process]) -> dict[tuple[int, int, str], int]:
    """(pid, thread id, thread name) -> context switches so far, for every thread."""
    seen: dict[tuple[int, int, str], int] = {}
    for proc in procs:
        for thread in proc.threads():
            task = Path(f"/proc/{proc.pid}/task/{thread.id}")
            try:
                name = (task / "comm").read_text().strip()
                status = (task / "status").read_text()
            except FileNotFoundError:
                continue  # the thread ended
            seen[(proc.pid, thread.id, name)] = sum(
                int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line
            )
    return seen


def test_sys_exit_in_a_cell_raises_an_nbddp_error_never_system_exit(session: Session) -> None:
    session.exec("kept = 41")
    with pytest.raises(nbddp.RankExitedError, match=r"rank 1 called sys\.exit\(3\)") as info:
        session.exec("import sys\nif rank == 1:\n    sys.exit(3)")
    assert info.value.exit_code == 3 and info.value.rank == 1
    assert "the session keeps its state" in info.value.__notes__[-1]
    assert session.exec("kept + 1", {}) == 42
