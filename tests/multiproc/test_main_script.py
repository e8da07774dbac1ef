"""Code defined in ``__main__`` (a script run with python) works under every start method,
and workers never re-run the script; killing the script leaves no worker behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.procs import wait_procs_gone

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from torch.utils.data import DataLoader, Dataset
    import nbddp

    print("script body ran", file=sys.stderr)  # must appear once: workers never re-run it

    class Squares(Dataset):
        def __len__(self):
            return 8
        def __getitem__(self, i):
            return torch.tensor(float(i * i))

    class Scaler:
        def __init__(self, k):
            self.k = k

    def make_closure(k):
        scale = Scaler(k)
        def train(offset):
            import torch.distributed as dist
            dist.init_process_group("gloo")
            loader = DataLoader(Squares(), batch_size=4, num_workers=2)
            total = sum(float(b.sum()) for b in loader) * scale.k + offset
            t = torch.tensor([total])
            dist.all_reduce(t)
            dist.destroy_process_group()
            return {"total": t.item(), "lam": (lambda x: x + 1)(1)}
        return train

    {guard}
        method = sys.argv[1]
        value = nbddp.launch(make_closure(2), 1.0, procs=2, start_method=method, output="none")
        print(json.dumps(value))
    """
)


@pytest.mark.parametrize("guard", [True, False])
@pytest.mark.parametrize("method", ["forkserver", "spawn", "fork"])
def test_main_functions_classes_and_datasets_work(tmp_path: Path, method: str, guard: bool) -> None:
    head = 'if __name__ == "__main__":' if guard else "if True:"
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("{guard}", head))
    proc = subprocess.run(
        [sys.executable, str(script), method],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    # sum of squares 0..7 = 140, times 2, plus 1, on two ranks
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"total": 562.0, "lam": 2}
    assert proc.stderr.count("script body ran") == 1


HANG = textwrap.dedent(
    """
    import sys, threading
    import nbddp

    def hang():
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        it = iter(DataLoader(TensorDataset(torch.zeros(8)), num_workers=2))
        next(it)  # DataLoader workers now running too
        print("ready", flush=True)
        threading.Event().wait()

    nbddp.launch(hang, procs=2)
    """
)


def test_killing_the_notebook_process_takes_every_worker_down(tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    assert proc.stdout is not None
    try:
        ready = 0
        for line in proc.stdout:  # the script relays "[rank N] ready" lines
            ready += "ready" in line
            if ready == 2:
                break
        tree = psutil.Process(proc.pid).children(recursive=True)
        # the forkserver, 2 ranks with their keepers, and each rank's 2 DataLoader workers
        assert len(tree) == 9, tree
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert wait_procs_gone(tree, timeout=5.0) == []
