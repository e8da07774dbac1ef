"""What a rank writes to ``sys.stdout`` and ``sys.stderr`` reaches its block and its log
in the order it was written: a progress bar (stderr) then a line (stdout), per epoch."""

from __future__ import annotations

from nbddp.entry import start_with_display
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.logs import read_rank_log
from tests.displays import Recorder
from tests.multiproc import fns

EPOCHS = 200


def expected() -> str:
    return "".join(
        "".join(f"\rbar {e}: {s}/3" for s in range(1, 4)) + f"\nepoch {e} finished\n"
        for e in range(EPOCHS)
    )


def test_a_ranks_stdout_and_stderr_arrive_in_the_order_written() -> None:
    display = Recorder()
    config = LaunchConfig.build(procs=2)
    run = start_with_display(config, fns.bar_then_print, (EPOCHS,), {}, display)
    run.wait()
    for rank in (0, 1):
        shown = "".join(text for r, text in display.chunks if r == rank)
        assert shown == expected(), shown[:400]
        logged = read_rank_log(run.log_dir, rank, 2)
        assert logged == expected(), logged[:400]
