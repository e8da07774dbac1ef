"""A prompt never holds the run up, in a real kernel with stdin (as JupyterLab runs it).

While a rank waits at a prompt, the other ranks' output is shown live and a failure
ends the cell; a prompt whose rank ended is withdrawn, saying so, and the cell does
not wait for its answer.
"""

from __future__ import annotations

from pathlib import Path

from tests.kernel.kernel import Kernel, rank_block_lines

TICKS = """%%ddp --procs 2
import os, time
if rank == 1:
    print('rank 1 got', input('go? '))
else:
    i = 0
    while not os.path.exists({flag!r}):
        print('tick', i, flush=True)
        i += 1
        time.sleep(0.02)
"""


def shown_blocks(messages: list[dict[str, object]]) -> dict[str, str]:
    """The latest text/plain of each display the cell drew, by display id."""
    blocks: dict[str, str] = {}
    for m in messages:
        content = m["content"]
        assert isinstance(content, dict)
        display_id = content.get("transient", {}).get("display_id")
        if m["msg_type"] in ("display_data", "update_display_data") and display_id:
            blocks[display_id] = content.get("data", {}).get("text/plain", "")
    return blocks


def test_a_rank_printing_beside_a_prompt_is_shown_live(notebook: Kernel, tmp_path: Path) -> None:
    flag = tmp_path / "answered"
    while_asked: list[str] = []

    def respond(prompt: str, password: bool) -> str | None:
        # Answer only once rank 0's block shows it went on printing after the prompt.
        blocks = shown_blocks(notebook.seen).values()
        rank0 = [b for b in blocks if b.startswith("rank 0 ")]
        if not rank0 or "tick 100" not in rank0[0]:
            return None
        while_asked.extend(blocks)
        flag.touch()
        return "yes"

    result, prompts = notebook.execute_answering(TICKS.format(flag=str(flag)), respond, 90)
    assert result.status == "ok", result.text()
    assert prompts == ["go? [rank 1] "]
    rank1 = [b for b in while_asked if b.startswith("rank 1 ")]
    assert rank1 and "waiting for input" in rank1[0].split("\n")[0], while_asked
    assert "[rank 1] rank 1 got yes" in result.rank_output


FAILS = """%%ddp --procs 2
import os, time
if rank == 0:
    input('name? ')
else:
    while not os.path.exists({flag!r}):
        time.sleep(0.01)
    raise ValueError('rank 1 failed while rank 0 was asked')
"""


def test_a_failure_while_a_rank_waits_at_a_prompt_ends_the_cell_unanswered(
    notebook: Kernel, tmp_path: Path
) -> None:
    flag = tmp_path / "asked"

    def never(prompt: str, password: bool) -> None:
        flag.touch()  # rank 1 fails once rank 0's prompt is in the user's hands
        # ... who never answers it.

    result, prompts = notebook.execute_answering(FAILS.format(flag=str(flag)), never, 60)
    assert prompts == ["name? [rank 0] "]
    assert result.status == "error"
    assert result.error is not None and result.error["ename"] == "ValueError", result.text()
    assert "rank 1 failed while rank 0 was asked" in result.error["evalue"]
    assert (
        "nbddp: [rank 0] no longer asks: it ended, so its prompt takes no answer" in result.text()
    )
    headers = [
        (lines or [""])[0]
        for plain in shown_blocks(result.messages).values()
        if (lines := rank_block_lines(plain)) is not None or plain.startswith("rank 0 ")
    ]
    assert headers, result.text()


def test_a_rank_answered_stops_saying_waiting_while_the_next_is_asked(notebook: Kernel) -> None:
    code = "%%ddp --procs 2\nprint(rank, 'got', input('name? '))\n"
    asked: list[str] = []

    def respond(prompt: str, password: bool) -> str | None:
        if prompt not in asked:
            asked.append(prompt)
        if len(asked) == 1:
            return "first"
        # The second prompt: answered only once the first rank's header moved on.
        first = asked[0].split("[rank ")[1][0]
        headers = [b.split("\n")[0] for b in shown_blocks(notebook.seen).values()]
        moved = [h for h in headers if h.startswith(f"rank {first} ") and "waiting" not in h]
        return "second" if moved else None

    result, prompts = notebook.execute_answering(code, respond, 60)
    assert result.status == "ok", result.text()
    assert len(prompts) == 2, prompts
