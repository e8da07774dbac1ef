"""Drive a real IPython kernel from tests (jupyter_client), grouping messages by cell.

``Kernel`` starts a kernel in a fresh process (it inherits the test
session's environment, so its nbddp workers carry the leftover marker),
runs cells, and returns every iopub message the cell produced, in order.
Nothing here sleeps: every wait is a blocking receive with a timeout.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

RANK_HEADER = re.compile(r"^rank (\d+) · ")


def rank_block_lines(plain: str) -> list[str] | None:
    """The lines of one rank block of nbddp's kernel display (its ``text/plain``: a
    ``rank N · state · time`` header, then the rank's output tail) as ``[rank N] line``
    lines, the way the text display prints them; None if ``plain`` is not a rank block.
    The note about earlier lines kept only in the log is left out."""
    lines = plain.split("\n")
    match = RANK_HEADER.match(lines[0])
    if match is None:
        return None
    rank = match.group(1)
    return [f"[rank {rank}] {line}" for line in lines[1:] if not line.startswith("… ")]


@dataclass
class CellResult:
    """What one executed cell produced."""

    status: str  # "ok", "error" or "aborted"
    messages: list[dict[str, Any]] = field(default_factory=list)
    reply: dict[str, Any] = field(default_factory=dict)

    def of_type(self, *types: str) -> list[dict[str, Any]]:
        """The iopub messages of the given types."""
        return [m for m in self.messages if m["msg_type"] in types]

    @property
    def stdout(self) -> str:
        """All text the cell streamed to stdout."""
        return "".join(
            m["content"]["text"] for m in self.of_type("stream") if m["content"]["name"] == "stdout"
        )

    @property
    def stderr(self) -> str:
        """All text the cell streamed to stderr."""
        return "".join(
            m["content"]["text"] for m in self.of_type("stream") if m["content"]["name"] == "stderr"
        )

    @property
    def result(self) -> str | None:
        """The text/plain of the cell's ``execute_result`` (its Out[n]), if any."""
        results = self.of_type("execute_result")
        return results[-1]["content"]["data"]["text/plain"] if results else None

    @property
    def error(self) -> dict[str, Any] | None:
        """The content of the cell's ``error`` message, if it failed."""
        errors = self.of_type("error")
        return errors[-1]["content"] if errors else None

    @property
    def rank_output(self) -> str:
        """What each rank's block shows at the end of the cell, as ``[rank N] line`` lines
        (rank order), whether the ranks' output came as display blocks or as stream text."""
        final: dict[str, str] = {}
        for m in self.of_type("display_data", "update_display_data"):
            display_id = m["content"].get("transient", {}).get("display_id")
            if display_id is not None:
                final[display_id] = m["content"].get("data", {}).get("text/plain", "")
        lines = [line for plain in final.values() for line in rank_block_lines(plain) or []]
        lines.sort(key=lambda line: int(line.split("]")[0][6:]))  # stable: rank, then order
        streamed = [line for line in self.stdout.splitlines() if line.startswith("[rank ")]
        return "".join(f"{line}\n" for line in lines + streamed)

    def text(self) -> str:
        """Every text/plain and stream output, in order (what a person would read)."""
        parts = []
        for m in self.messages:
            content = m["content"]
            if m["msg_type"] == "stream":
                parts.append(content["text"])
            elif m["msg_type"] in ("execute_result", "display_data", "update_display_data"):
                parts.append(content.get("data", {}).get("text/plain", "") + "\n")
            elif m["msg_type"] == "error":
                parts.append("\n".join(content["traceback"]) + "\n")
        return "".join(parts)


class Kernel:
    """A live kernel for one test (use as a context manager)."""

    def __init__(self, cwd: str | None = None) -> None:
        # With no kernelspec directories to search, jupyter_client falls back to
        # ipykernel's built-in python3 spec: this interpreter (the test venv),
        # whatever kernelspecs the machine has installed.
        self.km = KernelManager(
            kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[])
        )
        self.cwd = cwd

    def __enter__(self) -> Kernel:
        self.km.start_kernel(cwd=self.cwd, env=dict(os.environ))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        return self

    def __exit__(self, *exc: object) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)

    @property
    def pid(self) -> int:
        """The kernel process id."""
        provisioner = self.km.provisioner
        assert provisioner is not None
        return int(provisioner.process.pid)  # type: ignore[attr-defined]

    def descendants(self) -> set[int]:
        """Pids of every live process the kernel started, directly or not (forkserver, ranks)."""
        return {p.pid for p in psutil.Process(self.pid).children(recursive=True)}

    def execute(self, code: str, timeout: float = 120.0, allow_stdin: bool = True) -> CellResult:
        """Run ``code`` as a cell and collect its messages until the kernel is idle
        (``allow_stdin``: False as a frontend that cannot take input runs it)."""
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=allow_stdin)
        return self.collect(msg_id, timeout)

    def execute_answering(
        self,
        code: str,
        respond: Callable[[str, bool], str | None],
        timeout: float = 120.0,
    ) -> tuple[CellResult, list[str]]:
        """Run ``code`` with stdin allowed, answering each ``input_request`` with
        ``respond(prompt, password)``, asked again each turn while it returns None (not
        answered yet: a user thinking, or one who interrupts instead); the cell's
        result and the prompts, in order."""
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=True)
        prompts: list[str] = []
        messages: list[dict[str, Any]] = []
        self.seen = messages  # what ``respond`` may look at: the cell's output so far
        pending: tuple[str, bool] | None = None
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cell did not finish within {timeout}s")
            with contextlib.suppress(queue.Empty):
                request = self.kc.get_stdin_msg(timeout=0.05)
                if request["msg_type"] == "input_request":
                    pending = (request["content"]["prompt"], bool(request["content"]["password"]))
                    prompts.append(pending[0])
            if pending is not None:
                answer = respond(*pending)
                if answer is not None:
                    self.kc.input(answer)
                    pending = None
            try:
                msg = self.kc.get_iopub_msg(timeout=0.05)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status":
                if msg["content"]["execution_state"] == "idle":
                    break
                continue
            messages.append(msg)
        return self._result(msg_id, messages, timeout), prompts

    def messages_of(
        self, msg_id: str, timeout: float, waiting_for: str
    ) -> Iterator[dict[str, Any]]:
        """The iopub messages of the cell ``msg_id`` as they arrive (others are skipped);
        TimeoutError naming ``waiting_for`` when none comes within ``timeout`` seconds."""
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"{waiting_for} within {timeout}s") from None
            if msg["parent_header"].get("msg_id") == msg_id:
                yield msg

    def collect(self, msg_id: str, timeout: float = 120.0) -> CellResult:
        """The iopub messages of the cell ``msg_id``, up to its idle status, and its reply."""
        messages: list[dict[str, Any]] = []
        for msg in self.messages_of(msg_id, timeout, "the cell did not finish"):
            if msg["msg_type"] == "status":
                if msg["content"]["execution_state"] == "idle":
                    break
                continue
            messages.append(msg)
        return self._result(msg_id, messages, timeout)

    def _result(self, msg_id: str, messages: list[dict[str, Any]], timeout: float) -> CellResult:
        """The cell ``msg_id``'s result: its iopub ``messages`` and its shell reply."""
        reply = self.kc.get_shell_msg(timeout=timeout)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.kc.get_shell_msg(timeout=timeout)
        result = CellResult(reply["content"]["status"], messages, reply["content"])
        if result.reply.get("ename") == "UsageError" and "UsageError" not in result.stderr:
            # Its stderr line can follow the idle status: ipykernel 6.5 does not wait for its
            # stream flush while another thread holds the import lock (nbddp's torch import).
            result.messages += self.wait_for_output(msg_id, "UsageError", timeout)
        return result

    def wait_for_output(
        self, msg_id: str, needle: str, timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        """Read iopub messages of ``msg_id`` until one contains ``needle``; return them.

        The cell's own code (``execute_input``) is not output: it is not searched.
        """
        seen: list[dict[str, Any]] = []
        for msg in self.messages_of(msg_id, timeout, f"{needle!r} did not appear"):
            seen.append(msg)
            if msg["msg_type"] != "execute_input" and needle in str(msg["content"]):
                return seen
        raise AssertionError("unreachable: messages_of ends only by raising")

    def interrupt(self) -> None:
        """Interrupt the kernel as the notebook's stop button does (SIGINT)."""
        self.km.interrupt_kernel()

    def kill(self) -> None:
        """SIGKILL the kernel process, as the OOM killer would."""
        os.kill(self.pid, signal.SIGKILL)


def ok(kernel: Kernel, code: str) -> CellResult:
    """Run ``code`` as a cell that must succeed; its result."""
    result = kernel.execute(code)
    assert result.status == "ok", result.text()
    return result
