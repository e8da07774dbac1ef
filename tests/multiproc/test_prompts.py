"""A rank's ``input()`` and ``breakpoint()`` from a script: the prompt is on the terminal
(the driver's stdin), naming the rank; with no more input, the rank reads end of input.
Then what the notebook's asker is given and answers: passwords, threads asking at once,
a frontend without stdin, ``--debug`` in a session, a rank's own ``KeyboardInterrupt``."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

import nbddp
from nbddp.entry import waited
from nbddp.errors import RankExitedError
from nbddp.rank.prompt import NoStdinError
from nbddp.wire.protocol import NO_STDIN, Answer
from tests.multiproc import prompt_fns as fns

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


def _run(
    tmp_path: Path, stdin: str, text: str = SCRIPT, **env_vars: str
) -> subprocess.CompletedProcess[str]:
    """Run ``text`` as a script in ``tmp_path``, its terminal's input ``stdin``."""
    script = tmp_path / "script.py"
    script.write_text(text)
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
    source = textwrap.dedent(
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
    done = _run(tmp_path, "ada\nbob\n", source)
    assert done.returncode == 0, done.stderr
    assert "name? [rank 1] " in done.stdout and "[rank 1] got ada" in done.stdout, done.stdout
    assert "again? [rank 0] " in done.stdout and "[rank 0] got bob" in done.stdout, done.stdout


def _asked_on(run: Any, answer: Answer) -> list[tuple[int, str, bool]]:
    """Answer every prompt of ``run`` with ``answer``; the prompts asked, filled in as
    ``run`` is waited for."""
    asked: list[tuple[int, str, bool]] = []

    def asker(rank: int, prompt: str, password: bool) -> Answer:
        asked.append((rank, prompt, password))
        return answer

    run.asker = asker
    return asked


def test_threads_of_a_rank_asking_at_once_each_get_their_own_line(tmp_path: Path) -> None:
    source = (
        "import nbddp\nfrom tests.multiproc.prompt_fns import ask_from_threads\n"
        "print('got', nbddp.launch(ask_from_threads, 4, procs=2))\n"
    )
    done = _run(tmp_path, "a\nb\nc\nd\n", source)
    assert done.returncode == 0, done.stderr
    asked = re.findall(r"(t\d)\? \[rank 1\] ", done.stdout)
    assert sorted(asked) == ["t0", "t1", "t2", "t3"], done.stdout
    # Rank 0 returns: the value shown is rank 0's, so each thread's line is in rank 1's output.
    for name, line in zip(asked, "abcd", strict=True):
        assert f"[rank 1] {name}? {line}\n" in done.stdout, done.stdout


def test_getpass_in_a_rank_asks_for_a_password_with_its_prompt() -> None:
    run = nbddp.launch(fns.secret, procs=2, output="none", block=False)
    asked = _asked_on(run, "s3cret")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run.wait()
    assert asked == [(1, "Password: ", True)]
    assert "Password: \n" in run.output(1) and "s3cret" not in run.output(1)
    assert "GetPassWarning" not in run.output(1)


@pytest.mark.parametrize("fn", [fns.read_a_line, fns.stop_at_a_breakpoint])
def test_a_frontend_without_stdin_is_the_ranks_one_line_error(fn: Any) -> None:
    run = nbddp.launch(fn, procs=2, output="none", block=False)
    asked = _asked_on(run, NO_STDIN)
    with pytest.raises(NoStdinError, match="not available in this frontend") as raised:
        run.wait()
    assert len(asked) == 1, asked
    assert "%ddp_debug" in str(raised.value) and "JupyterLab" in str(raised.value)


def test_plain_end_of_input_is_still_an_eof_error() -> None:
    run = nbddp.launch(fns.read_a_line, procs=2, output="none", block=False)
    _asked_on(run, None)
    with pytest.raises(EOFError) as raised:
        run.wait()
    assert str(raised.value) == ""


def test_a_session_with_debug_opens_no_debugger_for_sys_exit() -> None:
    with nbddp.session(procs=2, output="none") as session:
        config = dataclasses.replace(
            session.config, job=dataclasses.replace(session.config.job, debug=True)
        )
        for code in (3, 0):
            run = session.run_call(fns.exit_with, (code,), {}, config, None)
            asked = _asked_on(run, "q")
            with pytest.raises(RankExitedError, match=rf"sys.exit\({code}\)"):
                run.wait()
            assert asked == [], asked


def test_a_ranks_own_keyboard_interrupt_keeps_its_message() -> None:
    with pytest.raises(KeyboardInterrupt) as raised:
        waited(nbddp.launch(fns.raise_keyboard_interrupt, procs=2, output="none", block=False))
    assert str(raised.value) == "kbd-in-rank"


def test_debug_in_a_frontend_without_stdin_says_so_and_raises_the_ranks_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    def no_stdin(rank: int, prompt: str, password: bool = False) -> Answer:
        asked.append(prompt)
        return NO_STDIN

    monkeypatch.setattr(nbddp.launcher.run, "ask_rank", no_stdin)  # what a Run asks with
    with pytest.raises(ValueError, match="bad batch") as raised:
        nbddp.launch(fns.fail, procs=2, output="none", debug=True)
    assert asked == ["(Pdb) "], asked
    log = re.search(r"full output in (\S+)", "\n".join(raised.value.__notes__))
    assert log is not None, raised.value.__notes__
    assert "not available in this frontend" in Path(log.group(1)).read_text()
