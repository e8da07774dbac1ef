"""What a cell shows of a run is true when the cell returns, on every path, in a real kernel.

Every path ends with each rank's block drawn in its final state: an interrupt
(of a ``%%ddp`` cell, of ``launch()``, and one that lands while a block is being
drawn), ``run.stop()``, the run's timeout, a failing rank and the rank stopped
because of it, a display that fails. A ``launch(block=False)`` run draws its
blocks in its own cell and keeps updating them, by display id, while other
cells run and print. Messages are read as a frontend gets them: every iopub
message, whichever cell it names as its parent.
"""

from __future__ import annotations

import queue
import re
from typing import Any

from tests.kernel.kernel import Kernel, ok

DISPLAY = ("display_data", "update_display_data")
HEADER = re.compile(r"^rank (\d+) · ([^·]+) · ")
RANKS_WAIT = """
def spin(fail_rank=None, after=0.0):
    import os, threading
    rank = int(os.environ["RANK"])
    print(f"rank {rank} up", flush=True)
    if rank == fail_rank:
        threading.Event().wait(after)
        raise ValueError("rank fails on purpose")
    for step in range(10**6):
        print(f"step {step}", flush=True)
        threading.Event().wait(0.05)
"""
KERNEL_SETUP = ("import nbddp, threading\n%load_ext nbddp\n" + RANKS_WAIT,)


def read_until_idle(kernel: Kernel, msg_id: str, timeout: float = 120.0) -> list[dict[str, Any]]:
    """Every iopub message, of any cell, until cell ``msg_id`` is idle; its reply read."""
    seen: list[dict[str, Any]] = []
    while True:
        try:
            msg = kernel.kc.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"cell {msg_id} did not finish within {timeout}s") from None
        seen.append(msg)
        if (
            msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
            and msg["parent_header"].get("msg_id") == msg_id
        ):
            break
    reply = kernel.kc.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kernel.kc.get_shell_msg(timeout=timeout)
    return seen


def wait_for(kernel: Kernel, msg_id: str, needle: str, seen: list[dict[str, Any]]) -> None:
    """Read iopub messages (of any cell, kept in ``seen``) until one holds ``needle``."""
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=60)
        seen.append(msg)
        if msg["msg_type"] != "execute_input" and needle in str(msg["content"]):
            return


def final_blocks(messages: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Display id -> its last content, in the order first shown."""
    blocks: dict[str, dict[str, str]] = {}
    for msg in messages:
        if msg["msg_type"] in DISPLAY:
            blocks[msg["content"]["transient"]["display_id"]] = msg["content"]["data"]
    return blocks


def headers(messages: list[dict[str, Any]]) -> dict[int, str]:
    """Rank -> the first line of its block as last drawn."""
    found: dict[int, str] = {}
    for data in final_blocks(messages).values():
        first = data.get("text/plain", "").split("\n", 1)[0]
        match = HEADER.match(first)
        if match:
            found[int(match.group(1))] = first
    return found


def states(messages: list[dict[str, Any]]) -> dict[int, str]:
    """Rank -> the state its block's header says, as last drawn."""
    return {
        rank: HEADER.match(text).group(2)  # type: ignore[union-attr]
        for rank, text in headers(messages).items()
    }


def run_and_interrupt(kernel: Kernel, code: str, needle: str) -> list[dict[str, Any]]:
    """Run ``code``, interrupt the kernel once ``needle`` shows, return every message."""
    msg_id = kernel.kc.execute(code)
    seen: list[dict[str, Any]] = []
    wait_for(kernel, msg_id, needle, seen)
    kernel.interrupt()
    seen += read_until_idle(kernel, msg_id)
    errors = [m for m in seen if m["msg_type"] == "error"]
    assert errors and errors[-1]["content"]["ename"] == "KeyboardInterrupt", seen
    return seen


def test_an_interrupted_ddp_cell_ends_with_every_rank_interrupted(kernel: Kernel) -> None:
    seen = run_and_interrupt(kernel, "%%ddp --procs 2\nspin()", "step 3")
    assert states(seen) == {0: "interrupted", 1: "interrupted"}, headers(seen)


def test_an_interrupted_launch_ends_with_every_rank_interrupted(kernel: Kernel) -> None:
    seen = run_and_interrupt(kernel, "nbddp.launch(spin, procs=2)", "step 3")
    assert states(seen) == {0: "interrupted", 1: "interrupted"}, headers(seen)
    html = [d["text/html"] for d in final_blocks(seen).values() if "nbddp-rank" in d["text/html"]]
    assert all('data-state="interrupted"' in h for h in html) and len(html) == 2
    # One line, as for a %%ddp cell, not nbddp's own frames.
    [error] = [m["content"] for m in seen if m["msg_type"] == "error"]
    [line] = error["traceback"]
    assert line.startswith("KeyboardInterrupt: every rank was stopped"), line


def test_an_interrupted_session_cell_ends_with_every_rank_interrupted(kernel: Kernel) -> None:
    # As a one-shot cell's: the interrupt nbddp sent is not the ranks' failure.
    ok(kernel, "%ddp_session start --procs 2")
    try:
        seen = run_and_interrupt(kernel, "%%ddp\nspin()", "step 3")
        assert states(seen) == {0: "interrupted", 1: "interrupted"}, headers(seen)
        html = [
            d["text/html"] for d in final_blocks(seen).values() if "nbddp-rank" in d["text/html"]
        ]
        assert all('data-state="interrupted"' in h for h in html) and len(html) == 2
    finally:
        ok(kernel, "%ddp_session stop")


def test_a_background_run_shown_as_a_cells_result_is_redrawn_until_its_final_state(
    kernel: Kernel,
) -> None:
    code = (
        "def short():\n    threading.Event().wait(1.0)\n"
        "run = nbddp.launch(short, procs=2, block=False)\nrun"
    )
    seen = read_until_idle(kernel, kernel.kc.execute(code))
    seen += read_until_idle(kernel, kernel.kc.execute("run.wait(); del run"))
    [shown] = [d for d in final_blocks(seen).values() if "nbddp-run" in d["text/html"]]
    assert re.search(r": done, 2 ranks \(2 done\), \d+s>$", shown["text/plain"]), shown
    assert ": done, 2 ranks (2 done)" in shown["text/html"]


def test_an_interrupt_during_a_draw_still_ends_with_the_final_frame(kernel: Kernel) -> None:
    # SIGINT is raised inside the display's own update, as the stop button does when
    # it lands while the cell draws; the blocks are then finished with SIGINT ignored.
    setup = kernel.execute(
        """
import os, signal
from nbddp.display import kernel as _kd
_real_update = _kd.IPythonPublisher.update
_calls = [0]
def _interrupting(self, handle, bundle):
    _calls[0] += 1
    if _calls[0] == 6:
        os.kill(os.getpid(), signal.SIGINT)
    _real_update(self, handle, bundle)
_kd.IPythonPublisher.update = _interrupting
"""
    )
    assert setup.status == "ok", setup.text()
    try:
        msg_id = kernel.kc.execute("nbddp.launch(spin, procs=2)")
        seen = read_until_idle(kernel, msg_id)
    finally:
        kernel.execute("_kd.IPythonPublisher.update = _real_update")
    assert any(m["msg_type"] == "error" for m in seen)
    assert states(seen) == {0: "interrupted", 1: "interrupted"}, headers(seen)
    # One block per rank: the interrupted draw left no half-made copy (rank 0's
    # block is the "starting…" line's, updated).
    firsts = [HEADER.match(d["text/plain"]) for d in final_blocks(seen).values()]
    assert sorted(int(f.group(1)) for f in firsts if f) == [0, 1]


def test_stop_from_a_later_cell_ends_a_background_run_as_stopped(kernel: Kernel) -> None:
    launch = kernel.kc.execute("run = nbddp.launch(spin, procs=2, block=False)")
    seen = read_until_idle(kernel, launch)
    stop = kernel.kc.execute(
        "while 'step 3' not in run.log(1): threading.Event().wait(0.05)\n"
        "run.stop()\n"
        "try:\n    run.wait()\n"
        "except nbddp.RankError as exc:\n    print('raised', type(exc).__name__)"
    )
    seen += read_until_idle(kernel, stop)
    assert states(seen) == {0: "stopped", 1: "stopped"}, headers(seen)


def test_a_timeout_ends_every_rank_as_timed_out(kernel: Kernel) -> None:
    msg_id = kernel.kc.execute("nbddp.launch(spin, procs=2, timeout=1)")
    seen = read_until_idle(kernel, msg_id)
    errors = [m["content"]["ename"] for m in seen if m["msg_type"] == "error"]
    assert errors == ["LaunchTimeout"]
    assert states(seen) == {0: "timed out", 1: "timed out"}, headers(seen)
    footer = list(final_blocks(seen).values())[-1]["text/plain"]
    assert footer.startswith("nbddp: timeout of 1s reached")


def test_a_failing_rank_and_the_rank_it_stopped_are_told_apart(kernel: Kernel) -> None:
    msg_id = kernel.kc.execute("nbddp.launch(spin, 1, 0.5, procs=2)")
    seen = read_until_idle(kernel, msg_id)
    assert [m["content"]["ename"] for m in seen if m["msg_type"] == "error"] == ["ValueError"]
    shown = headers(seen)
    assert shown[1].startswith("rank 1 · failed: ValueError · ")
    assert shown[0].startswith("rank 0 · stopped: rank 1 failed · ")
    html = {
        rank: data["text/html"]
        for data in final_blocks(seen).values()
        for rank in (0, 1)
        if f'data-rank="{rank}"' in data["text/html"]
    }
    color = {rank: re.search(r"color:(#[0-9a-f]{6})", h).group(1) for rank, h in html.items()}  # type: ignore[union-attr]
    assert 'data-state="failed"' in html[1] and 'data-state="cancelled"' in html[0]
    assert color[0] != color[1]


def test_a_display_that_fails_leaves_true_headers_and_the_output_as_text(kernel: Kernel) -> None:
    setup = kernel.execute(
        """
from nbddp.display import blocks as _blocks
_real_bundle = _blocks.rank_bundle
_made = [0]
def _breaking(**kwargs):
    _made[0] += 1
    if _made[0] > 2:
        raise RuntimeError("the renderer broke")
    return _real_bundle(**kwargs)
_blocks.rank_bundle = _breaking
def talk():
    import os, threading
    for i in range(20):
        print(f"line {i}", flush=True)
        threading.Event().wait(0.02)
    return os.environ["RANK"]
"""
    )
    assert setup.status == "ok", setup.text()
    try:
        result = kernel.execute("nbddp.launch(talk, procs=2)")
    finally:
        kernel.execute("_blocks.rank_bundle = _real_bundle")
    assert result.status == "ok", result.text()
    assert result.result == "'0'"
    assert "the display failed (RuntimeError: the renderer broke)" in result.stderr
    assert "[rank 1] line 19" in result.stdout  # the rest of the output, as text
    assert states(result.messages) == {0: "done", 1: "done"}
    blocks = [d["text/plain"] for d in final_blocks(result.messages).values()]
    assert all("the display failed" in text for text in blocks if HEADER.match(text))


def test_the_starting_line_comes_first_and_rank_0_takes_its_place(kernel: Kernel) -> None:
    result = kernel.execute("nbddp.launch(print, 'hi', procs=2)")
    assert result.status == "ok", result.text()
    first = result.of_type("display_data")[0]["content"]
    assert first["data"]["text/plain"] == "starting 2 ranks…"
    final = final_blocks(result.messages)[first["transient"]["display_id"]]
    assert final["text/plain"].startswith("rank 0 · done · ")


def test_a_background_run_draws_live_in_its_own_cell_while_other_cells_run(
    kernel: Kernel,
) -> None:
    # The other cells wait until the run's blocks were updated while they ran: the
    # updates are counted where the display sends them, so nothing here is timed.
    setup = kernel.execute(
        """
from nbddp.display import kernel as _kd
_real_update = _kd.IPythonPublisher.update
_updates = [0]
def _counting(self, handle, bundle):
    _real_update(self, handle, bundle)
    _updates[0] += 1
_kd.IPythonPublisher.update = _counting
def _other(name):
    seen = _updates[0]
    for i in range(3):
        print(f"cell {name} says {i}", flush=True)
        while _updates[0] < seen + 2 * (i + 1):
            threading.Event().wait(0.02)
"""
    )
    assert setup.status == "ok", setup.text()
    try:
        launch = kernel.kc.execute("run = nbddp.launch(spin, procs=2, block=False)")
        cell_a = kernel.kc.execute("_other('A')")
        cell_b = kernel.kc.execute("_other('B')")
        end = kernel.kc.execute(
            "run.stop()\ntry:\n    run.wait()\nexcept nbddp.RankError:\n    pass\n"
            "print('watchers', [t.name for t in threading.enumerate() if 'nbddp-run' in t.name])"
        )
        seen = read_until_idle(kernel, end)
    finally:
        kernel.execute("_kd.IPythonPublisher.update = _real_update")

    def parent(msg: dict[str, Any]) -> str:
        return str(msg["parent_header"].get("msg_id"))

    # Every block of the run was made in the launching cell, before it returned.
    made = [m for m in seen if m["msg_type"] == "display_data"]
    assert made and {parent(m) for m in made} == {launch}
    ours = {m["content"]["transient"]["display_id"] for m in made}
    # Updates of those blocks came while each of the other cells ran.
    for cell in (cell_a, cell_b):
        busy = [i for i, m in enumerate(seen) if parent(m) == cell and m["msg_type"] == "status"]
        start, stop = busy[0], busy[-1]
        during = [
            m
            for m in seen[start:stop]
            if m["msg_type"] == "update_display_data"
            and m["content"]["transient"]["display_id"] in ours
        ]
        assert during, f"no update of the run's blocks while cell {cell} ran"
    # What the other cells printed stayed in their cells, never in the run's blocks.
    for name, cell in (("A", cell_a), ("B", cell_b)):
        printed = "".join(
            m["content"]["text"] for m in seen if m["msg_type"] == "stream" and parent(m) == cell
        )
        assert printed == "".join(f"cell {name} says {i}\n" for i in range(3))
    blocks = final_blocks(seen)
    assert not any("says" in data["text/plain"] for data in blocks.values())
    assert not any(
        "step" in m["content"]["text"] for m in seen if m["msg_type"] == "stream"
    )  # the ranks' output is only in their blocks
    assert states(seen) == {0: "stopped", 1: "stopped"}
    last = [m for m in seen if parent(m) == end and m["msg_type"] == "stream"]
    assert "".join(m["content"]["text"] for m in last) == "watchers []\n"


def test_a_background_runs_prompt_is_asked_in_the_cell_that_waits(kernel: Kernel) -> None:
    # No cell asks while none waits: the rank shows as waiting in its own cell,
    # and the cell that calls wait() asks, as it would have before the run was live.
    launched = kernel.execute(
        "def ask():\n"
        "    import os\n"
        "    return input('name? ') if os.environ['RANK'] == '0' else 'quiet'\n"
        "run = nbddp.launch(ask, procs=2, block=False)\n"
        "while not run.pump._asked:  # the prompt, taken in by the run, not asked yet\n"
        "    threading.Event().wait(0.05)\n"
        "assert run.rank_states()[0] == 'waiting for input'"
    )
    assert launched.status == "ok", launched.text()
    result, prompts = kernel.execute_answering("run.wait().values", lambda prompt, password: "ada")
    assert result.status == "ok", result.text()
    assert prompts == ["name? [rank 0] "]
    assert result.result == "{0: 'ada', 1: 'quiet'}"
