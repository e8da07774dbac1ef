"""An allocation nbddp asks Slurm for itself (``SlurmCluster(partition=...)``, a login node).

Contract: ``allocate(cluster, nodes, gpus)`` returns an ``Allocation`` once Slurm has started it,
saying in the cell meanwhile that it is queued and why (``Slurm job 1234 pending (Resources),
0:45``); an interrupt while queued cancels the request; a request Slurm refuses raises
``ConfigError`` with Slurm's own words. An allocation without ``keep`` is held by ``salloc`` running
``cat`` on a pipe of this process: when this process ends, killed included, the pipe closes and
Slurm gets the allocation back; ``end()`` gives it back at once. With ``keep`` it is Slurm's
``--no-shell`` allocation named ``nbddp-<name>``: found again by a later process asking for that
name, and ended only by ``cancel_kept`` (``nbddp.cluster.release()``) or its time limit.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from nbddp.errors import ConfigError
from nbddp.launcher.clusters import SlurmCluster

log = logging.getLogger(__name__)

LOOK_EVERY = 1.0  # seconds between looks at a queued request

_kept: set[str] = set()  # kept allocations this process used (cancel_kept)


@dataclass
class Allocation:
    job: str
    salloc: subprocess.Popen[str] | None
    keep: bool

    def end(self) -> None:
        """Give the allocation back to Slurm, unless it is kept."""
        if self.keep:
            return
        slurm("scancel", self.job)
        if self.salloc is not None:
            with contextlib.suppress(OSError):
                if self.salloc.stdin is not None:
                    self.salloc.stdin.close()
            try:
                self.salloc.wait(10)
            except subprocess.TimeoutExpired:
                self.salloc.kill()
                self.salloc.wait()


def allocate(cluster: SlurmCluster, nodes: int, gpus: int) -> Allocation:
    """An allocation of ``nodes`` nodes with ``gpus`` GPUs each (module contract)."""
    name = f"nbddp-{cluster.name}" if cluster.keep else "nbddp"
    if cluster.keep:
        found = slurm("squeue", "-h", f"--name={name}", "-o", "%i").split()
        if found:
            _kept.add(found[0])
            _wait(found[0], None)
            return Allocation(found[0], None, keep=True)
    salloc = shutil.which("salloc")
    if salloc is None:
        raise ConfigError(f"cluster={cluster} needs Slurm's salloc on PATH, and it is not there")
    command = [salloc, f"--nodes={nodes}", f"--job-name={name}", *cluster.salloc_args()]
    command += [f"--gpus-per-node={gpus}"] if gpus and not cluster.gpus_per_node else []
    # Why cat: salloc gives the allocation back once its command ends, and cat ends
    # when this process does, however it ends.
    command += ["--no-shell"] if cluster.keep else ["cat"]
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL if cluster.keep else subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    job = None
    try:
        job = _job_of(proc)
        if cluster.keep:
            _kept.add(job)
        _wait(job, None if cluster.keep else proc)  # salloc --no-shell ends once granted
    except BaseException:
        if job is not None:
            slurm("scancel", job)
        proc.kill()
        proc.wait()
        raise
    return Allocation(job, proc, cluster.keep)


def cancel_kept(busy: set[str]) -> None:
    """End the kept allocations this process used, but those of jobs ``busy``."""
    for job in _kept - busy:
        _kept.discard(job)
        slurm("scancel", job)


def _job_of(proc: subprocess.Popen[str]) -> str:
    """The job id salloc says it asked for; ``ConfigError`` with its words if refused."""
    assert proc.stderr is not None
    said = []
    for line in proc.stderr:
        for mark in ("Pending job allocation ", "Granted job allocation "):
            if mark in line:
                threading.Thread(target=_drain, args=(proc,), daemon=True).start()
                return line.split(mark, 1)[1].split()[0]
        said.append(line.strip().removeprefix("salloc: error: "))
    proc.stderr.close()
    proc.wait()
    raise ConfigError(f"Slurm refused the allocation: {'; '.join(said) or 'salloc failed'}")


def _drain(proc: subprocess.Popen[str]) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        log.info("nbddp: salloc: %s", line.rstrip())
    proc.stderr.close()


def _wait(job: str, proc: subprocess.Popen[str] | None) -> None:
    """Until Slurm starts ``job``, saying in the cell why it waits."""
    started, shown = time.monotonic(), False
    while True:
        state, _, reason = slurm("squeue", "-h", "-j", job, "-o", "%T|%r").strip().partition("|")
        if state == "RUNNING":
            break
        if state != "PENDING" or (proc is not None and proc.poll() is not None):
            raise ConfigError(f"Slurm job {job} ended before it started ({state or 'gone'})")
        waited = int(time.monotonic() - started)
        sys.stderr.write(
            f"\rnbddp: Slurm job {job} pending ({reason}), {waited // 60}:{waited % 60:02d}"
        )
        shown = True
        time.sleep(LOOK_EVERY)
    if shown:
        sys.stderr.write(f"\rnbddp: Slurm job {job} started{' ' * 30}\n")


def slurm(*command: str) -> str:
    """What a Slurm command (``squeue -h ...``) writes to its stdout."""
    return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
