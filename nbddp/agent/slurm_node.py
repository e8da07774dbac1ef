"""The agent as a task of a Slurm job step: ``python -m nbddp.agent.slurm_node HOST:PORT``.

Contract: started by ``cluster.slurm_engine`` (``srun``, one task per node), it connects to the
notebook at ``HOST:PORT``, proves the launch's secret (``NBDDP_AGENT_SECRET``, taken out of its
environment before any rank starts) and says its node's index in the step (``SLURM_NODEID``), then
answers the notebook's calls (``wire.calls.serve``). Its node's address is the one it reached the
notebook from. It ends, and its ranks with it, when the connection ends.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from dataclasses import replace

from nbddp.agent.node import NodeAgent, NodeInfo
from nbddp.wire import calls

SECRET = "NBDDP_AGENT_SECRET"
CONNECT_TIMEOUT = 30.0

log = logging.getLogger(__name__)


class SlurmNodeAgent(NodeAgent):
    """A ``NodeAgent`` placed by Slurm, reached over ``sock``."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        super().__init__()

    def node_address(self) -> str:
        return str(self.sock.getsockname()[0])

    def node_id(self) -> str:
        return os.environ.get("SLURMD_NODENAME", socket.gethostname())

    def describe(self) -> NodeInfo:
        """As ``NodeAgent``'s, named as Slurm names the node (several may share a host)."""
        return replace(super().describe(), hostname=self.node_id())


def main(argv: list[str]) -> None:
    host, _, port = argv[1].rpartition(":")
    secret = os.environ.pop(SECRET, "")
    sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT)
    sock.settimeout(None)
    calls.prove(sock, secret, int(os.environ.get("SLURM_NODEID", "0")))
    calls.serve(sock, SlurmNodeAgent(sock))
    # Why _exit: the notebook is gone, and every rank's link closes with this process.
    log.info("nbddp agent: the notebook's connection ended; ending this node's ranks")
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
