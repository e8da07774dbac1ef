"""Which display a launch gets: kernel blocks in a kernel, text elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from nbddp.display.kernel import KernelDisplay
from nbddp.display.text import TextDisplay
from nbddp.errors import ConfigError
from nbddp.launcher.entry import in_kernel, make_display


def fake_ipython(monkeypatch: pytest.MonkeyPatch, shell: object) -> None:
    module = types.ModuleType("IPython")
    module.get_ipython = lambda: shell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", module)
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))


def test_text_outside_a_kernel() -> None:
    assert not in_kernel()
    assert isinstance(make_display("all"), TextDisplay)


def test_text_in_terminal_ipython(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_ipython(monkeypatch, types.SimpleNamespace())  # a shell without a kernel
    assert isinstance(make_display("all"), TextDisplay)


def test_blocks_in_a_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_ipython(monkeypatch, types.SimpleNamespace(kernel=object()))
    display = make_display("rank0", tail=5)
    assert isinstance(display, KernelDisplay)
    assert display.tail == 5


def test_bad_output_and_tail_are_refused() -> None:
    with pytest.raises(ConfigError, match="all, rank0, none"):
        make_display("some")
    with pytest.raises(ConfigError, match="tail=0"):
        make_display("all", tail=0)


def test_importing_nbddp_does_not_import_ipython() -> None:
    code = "import nbddp, sys; print(sorted({'IPython', 'pandas'} & set(sys.modules)))"
    env = {**os.environ, "NBDDP_PREWARM": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
