"""A trivial cell's latency in real kernels: nbddp one-shot, nbddp session, nbdistributed.

    .venv/bin/python tests/bench/cell.py [--reps 10] [--rounds 3] [--warmup 2] [--pause 0.5]
        [--procs 2] [--only WORD ...] [--venv DIR] [--json PATH]

The cell (on ``--procs`` CPU ranks, gloo), one line in the notebook::

    import torch, torch.distributed as dist; t = torch.ones(1); dist.all_reduce(t);
    print(rank, t.item())

runs side by side, each variant in its own fresh Jupyter kernel (jupyter_client), as

- ``one-shot``: ``%%ddp --procs 2`` (fresh ranks per cell);
- ``session``: ``%ddp_session start --procs 2`` once, then plain ``%%ddp`` cells, and
  ``%ddp_session stop`` at the end;
- ``nbdistributed``: ``%load_ext nbdistributed``, ``%dist_init -n 2`` once, then
  ``%%distributed`` cells (its workers define ``rank`` and ``dist`` themselves), and
  ``%dist_shutdown`` at the end;
- ``launch``: the reference for the one-shot cell, ``nbddp.launch(fn, procs=2,
  init_process_group=True)`` of the same all_reduce and print, timed inside the kernel
  (one launch per cell, so its pauses are the cells'); its cell's wall time is shown too.

A cell's time runs from sending its ``execute_request`` until both its ``execute_reply``
and its ``idle`` status have arrived. After the set-up cells and ``--warmup`` cells per
variant (not counted), ``--rounds`` rounds each run ``--reps`` cells of every variant in
turn (the order reversed every other round, so a noisy machine's slow spells fall on all of
them alike), ``--pause`` seconds apart (not timed: a person between cells, time in which
nbddp's forkserver refills its pool). Every measured cell must show each rank's line
(``0 2.0``, ``1 2.0``): a cell that raised, or that printed an error instead (nbdistributed
catches errors and prints them), ends its variant with ``NAME: failed: ...`` instead of a
figure. The table gives the median, p95 and best, and the targets side by side: session
cell median <= 15 ms and <= 0.15x nbdistributed's; one-shot cell <= launch + 10 ms.

Then, per variant: the TCP ports its kernel's processes listen on once set up (the
kernel's own Jupyter channels left out), whether a cell that raises comes back as an error
(the reply's status), and any process that outlived the kernel's shutdown (reported,
then stopped by this script: nothing it started is left running).

nbdistributed is installed in the bench's own venv only (``--venv``, by default
``~/.cache/nbddp/bench-cell-venv``), never in the project's: the script makes it (a venv
whose ``.pth`` puts the project venv's site-packages after its own, so torch, IPython,
ipykernel and pyzmq are the project's very files), pip-installs
``tests/bench/requirements-cell.txt`` there with the project's torch, pyzmq, IPython,
ipykernel and jupyter_client versions as constraints, and checks that the venv imports
the project's torch. Its kernel runs on that venv's python with the venv's ``bin`` first on
``PATH`` (nbdistributed starts its workers as ``python worker.py``, found on ``PATH``).
nbddp's kernels run on this interpreter with this checkout first on ``PYTHONPATH``. Run
logs go to a temporary directory, removed at the end. ``--json`` also writes the table
to a file (``benchjson``, for ``plot.py``). Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import queue
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = Path(__file__).with_name("requirements-cell.txt")
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nbddp"
PINNED = ("torch", "pyzmq", "ipython", "ipykernel", "jupyter_client")
BODY = (
    "import torch, torch.distributed as dist; t = torch.ones(1); dist.all_reduce(t); "
    "print(rank, t.item())"
)
LAUNCH_SETUP = """\
import json, time
import torch, torch.distributed as dist
import nbddp

def trivial():
    t = torch.ones(1); dist.all_reduce(t); print(dist.get_rank(), t.item())

def fails():
    raise ValueError("bench probe")

_bench_times = []"""
LAUNCH_CELL = """\
_t0 = time.perf_counter()
nbddp.launch(trivial, procs={procs}, init_process_group=True)
_bench_times.append(time.perf_counter() - _t0)"""
PROBE = "raise ValueError('bench probe')"
FAILURE = re.compile(r"(?i)error|fail")
SETUP_FAILED = re.compile(r"(?im)^\W*(?:failed|error)\b")  # nbdistributed prints, not raises


# -- pure helpers ------------------------------------------------------------------------


def p95(times: Sequence[float]) -> float:
    """The 95th percentile by nearest rank: the smallest time at least 95% are not above."""
    ordered = sorted(times)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def missing_ranks(text: str, procs: int) -> list[int]:
    """The ranks whose ``RANK WORLD.0`` (the cell's print) is not in ``text``, whatever
    prefix the display put before it (``[rank 0] ``, indentation) or none, and whatever
    whitespace between the two (nbdistributed shows each ``write`` on a line of its own)."""
    value = re.escape(f"{float(procs)}")
    return [r for r in range(procs) if not re.search(rf"(?m)(?:^|[\s\]]){r}\s+{value}\s*$", text)]


def failure_line(text: str) -> str:
    """The line of a cell's output that best says what went wrong: the first naming an
    error or a failure, else the first non-empty one."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return "the cell showed nothing"
    return next((ln for ln in lines if FAILURE.search(ln)), lines[0])


def verdict(value: float | None, limit: float, unit: str, what: str) -> str:
    """One target line: the measured value, the limit, met or missed (n/a without a value)."""
    if value is None or math.isnan(value):
        return f"{what}: n/a (a variant it needs failed); target <= {limit:g}{unit}"
    met = "met" if value <= limit else "MISSED"
    return f"{what}: {value:.2f}{unit}; target <= {limit:g}{unit}: {met}"


# -- kernels -----------------------------------------------------------------------------


@dataclass
class Cell:
    """What one executed cell gave back."""

    seconds: float
    status: str
    """The reply's status: ok, error or aborted."""
    text: str
    """Every stream and text/plain output, and the traceback of an error, in order."""
    error: str = ""
    """``ename: evalue`` when the reply's status is error."""


def message_text(msg: dict[str, Any]) -> str:
    """What a person reads in one iopub message ('' for the others)."""
    content = msg["content"]
    kind = msg["msg_type"]
    if kind == "stream":
        return str(content["text"])
    if kind in ("execute_result", "display_data", "update_display_data"):
        return str(content.get("data", {}).get("text/plain", "")) + "\n"
    if kind == "error":
        return "\n".join(content["traceback"]) + "\n"
    return ""


def describe(proc: psutil.Process) -> str:
    """A process in a few words: its pid and command line, paths cut to their last part."""
    try:
        words = [os.path.basename(word) for word in proc.cmdline()]
    except psutil.Error:
        words = ["(gone)"]
    return f"pid {proc.pid}: {' '.join(words)[:70]}"


class BenchKernel:
    """A kernel on a given python and environment (a context manager). On exit it is shut
    down; any process it started that outlives that is recorded in ``leftovers`` and
    stopped."""

    def __init__(self, python: str, env: dict[str, str], spec_dir: Path) -> None:
        spec = spec_dir / "kernels" / "bench"
        spec.mkdir(parents=True, exist_ok=True)
        argv = [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        (spec / "kernel.json").write_text(json.dumps({"argv": argv, "language": "python"}))
        self.km = KernelManager(
            kernel_name="bench",
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]),
        )
        self.env = env
        self.leftovers: list[str] = []

    def __enter__(self) -> BenchKernel:
        self.km.start_kernel(env=self.env)
        self.kc = self.km.client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=60)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        started = self.descendants()
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)
        _, alive = psutil.wait_procs(started, timeout=10)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                self.leftovers.append(describe(proc))
                proc.kill()
        psutil.wait_procs(alive, timeout=10)

    @property
    def pid(self) -> int | None:
        """The kernel process id (None before it started)."""
        pid = getattr(getattr(self.km.provisioner, "process", None), "pid", None)
        return int(pid) if pid is not None else None

    def descendants(self) -> list[psutil.Process]:
        """Every live process the kernel started, directly or not."""
        try:
            return psutil.Process(self.pid).children(recursive=True) if self.pid else []
        except psutil.NoSuchProcess:
            return []

    def own_ports(self) -> set[int]:
        """The kernel's Jupyter channel ports."""
        info = self.km.get_connection_info()
        return {v for k, v in info.items() if k.endswith("_port") and isinstance(v, int)}

    def listening(self) -> list[str]:
        """``address:port (process)`` of every TCP socket the kernel's processes listen on,
        the kernel's own Jupyter channels left out."""
        own = self.own_ports()
        kernel = psutil.Process(self.pid)
        out = []
        for proc in [kernel, *self.descendants()]:
            with contextlib.suppress(psutil.Error):
                for conn in proc.net_connections(kind="tcp"):
                    if conn.status == psutil.CONN_LISTEN and conn.laddr.port not in own:
                        name = "kernel" if proc is kernel else describe(proc)
                        out.append(f"{conn.laddr.ip}:{conn.laddr.port} ({name})")
        return sorted(set(out))

    def joined(self) -> int:
        """How many of the kernel's descendants hold a TCP connection to a port the kernel
        listens on (beyond its Jupyter channels): nbdistributed's workers, once connected."""
        own = self.own_ports()
        ports = {
            c.laddr.port
            for c in psutil.Process(self.pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port not in own
        }
        count = 0
        for proc in self.descendants():
            with contextlib.suppress(psutil.Error):
                conns = proc.net_connections(kind="tcp")
                count += any(c.raddr and c.raddr.port in ports for c in conns)
        return count

    def run(self, code: str, timeout: float) -> Cell:
        """Execute ``code`` as a cell; time it until both its reply and its idle status."""
        start = time.perf_counter()
        msg_id = self.kc.execute(code, allow_stdin=False)
        parts = []
        while True:
            msg = self._next(self.kc.get_iopub_msg, timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            parts.append(message_text(msg))
        reply = self._next(self.kc.get_shell_msg, timeout)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self._next(self.kc.get_shell_msg, timeout)
        seconds = time.perf_counter() - start
        content = reply["content"]
        error = f"{content.get('ename')}: {content.get('evalue')}" if "ename" in content else ""
        return Cell(seconds, content["status"], "".join(parts), error)

    @staticmethod
    def _next(get: Any, timeout: float) -> dict[str, Any]:
        try:
            return dict(get(timeout=timeout))
        except queue.Empty:
            raise TimeoutError(f"the kernel did not answer within {timeout:g} s") from None


# -- the bench's venv (nbdistributed) ----------------------------------------------------


def pinned_version() -> str:
    """nbdistributed's version in requirements-cell.txt."""
    match = re.search(r"(?m)^nbdistributed==(\S+)", REQUIREMENTS.read_text())
    if match is None:
        raise SystemExit(f"{REQUIREMENTS}: no 'nbdistributed==VERSION' line")
    return match.group(1)


def venv_eval(python: Path, code: str) -> str:
    """What ``print`` shows when the venv's python runs ``code``."""
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def bench_venv(path: Path) -> Path:
    """The bench's venv with nbdistributed (made or completed here); its python."""
    import sysconfig

    python = path / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    project_site = sysconfig.get_paths()["purelib"]
    site = venv_eval(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    # After the venv's own site-packages: what pip installs here wins, the rest is the
    # project's own files (so the same torch, IPython, ipykernel as nbddp's kernels).
    (Path(site) / "nbddp-project-venv.pth").write_text(project_site + "\n")
    version = pinned_version()
    have = venv_eval(
        python,
        "import importlib.metadata as m\ntry: print(m.version('nbdistributed'))\n"
        "except m.PackageNotFoundError: print('')",
    )
    if have != version:
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
            for name in PINNED:
                with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                    constraints.write(f"{name}=={importlib.metadata.version(name)}\n")
            constraints.flush()
            cmd = [str(python), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)]
            subprocess.run([*cmd, "-c", constraints.name], check=True)
    torch_file = venv_eval(python, "import nbdistributed, torch; print(torch.__file__)")
    if not torch_file.startswith(project_site):
        raise SystemExit(
            f"the bench venv {path} imports torch from {torch_file}, not the project's "
            f"({project_site}); remove {path} and run again"
        )
    return python


# -- variants ----------------------------------------------------------------------------


@dataclass
class Variant:
    """One way to run the cell, in its own kernel, and what it measured."""

    name: str
    python: str
    env: dict[str, str]
    setup: tuple[str, ...]
    cell: str
    teardown: tuple[str, ...] = ()
    probe: str = ""
    """A cell that raises inside the ranks (empty: none)."""
    inner: str = ""
    """A cell printing a JSON list of times the kernel measured itself (empty: none)."""
    joins: bool = False
    """Set-up ends only once the ranks have connected to the kernel (nbdistributed:
    ``%dist_init`` returns after a fixed 2 s, and a cell sent to a worker not yet
    connected is dropped: that cell then waits 30 s and prints a timeout)."""
    kernel: BenchKernel | None = None
    setup_s: float = 0.0
    first_s: float = 0.0
    times: list[float] = field(default_factory=list)
    inner_times: list[float] = field(default_factory=list)
    failed: str = ""
    notes: list[str] = field(default_factory=list)


def variants(procs: int, venv_python: Path | None, logs: str) -> list[Variant]:
    """The four variants (nbdistributed only with its venv)."""
    env = dict(os.environ, NBDDP_LOG_DIR=logs)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    py = sys.executable
    out = [
        Variant(
            "one-shot %%ddp",
            py,
            env,
            ("%load_ext nbddp",),
            f"%%ddp --procs {procs}\n{BODY}",
            probe=f"%%ddp --procs {procs}\n{PROBE}",
        ),
        Variant(
            "session %%ddp",
            py,
            env,
            ("%load_ext nbddp", f"%ddp_session start --procs {procs}"),
            f"%%ddp\n{BODY}",
            ("%ddp_session stop",),
            probe=f"%%ddp\n{PROBE}",
        ),
        Variant(
            "nbddp.launch in the kernel",
            py,
            env,
            (LAUNCH_SETUP,),
            LAUNCH_CELL.format(procs=procs),
            probe=f"nbddp.launch(fails, procs={procs})",
            inner="print(json.dumps(_bench_times))",
        ),
    ]
    if venv_python is not None:
        venv_env = dict(os.environ, NBDDP_LOG_DIR=logs)
        venv_env["PATH"] = os.pathsep.join([str(venv_python.parent), venv_env.get("PATH", "")])
        venv_env["VIRTUAL_ENV"] = str(venv_python.parent.parent)
        out.append(
            Variant(
                "nbdistributed %%distributed",
                str(venv_python),
                venv_env,
                ("%load_ext nbdistributed", f"%dist_init -n {procs}"),
                f"%%distributed\n{BODY}",
                ("%dist_shutdown",),
                probe=f"%%distributed\n{PROBE}",
                joins=True,
            )
        )
    return out


def checked(v: Variant, code: str, procs: int | None, timeout: float) -> Cell | None:
    """Run ``code`` in ``v``'s kernel; on a failed cell (raised, or without every rank's
    line when ``procs`` is given) note why in ``v.failed`` and return None."""
    assert v.kernel is not None
    cell = v.kernel.run(code, timeout)
    if cell.status != "ok":
        v.failed = cell.error or cell.status
    elif procs is None and SETUP_FAILED.search(cell.text):
        v.failed = failure_line(cell.text)  # a set-up cell that printed its failure
    elif procs is not None and missing_ranks(cell.text, procs):
        v.failed = (
            f"{failure_line(cell.text)} (no line from rank(s) {missing_ranks(cell.text, procs)})"
        )
    return None if v.failed else cell


def set_up(v: Variant, stack: contextlib.ExitStack, spec_dir: Path, args: Any) -> None:
    """Start ``v``'s kernel, run its set-up and warm-up cells, note its listening ports."""
    v.kernel = stack.enter_context(BenchKernel(v.python, v.env, spec_dir))
    for code in v.setup:
        cell = checked(v, code, None, args.timeout)
        if cell is None:
            return
        v.setup_s += cell.seconds
    if v.joins and not wait_joined(v, args.procs, args.timeout):
        return
    for i in range(args.warmup):
        cell = checked(v, v.cell, args.procs, args.timeout)
        if cell is None:
            return
        if i == 0:
            v.first_s = cell.seconds
    v.notes.append("listening once set up: " + (", ".join(v.kernel.listening()) or "none"))


def wait_joined(v: Variant, procs: int, timeout: float) -> bool:
    """Wait until ``procs`` ranks have connected to ``v``'s kernel; False (and
    ``v.failed``) after ``timeout`` seconds."""
    assert v.kernel is not None
    start = time.perf_counter()
    while v.kernel.joined() < procs:
        if time.perf_counter() - start > timeout:
            v.failed = f"its ranks had not connected {timeout:g} s after the set-up cells"
            return False
        time.sleep(0.02)  # polled: nbdistributed gives no sign when its workers are ready
    waited = time.perf_counter() - start
    v.setup_s += waited
    v.notes.append(f"ranks connected {waited:.2f} s after the set-up cells returned")
    return True


def measure(live: list[Variant], args: Any) -> None:
    """``args.rounds`` rounds of ``args.reps`` cells per variant, the order reversed every
    other round."""
    for round_ in range(args.rounds):
        for v in live if round_ % 2 == 0 else list(reversed(live)):
            for _ in range(args.reps):
                if v.failed:
                    break
                time.sleep(args.pause)  # a person between cells: not timed, not a sync
                cell = checked(v, v.cell, args.procs, args.timeout)
                if cell is not None:
                    v.times.append(cell.seconds)


def finish(v: Variant, args: Any) -> None:
    """The in-kernel times, the probe (does a raising cell come back as an error?), and the
    teardown cells."""
    assert v.kernel is not None
    if v.inner:
        cell = v.kernel.run(v.inner, args.timeout)
        inner = json.loads(cell.text.strip().splitlines()[-1]) if cell.status == "ok" else []
        v.inner_times = inner[args.warmup :]
    if v.probe:
        cell = v.kernel.run(v.probe, args.timeout)
        how = f"raised ({cell.error})" if cell.status == "error" else f"reply status {cell.status}"
        v.notes.append(f"a cell that raises in the ranks: {how}; shows {failure_line(cell.text)!r}")
    for code in v.teardown:
        cell = v.kernel.run(code, args.timeout)
        v.notes.append(f"{code}: {cell.seconds * 1e3:.0f} ms, reply status {cell.status}")
    if v.teardown:
        running = [describe(proc) for proc in v.kernel.descendants()]
        v.notes.append(f"still running after {' and '.join(v.teardown)}: {running}")


# -- report ------------------------------------------------------------------------------


def row(name: str, setup: float | None, first: float | None, times: list[float]) -> str:
    """One table row, in milliseconds ('-' for what does not apply)."""
    ms = [t * 1e3 for t in times]
    setup_ms = "-" if setup is None else f"{setup * 1e3:.0f}"
    first_ms = "-" if first is None else f"{first * 1e3:.1f}"
    return (
        f"| {name} | {setup_ms} | {first_ms} | {statistics.median(ms):.1f} "
        f"| {p95(ms):.1f} | {min(ms):.1f} | {len(ms)} |"
    )


def median_of(vs: list[Variant], prefix: str, inner: bool = False) -> float | None:
    """The median time of the variant whose name starts with ``prefix``, if it measured."""
    v = next((v for v in vs if v.name.startswith(prefix) and not v.failed), None)
    times = (v.inner_times if inner else v.times) if v is not None else []
    return statistics.median(times) if times else None


def report(vs: list[Variant], args: Any) -> None:
    """The table, the targets, each variant's notes, and the failures."""
    print(
        f"\ncell latency, {args.procs} CPU ranks (gloo), all_reduce + print; "
        f"{args.rounds} round(s) x {args.reps} cells per variant, {args.pause:g} s apart, "
        f"after {args.warmup} warm-up cells; {os.cpu_count()} cores, load average "
        f"{args.load:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    print(
        "| variant | set-up cells (ms) | first cell (ms) | median (ms) | p95 (ms) | best (ms) "
        "| n |\n|---|---|---|---|---|---|---|"
    )
    for v in vs:
        if v.times:
            print(row(v.name, v.setup_s, v.first_s, v.times))
        if v.inner_times:
            print(row("  launch() timed inside the kernel", None, None, v.inner_times))
    session, nbd = median_of(vs, "session"), median_of(vs, "nbdistributed")
    oneshot, launch = median_of(vs, "one-shot"), median_of(vs, "nbddp.launch", inner=True)
    print()
    print(verdict(None if session is None else session * 1e3, 15, " ms", "session cell median"))
    ratio = None if session is None or nbd is None else session / nbd
    print(verdict(ratio, 0.15, "x", "session / nbdistributed (medians)"))
    extra = None if oneshot is None or launch is None else (oneshot - launch) * 1e3
    print(verdict(extra, 10, " ms", "one-shot cell - launch() (medians)"))
    for v in vs:
        for note in v.notes:
            print(f"{v.name}: {note}")
        if v.kernel is not None and v.kernel.leftovers:
            print(f"{v.name}: outlived the kernel's shutdown (stopped here): {v.kernel.leftovers}")
    for v in vs:
        if v.failed:
            print(f"{v.name.split()[0]}: failed: {v.failed}")


JSON_COLUMNS = (
    "variant",
    "set-up cells (ms)",
    "first cell (ms)",
    "median (ms)",
    "p95 (ms)",
    "best (ms)",
    "n",
    "times (ms)",
)


def json_row(name: str, setup: float | None, first: float | None, times: list[float]) -> list[Any]:
    """``row`` as numbers (None for what does not apply), with every time."""
    ms = [t * 1e3 for t in times]
    return [
        name,
        None if setup is None else setup * 1e3,
        None if first is None else first * 1e3,
        statistics.median(ms),
        p95(ms),
        min(ms),
        len(ms),
        ms,
    ]


def write_json(path: str, vs: list[Variant], args: Any) -> None:
    """The table as JSON (``benchjson``), with each variant's notes and failures."""
    import benchjson

    rows = []
    for v in vs:
        if v.times:
            rows.append(json_row(v.name, v.setup_s, v.first_s, v.times))
        if v.inner_times:
            rows.append(json_row("launch() timed inside the kernel", None, None, v.inner_times))
    title = (
        f"a trivial cell, {args.procs} CPU ranks (gloo), all_reduce + print; {args.rounds} "
        f"round(s) x {args.reps} cells per variant, {args.pause:g} s apart"
    )
    notes = [f"{v.name}: {note}" for v in vs for note in v.notes]
    notes += [f"{v.name}: failed: {v.failed}" for v in vs if v.failed]
    benchjson.write(path, "cell", [benchjson.table("cells", title, JSON_COLUMNS, rows)], notes)


def chooser(words: list[str] | None) -> Callable[[str], bool]:
    """Whether a variant's name is one ``--only`` asked for (all without ``--only``)."""
    return lambda name: not words or any(word in name for word in words)


def main() -> None:
    """Set up every variant's kernel, measure them in rounds, tear down, report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=10, help="cells per variant per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2, help="cells per variant not counted")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between cells")
    parser.add_argument("--procs", type=int, default=2, help="CPU ranks")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per cell")
    parser.add_argument("--only", nargs="+", help="variants whose names contain one of these")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV / "bench-cell-venv")
    parser.add_argument("--json", metavar="PATH", help="also write the figures there as JSON")
    args = parser.parse_args()
    args.warmup = max(1, args.warmup)
    args.load = os.getloadavg()[0]
    wanted = chooser(args.only)
    venv_python = bench_venv(args.venv) if wanted("nbdistributed") else None
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nbddp-bench-cell-")))
        logs = str(tmp / "logs")
        vs = [v for v in variants(args.procs, venv_python, logs) if wanted(v.name)]
        with contextlib.ExitStack() as kernels:
            for v in vs:
                set_up(v, kernels, tmp / v.name.split()[0], args)
            measure([v for v in vs if not v.failed], args)
            for v in vs:
                if not v.failed:
                    finish(v, args)
        shutil.rmtree(logs, ignore_errors=True)
    report(vs, args)
    if args.json:
        write_json(args.json, vs, args)


if __name__ == "__main__":
    main()
