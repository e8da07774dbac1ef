"""nbddp on real GPUs: nccl groups, device selection, CUDA values, accelerate in bf16.

Run from the checkout on a machine with CUDA GPUs: ``python3 -m pytest tests/gpu``
(skipped where none is visible). It needs torch with CUDA, nbddp's own
dependencies (cloudpickle, psutil), pytest, and for two tests accelerate and
IPython; test_gpu_kernel.py ipykernel and jupyter_client; nothing from JupyterLab or
Playwright. test_gpu_frameworks.py also needs deepspeed for its DeepSpeed test (skipped
without it). On a machine with no network, carry their wheels: ``pip download pytest
pytest-timeout cloudpickle psutil accelerate ipython ipykernel jupyter_client -d wheels``
on a machine that has one, then
``pip install --no-index --find-links wheels ...`` there. Every test checks
that no rank process is left over (tests/conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import nbddp
from tests.gpu import fns

ROOT = Path(__file__).resolve().parents[2]


def _physical_uuid(index: int) -> str:
    """The UUID of the notebook's GPU ``index``, asked in a child (CUDA stays untouched here)."""
    code = f"import torch; print(torch.cuda.get_device_properties({index}).uuid)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    return done.stdout.strip()


def _tensors(value: Any) -> list[Any]:
    """Every tensor inside ``value`` (dicts, sequences, dataclasses)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if hasattr(value, "__dataclass_fields__"):
        return [t for name in value.__dataclass_fields__ for t in _tensors(getattr(value, name))]
    return []


def test_an_nccl_group_spans_every_visible_gpu(gpus: int) -> None:
    views = nbddp.launch(fns.nccl_view, gpus=gpus, output="none")
    assert len(views) == gpus
    expected = float(sum(range(1, gpus + 1)))
    for rank, view in enumerate(views):
        assert view["rank"] == view["local_rank"] == view["current_device"] == rank
        assert view["world_size"] == gpus
        assert view["tensor_device"] == f"cuda:{rank}"
        assert view["sum"] == [expected] * 4
    assert len({v["uuid"] for v in views}) == gpus  # one physical GPU per rank


def test_gpus_list_selects_that_physical_gpu_as_cuda_0(gpus: int) -> None:
    last = gpus - 1
    seen = nbddp.launch(fns.device_zero, gpus=[last], output="none")
    assert seen["count"] == 1 and seen["current_device"] == 0
    assert seen["uuid"] == _physical_uuid(last)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    expected_token = visible.split(",")[last].strip() if visible else str(last)
    assert seen["visible"] == expected_token


def test_cuda_values_come_back_on_the_cpu_with_their_types_and_values() -> None:
    import torch

    value = nbddp.launch(fns.cuda_values, gpus=1, output="none")
    found = _tensors(value)
    assert len(found) == 6  # tensor, weight, bias, x, and the two nested ones
    assert all(t.device.type == "cpu" for t in found)
    assert torch.equal(value["tensor"], torch.arange(6.0))
    assert list(value["state"]) == ["weight", "bias"]
    assert type(value["batch"]).__name__ == "Batch"
    assert int(value["batch"].meta["nested"][1][0]) == 3


def test_ddp_out_brings_a_cuda_state_dict_back_on_the_cpu() -> None:
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbddp")
    cell = textwrap.dedent(
        """\
        import torch
        state = torch.nn.Linear(3, 2).cuda().state_dict()
        """
    )
    result = shell.run_cell(f"%%ddp --gpus 1 --out state\n{cell}")
    result.raise_error()
    state = shell.user_ns["state"]
    assert list(state) == ["weight", "bias"]
    assert all(t.device.type == "cpu" for t in state.values())


def test_launching_after_the_notebook_initialised_cuda(tmp_path: Path) -> None:
    # In a fresh interpreter: CUDA initialised by the "notebook" before any launch.
    script = textwrap.dedent(
        """\
        import torch
        import nbddp
        from tests.gpu import fns

        torch.zeros(1, device="cuda")
        assert torch.cuda.is_initialized()
        for method in ("forkserver", "spawn"):
            got = nbddp.launch(fns.cuda_sum, gpus=1, start_method=method, output="none")
            print(method, got)
        try:
            nbddp.launch(fns.cuda_sum, gpus=1, start_method="fork", output="none")
        except nbddp.ConfigError as exc:
            print("fork refused:", exc)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "forkserver 6.0" in done.stdout and "spawn 6.0" in done.stdout
    assert "fork refused: start_method='fork' cannot start GPU ranks" in done.stdout


def test_accelerate_trains_in_bf16_on_the_gpu_through_notebook_launcher(gpus: int) -> None:
    pytest.importorskip("accelerate")
    seen = nbddp.notebook_launcher(
        fns.accelerate_bf16_train, num_processes=gpus, mixed_precision="bf16"
    )
    assert seen["device"] == "cuda:0"  # rank 0's value
    assert seen["num_processes"] == gpus
    assert seen["mixed_precision"] == "bf16"
    assert seen["autocast_dtype"] == "torch.bfloat16"
    assert seen["last_loss"] < seen["first_loss"]
