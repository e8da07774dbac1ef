"""Starting a job's ranks: each one's link, pipes and order, asked for side by side.

``starter(spec, ranks)`` is the start method's starter; ``order(...)`` is a rank's ``RunOrder``.
``ask(start, order)`` makes the rank's link and pipes, keeps the notebook's ends and asks for the
process without waiting; ``Asked.take()`` waits for its pid and returns ``RankPipes``. Ask for every
rank before taking any. Until taken, ``Asked.give_up()`` releases everything.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass

from nbddp.launcher.config import JobSpec, NodeSlice
from nbddp.launcher.fds import NOTEBOOK_FDS
from nbddp.launcher.forkserver_link import FORKSERVER, ForkserverLaunch, pool_request
from nbddp.launcher.relay import RankPipes
from nbddp.launcher.starters import ChildFds, ForkStarter, SpawnStarter, Starter, Starting
from nbddp.wire.protocol import CallRef, Placement, RunOrder


def starter(spec: JobSpec, ranks: int) -> Starter:
    """The starter of ``spec``'s start method, for ``ranks`` ranks on this machine."""
    if spec.start_method == "spawn":
        return SpawnStarter()
    if spec.start_method == "fork":
        return ForkStarter()
    return ForkserverLaunch(FORKSERVER, pool_request(spec, ranks))


def order(
    spec: JobSpec, node: NodeSlice, rank: int, port: int, call: CallRef, run_id: str
) -> RunOrder:
    env = {
        **os.environ,
        "NBDDP_ROLE": "worker",
        "NBDDP_RUN_ID": run_id,
        **spec.rank_env(node, rank, port),
    }
    place = Placement(
        rank=node.first_rank + rank,
        local_rank=rank,
        world_size=spec.world_size,
        device=spec.device,
        cuda_index=rank if spec.device == "cuda" else None,
    )
    return RunOrder(
        place=place,
        env=env,
        call=call,
        sys_path=list(sys.path),
        cwd=os.getcwd(),
        backend=spec.backend,
        init_process_group=spec.init_process_group,
        threads=spec.threads(node.ranks),
        debug=spec.debug,
    )


@dataclass
class Asked:
    """A rank asked of the starter, not yet taken: the notebook's ends of its fds."""

    order: RunOrder
    ours: socket.socket
    out_r: int
    err_r: int
    starting: Starting | None = None

    def take(self) -> tuple[int, RankPipes]:
        """Wait for the rank's pid; from then on its fds are the caller's."""
        starting, self.starting = self.starting, None  # child() releases its own if it raises
        assert starting is not None
        try:
            child = starting.child()
        except BaseException:
            self.give_up()
            raise
        NOTEBOOK_FDS.keep(child.status_fd)
        return child.pid, RankPipes(self.out_r, self.err_r, self.ours, child.status_fd)

    def give_up(self) -> None:
        """Close the notebook's ends: a worker started for this rank finds its link closed."""
        if self.starting is not None:
            self.starting.abandon()
        for fd in (self.ours.fileno(), self.out_r, self.err_r):
            NOTEBOOK_FDS.release(fd)
        self.ours.close()
        os.close(self.out_r)
        os.close(self.err_r)


def ask(start: Starter, run: RunOrder) -> Asked:
    """Ask ``start`` for the process of the rank ``run`` is for, without waiting."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    NOTEBOOK_FDS.keep(ours.fileno(), out_r, err_r)
    asked = Asked(run, ours, out_r, err_r)
    try:
        asked.starting = start.start(ChildFds(theirs.fileno(), out_w, err_w), run.env)
    except BaseException:
        asked.give_up()
        raise
    finally:
        theirs.close()
        os.close(out_w)
        os.close(err_w)
    return asked
