"""The notebook path on real GPUs: a kernel that has touched CUDA runs ``%%ddp`` on nccl, and a
session keeps a CUDA DDP model through a cell that fails. Skipped without CUDA
(``conftest.py``) and without ipykernel and jupyter_client (see test_gpu.py for how to run it).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("ipykernel")
pytest.importorskip("jupyter_client")

from tests.kernel.kernel import Kernel, ok

DATA = """\
import torch
torch.zeros(1, device="cuda")  # the notebook has initialised CUDA, as most have
X, y = torch.randn(512, 64), torch.randint(0, 10, (512,))
"""

# The README's cell, on one GPU, with a tqdm bar (stderr) and a print (stdout) each epoch.
TRAIN = """\
%%ddp --gpus 1 --out state
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
model = DDP(model.to(device), device_ids=[local_rank] if device.type == "cuda" else None)
opt = torch.optim.SGD(model.parameters(), lr=0.5)
for epoch in range(2):
    for _ in tqdm(range(20), desc=f"epoch {epoch}"):
        loss = torch.nn.functional.cross_entropy(model(X.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch} finished on {device} with {dist.get_backend()}")
state = model.module.state_dict()
"""


@pytest.fixture(scope="module")
def cuda_notebook() -> Iterator[Kernel]:
    with Kernel() as kernel:
        ok(kernel, DATA)
        ok(kernel, "%load_ext nbddp\nimport torch.distributed as dist")
        yield kernel


def test_a_ddp_cell_trains_on_the_gpu_in_a_kernel_that_touched_cuda(cuda_notebook: Kernel) -> None:
    result = ok(cuda_notebook, TRAIN)
    out = result.rank_output
    firsts = [out.index(f"epoch {e} finished on cuda:0 with nccl") for e in (0, 1)]
    assert firsts[0] < out.index("epoch 1:") < firsts[1], out  # in the order written
    devices = ok(cuda_notebook, "sorted({t.device.type for t in state.values()})").result
    assert devices == "['cpu']"


SESSION_CELLS = (
    "%ddp_session start --gpus 1",
    "%%ddp\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
    "model = DDP(torch.nn.Linear(64, 10).to(device), device_ids=[local_rank])\n"
    "before = model.module.weight.detach().clone()",
)


def test_a_session_keeps_its_cuda_ddp_model_through_a_failing_cell(cuda_notebook: Kernel) -> None:
    try:
        for cell in SESSION_CELLS:
            ok(cuda_notebook, cell)
        failed = cuda_notebook.execute("%%ddp\nraise ValueError('a bad batch')")
        assert failed.error is not None and failed.error["ename"] == "ValueError"
        step = ok(
            cuda_notebook,
            "%%ddp\nloss = model(X[:32].to(device)).square().mean()\nloss.backward()\n"
            "(str(model.module.weight.device), bool(torch.equal(before, model.module.weight)))",
        )
        assert step.result == "('cuda:0', True)"
        table = ok(cuda_notebook, "%ddp_session").text()
        assert "MiB" in table, table  # the rank's device memory is shown
    finally:
        ok(cuda_notebook, "%ddp_session stop")
