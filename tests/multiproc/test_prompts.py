"""A rank's ``input()`` and ``breakpoint()`` from a script: the prompt is on the terminal
(the driver's stdin), naming the rank; with no more input, the rank reads end of input."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import nbddp

    def greet():
        import torch.distributed as dist
        rank = dist.get_rank()
        if rank == 1:
            name = input("who? ")
            print("hello", name)
            breakpoint()
            marker = "inside " + name
        dist.barrier()  # rank 0 asks once rank 1 is through
        try:
            input("more? ")
        except EOFError:
            print("end of input on", rank)
        return rank

    print("value", nbddp.launch(greet, procs=2, init_process_group=True))
    """
)


def _run(tmp_path: Path, stdin: str, **env_vars: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "greet.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), **env_vars}
    return subprocess.run(
        [sys.executable, str(script)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=tmp_path,
    )


def test_prompts_are_asked_on_the_terminal_and_answered_from_its_stdin(tmp_path: Path) -> None:
    done = _run(tmp_path, "ada\nn\np marker\nc\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "who? [rank 1] " in out, out
    assert "[rank 1] hello ada" in out, out
    assert "(Pdb) [rank 1] " in out, out
    assert "more? [rank 0] " in out and "more? [rank 1] " in out, out
    assert "[rank 1] 'inside ada'" in out, out  # pdb ran in the rank, on its frame
    # Both ranks then read end of input: the script's stdin has nothing more.
    assert "[rank 0] end of input on 0" in out and "[rank 1] end of input on 1" in out, out
    assert "value 0" in out, out


def test_breakpoint_prompts_after_ray_init_set_its_hook(tmp_path: Path) -> None:
    # ray.init() sets PYTHONBREAKPOINT in the driver's environment to a hook that
    # works only in Ray's own processes; ranks inherit it.
    done = _run(tmp_path, "ada\nc\n", PYTHONBREAKPOINT="ray.util.rpdb._driver_set_trace")
    assert done.returncode == 0, done.stderr
    assert "(Pdb) [rank 1] " in done.stdout, done.stdout


def test_a_breakpoint_hook_the_user_chose_is_kept(tmp_path: Path) -> None:
    done = _run(tmp_path, "ada\n", PYTHONBREAKPOINT="0")
    assert done.returncode == 0, done.stderr
    assert "(Pdb)" not in done.stdout, done.stdout


def test_spawn_and_notebook_launcher_ranks_ask_too(tmp_path: Path) -> None:
    script = tmp_path / "dropin.py"
    script.write_text(
        textwrap.dedent(
            """
            import os
            import nbddp

            def by_index(i):
                if i == 1:
                    print("got", input("name? "))

            def by_env():
                if os.environ["RANK"] == "0":
                    print("got", input("again? "))

            nbddp.spawn(by_index, nprocs=2)
            nbddp.notebook_launcher(by_env, num_processes=2)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(
        [sys.executable, str(script)],
        input="ada\nbob\n",
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "name? [rank 1] " in done.stdout and "[rank 1] got ada" in done.stdout, done.stdout
    assert "again? [rank 0] " in done.stdout and "[rank 0] got bob" in done.stdout, done.stdout
