"""``%%ddp --cluster slurm`` and a session across the allocation's nodes in a real kernel
started inside the allocation; a killed kernel leaves no rank, agent or step behind."""

from __future__ import annotations

import psutil

from tests.kernel.kernel import Kernel, ok
from tests.procs import wait_procs_gone
from tests.slurm.conftest import steps


def test_a_ddp_cell_and_a_session_run_on_both_nodes(in_allocation: str) -> None:
    with Kernel() as kernel:
        ok(kernel, "%load_ext nbddp")
        result = kernel.execute(
            "%%ddp --nodes 2 --procs 1 --cluster slurm\n"
            "import os\n"
            "print(f'rank {rank} of {world_size} on {os.environ[\"SLURMD_NODENAME\"]}')\n",
            timeout=180,
        )
        assert result.status == "ok", result.text()
        assert "[rank 0] rank 0 of 2 on n1\n" in result.rank_output
        assert "[rank 1] rank 1 of 2 on n2\n" in result.rank_output
        result = kernel.execute(
            "%%ddp --nodes 2 --procs 1 --cluster slurm\nif rank == 1:\n    raise KeyError('k')\n"
        )
        assert result.status == "error" and result.error is not None, result.text()
        assert "raised on rank 1 of 2 on node 1 (127.0.0.1)" in "\n".join(result.error["traceback"])
        result = kernel.execute("%ddp_session start --nodes 2 --procs 1 --cluster slurm", 180)
        assert result.status == "ok", result.text()
        result = kernel.execute("%%ddp\nimport os\nwhere = os.environ['SLURMD_NODENAME']\n")
        assert result.status == "ok", result.text()
        result = kernel.execute("%%ddp\nif rank == 1:\n    raise LookupError(f'not on {where}')\n")
        assert result.status == "error" and result.error is not None, result.text()
        assert result.error["ename"] == "LookupError"
        shown = "\n".join(result.error["traceback"])
        assert "not on n2" in shown and "raised on rank 1 of 2 on node 1 (127.0.0.1)" in shown
        result = kernel.execute("%%ddp\nprint('still', where)\n")  # the state is kept
        assert result.status == "ok", result.text()
        assert "[rank 0] still n1\n" in result.rank_output
        assert "[rank 1] still n2\n" in result.rank_output
        ok(kernel, "%ddp_session stop")
        # Set once for every later cell, with salloc's flags quoted as one value.
        ok(kernel, "%ddp_config --nodes 2 --procs 1 --cluster 'slurm --time 10'")
        result = kernel.execute(
            "%%ddp\nimport os\nprint(os.environ['SLURM_JOB_ID'] != '')\n", timeout=180
        )
        assert result.status == "ok", result.text()
        assert "[rank 1] True\n" in result.rank_output
        result = kernel.execute("import nbddp\nprint(nbddp.cluster.describe())")
        assert "slurm --time=10: 2 agents" in result.stdout, result.text()
        ok(kernel, "nbddp.cluster.release()")


def test_prompts_from_a_rank_on_either_node_are_answered_in_the_cell(in_allocation: str) -> None:
    answers = iter(["p where * 2", "c"])
    passwords: list[str] = []

    def respond(prompt: str, password: bool) -> str:
        if password:
            passwords.append(prompt)
            return "s3cret"
        return "alice" if prompt.startswith("name?") else next(answers)

    with Kernel() as kernel:
        ok(kernel, "%load_ext nbddp")
        code = (
            "%%ddp --nodes 2 --procs 1 --cluster slurm\n"
            "import getpass, os\nwhere = os.environ['SLURMD_NODENAME']\n"
            "if rank == 1:\n    breakpoint()\n    print('secret', len(getpass.getpass()))\n"
            "if rank == 0:\n    print('name', input('name? '))\n"
        )
        result, prompts = kernel.execute_answering(code, respond, 180)
    assert result.status == "ok", result.text()
    assert sorted(prompts) == [
        "(Pdb) [rank 1] ",
        "(Pdb) [rank 1] ",
        "Password: [rank 1] ",
        "name? [rank 0] ",
    ], prompts
    assert passwords == ["Password: [rank 1] "], passwords  # asked as a password
    assert "[rank 1] 'n2n2'\n" in result.rank_output, result.rank_output
    assert "[rank 1] secret 6\n" in result.rank_output, result.rank_output
    assert "[rank 0] name alice\n" in result.rank_output


def test_an_interrupt_ends_every_rank_on_both_nodes(in_allocation: str) -> None:
    with Kernel() as kernel:
        ok(kernel, "%load_ext nbddp")
        msg_id = kernel.kc.execute(
            "%%ddp --nodes 2 --procs 1 --cluster slurm\n"
            "import os, time\nprint('PID', os.getpid(), flush=True)\ntime.sleep(600)\n"
        )
        kernel.wait_for_output(msg_id, "PID", timeout=120)
        kernel.interrupt()
        result = kernel.collect(msg_id, timeout=60)
    assert result.error is not None and result.error["ename"] == "KeyboardInterrupt"
    pids = [int(line.split()[-1]) for line in result.rank_output.splitlines() if "PID" in line]
    assert pids and not wait_procs_gone(
        [psutil.Process(p) for p in pids if psutil.pid_exists(p)], 10
    )


def test_a_killed_kernel_with_a_run_and_a_session_leaves_nothing(in_allocation: str) -> None:
    with Kernel() as doomed:
        ok(doomed, "%load_ext nbddp")
        result = doomed.execute("%ddp_session start --nodes 2 --procs 1 --cluster slurm", 180)
        assert result.status == "ok", result.text()
        ok(
            doomed,
            "import nbddp, time\nrun = nbddp.launch(time.sleep, 600, nodes=2, procs=1, "
            "cluster='slurm', block=False)\nwhile len(run.pids) < 2: time.sleep(0.05)",
        )
        result = doomed.execute(
            "from nbddp.cluster import agents\n"
            "print(*run.pids.values(), *(i.pid for s in agents.kept() for i in s.infos))"
        )
        assert result.status == "ok", result.text()
        pids = [int(pid) for pid in result.stdout.split()]
        assert len(pids) == 4 and len(steps(in_allocation)) == 1, pids  # one set of agents
        procs = [psutil.Process(pid) for pid in pids]
        doomed.kill()
        assert not wait_procs_gone(procs, timeout=30), "alive 30 s after the kernel was killed"
