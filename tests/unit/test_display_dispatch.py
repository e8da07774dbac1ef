"""Which display a launch gets: kernel blocks in a kernel, text elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from nbddp.display.guard import Guarded
from nbddp.display.kernel import KernelDisplay
from nbddp.display.text import TextDisplay
from nbddp.entry import in_kernel, make_display
from nbddp.errors import ConfigError
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.devices import VisibleGpus

NO_GPU = VisibleGpus((), "none in a test")


def config(**kw: object) -> LaunchConfig:
    return LaunchConfig.build(procs=2, visible=NO_GPU, **kw)  # type: ignore[arg-type]


def shown(config: LaunchConfig) -> object:
    """The display a launch of ``config`` gets, inside the guard every launch has."""
    display = make_display(config.view)
    assert isinstance(display, Guarded)
    return display.inner


def fake_ipython(monkeypatch: pytest.MonkeyPatch, shell: object) -> None:
    module = types.ModuleType("IPython")
    module.get_ipython = lambda: shell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", module)
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))


def test_text_outside_a_kernel() -> None:
    assert not in_kernel()
    assert isinstance(shown(config()), TextDisplay)


def test_text_in_terminal_ipython(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_ipython(monkeypatch, types.SimpleNamespace())  # a shell without a kernel
    assert isinstance(shown(config()), TextDisplay)


def test_blocks_in_a_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_ipython(monkeypatch, types.SimpleNamespace(kernel=object()))
    display = shown(config(output="rank0", tail=5))
    assert isinstance(display, KernelDisplay)
    assert (display.model.tail, display.model.live) == (5, {0})


@pytest.mark.parametrize(("output", "ranks"), [("all", None), ("rank0", {0}), ("none", set())])
def test_output_chooses_the_ranks_shown(output: str, ranks: set[int] | None) -> None:
    display = shown(config(output=output))
    assert isinstance(display, TextDisplay)
    assert display._ranks == ranks


def test_bad_output_and_tail_are_refused_when_the_config_is_built() -> None:
    with pytest.raises(ConfigError, match="unknown output 'some'; choose one of all, rank0, none"):
        config(output="some")
    with pytest.raises(ConfigError, match=r"tail=0 shows nothing; use tail=1 or more"):
        config(tail=0)
    with pytest.raises(ConfigError, match="tail must be a positive whole number"):
        config(tail="5")


def test_importing_nbddp_does_not_import_ipython() -> None:
    code = "import nbddp, sys; print(sorted({'IPython', 'pandas'} & set(sys.modules)))"
    env = {**os.environ, "NBDDP_PREWARM": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
