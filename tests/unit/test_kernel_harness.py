"""The kernel tests' harness: a cell's result holds its UsageError line even when the kernel
sends it after its idle status (ipykernel 6.5 does not wait for its stream flush while another
thread holds the import lock, as nbddp's background import of torch does)."""

from __future__ import annotations

import queue
from typing import Any

from tests.kernel.kernel import Kernel


class _LateStderrClient:
    """A kernel client whose cell's stderr line comes after the cell's idle status."""

    def __init__(self) -> None:
        parent = {"msg_id": "cell"}
        self.iopub: queue.Queue[dict[str, Any]] = queue.Queue()
        for msg_type, content in (
            ("status", {"execution_state": "busy"}),
            ("status", {"execution_state": "idle"}),
            ("stream", {"name": "stderr", "text": "UsageError: no session is running\n"}),
        ):
            self.iopub.put({"msg_type": msg_type, "content": content, "parent_header": parent})
        self.reply = {
            "parent_header": parent,
            "content": {"status": "error", "ename": "UsageError", "evalue": "no session"},
        }

    def get_iopub_msg(self, timeout: float) -> dict[str, Any]:
        return self.iopub.get(timeout=timeout)

    def get_shell_msg(self, timeout: float) -> dict[str, Any]:
        return self.reply


def test_a_usage_error_line_sent_after_idle_is_in_the_result() -> None:
    kernel = Kernel()
    kernel.kc = _LateStderrClient()  # type: ignore[assignment]
    result = kernel.collect("cell", timeout=5)
    assert result.status == "error"
    assert result.stderr == "UsageError: no session is running\n"
