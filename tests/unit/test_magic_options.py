"""%%ddp / %ddp_config argument parsing and session defaults, without a kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
from IPython.core.error import UsageError

from nbddp.errors import ConfigError
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.options import LaunchOptions, format_options, merge_options
from nbddp.notebook import runner as runner_module
from nbddp.notebook.magics import DdpMagics, _as_usage_error, launch_options, parse
from nbddp.notebook.runner import CellRunner


def cell_options(line: str) -> LaunchOptions:
    return launch_options(parse(DdpMagics.ddp, line, "%%ddp"))


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("", {}),
        ("--gpus 2", {"gpus": 2}),
        ("--gpus 0,1", {"gpus": [0, 1]}),
        ("--gpus 3,", {"gpus": [3]}),
        ("--procs 2 --timeout 600", {"procs": 2, "timeout": 600.0}),
        ("--env A=1 --env B=x=y", {"env": {"A": "1", "B": "x=y"}}),
        ("--start-method spawn --port 29500", {"start_method": "spawn", "port": 29500}),
        (
            "--master-addr 10.0.0.1 --mixed-precision bf16",
            {"master_addr": "10.0.0.1", "mixed_precision": "bf16"},
        ),
        ("--output rank0", {"output": "rank0"}),
    ],
)
def test_launch_options(line: str, expected: dict[str, Any]) -> None:
    assert cell_options(line) == expected


def test_cell_only_options() -> None:
    args = parse(DdpMagics.ddp, "--out state,history --out x --no-init", "%%ddp")
    assert args.out == [["state", "history"], ["x"]]
    assert args.no_init is True
    assert parse(DdpMagics.ddp, "", "%%ddp").no_init is False


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--bogus", "unrecognized arguments: --bogus"),
        ("--gpus two", "--gpus takes a count"),
        ("--env NOVALUE", "--env takes NAME=VALUE"),
        ("--out 1x", "--out takes Python names"),
        ("--output some", "invalid choice: 'some'"),
        ("--procs", "expected one argument"),
        ("--env 'A=1", "cannot split the options"),
        ("--proc 2", "unrecognized arguments: --proc"),  # no abbreviations
    ],
)
def test_bad_options_are_one_line_usage_errors(line: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse(DdpMagics.ddp, line, "%%ddp")
    text = str(info.value)
    assert text.startswith("%%ddp: ") and message in text
    assert "\n" not in text


@pytest.mark.parametrize(
    ("line", "hint"),
    [
        ("--nprocs 2", "unrecognized arguments: --nprocs 2; did you mean --procs?"),
        ("--gpu 2", "; did you mean --gpus?"),
        ("--nproc-per-node=2", "; did you mean --gpus or --procs?"),
        ("--num_processes 2", "; did you mean --gpus or --procs?"),
        (
            "--procs 2 --master-port 5",
            "unrecognized arguments: --master-port 5; did you mean --port?",
        ),
    ],
)
def test_a_flag_close_to_a_launch_option_is_suggested(line: str, hint: str) -> None:
    for magic, name in ((DdpMagics.ddp, "%%ddp"), (DdpMagics.ddp_config, "%ddp_config")):
        with pytest.raises(UsageError) as info:
            parse(magic, line, name)
        text = str(info.value)
        assert text.startswith(f"{name}: ") and hint in text and "\n" not in text
        assert text.endswith(f"({name}? lists the options)")


def test_no_suggestion_when_nothing_is_close() -> None:
    with pytest.raises(UsageError) as info:
        parse(DdpMagics.ddp, "--bogus 1", "%%ddp")
    assert "did you mean" not in str(info.value)
    with pytest.raises(UsageError) as info:
        parse(DdpMagics.ddp_config, "--out x", "%ddp_config")  # a cell's flag, not an option
    assert "did you mean" not in str(info.value)


def test_magic_launch_messages_use_flags() -> None:
    runner = CellRunner()
    # What the magics do with every call into their back end: one line, in flags.
    with pytest.raises(UsageError) as info, _as_usage_error():
        runner.configure({"procs": 2, "env": {"MASTER_PORT": "1"}})
    assert str(info.value) == (
        "--env MASTER_PORT=1: nbddp sets MASTER_PORT itself; use --port 1 instead"
    )
    rank = "--env RANK=5: RANK is per rank and set by nbddp"
    with pytest.raises(UsageError, match=rank), _as_usage_error():
        runner.cell_config({"procs": 2, "env": {"RANK": "5"}}, init=True)
    with pytest.raises(UsageError, match=r"^--gpus 64 asked for 64 GPUs but"), _as_usage_error():
        runner.cell_config({"gpus": 64}, init=True)


def test_config_shares_the_launch_options_but_not_the_cell_ones() -> None:
    args = parse(DdpMagics.ddp_config, "--procs 2 --reset", "%ddp_config")
    assert launch_options(args) == {"procs": 2} and args.reset
    with pytest.raises(UsageError, match="unrecognized arguments: --out"):
        parse(DdpMagics.ddp_config, "--out x", "%ddp_config")


def test_help_lists_the_options() -> None:
    doc = DdpMagics.ddp.__doc__ or ""
    assert "Run this cell on every rank" in doc
    for option in ("--gpus", "--procs", "--out", "--no-init", "--env", "launch options"):
        assert option in doc


@pytest.mark.parametrize(
    ("method", "usage"),
    [
        (DdpMagics.ddp, "%%ddp "),
        (DdpMagics.ddp_config, "%ddp_config "),
        (DdpMagics._session_start, "%ddp_session start "),
        (DdpMagics.ddp_panel, "%ddp_panel "),
        (DdpMagics.ddp_debug, "%ddp_debug "),
    ],
)
def test_help_names_the_magic_as_it_is_typed(method: Any, usage: str) -> None:
    lines = method.parser.format_help().splitlines()
    assert lines[2].strip().startswith(usage), lines[2]


def test_merge_options() -> None:
    defaults: LaunchOptions = {"gpus": 2, "timeout": 600.0, "env": {"A": "1"}}
    merged = merge_options(defaults, {"procs": 1, "env": {"B": "2"}})
    assert merged == {"procs": 1, "timeout": 600.0, "env": {"A": "1", "B": "2"}}
    assert merge_options(defaults, {}) == defaults


@pytest.mark.parametrize(
    "line", ["--procs 2 --timeout 600", "--gpus 0,1 --env A=1 --output none", "--gpus 3,"]
)
def test_format_options_round_trips(line: str) -> None:
    options = cell_options(line)
    assert cell_options(format_options(options)) == options


def test_session_defaults_are_validated_and_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    import nbddp.launcher.run

    monkeypatch.setattr(nbddp.launcher.run, "_LATEST", None)  # as in a kernel where nothing ran yet
    session = CellRunner()
    assert "no session defaults" in session.describe_defaults()
    session.configure({"procs": 2, "timeout": 600.0})
    assert session.describe_defaults() == "%ddp_config --procs 2 --timeout 600"
    with pytest.raises(ConfigError, match="procs must be at least 1"):
        session.configure({"procs": 0})
    assert session.defaults == {"procs": 2, "timeout": 600.0}  # unchanged by the bad call
    session.configure({"output": "rank0"}, reset=True)
    assert session.defaults == {"output": "rank0"}
    assert "no run has started in this kernel yet" in session.status()


def test_importing_nbddp_does_not_import_ipython() -> None:
    code = (
        "import sys, nbddp; print('IPython' in sys.modules, callable(nbddp.load_ipython_extension))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NBDDP_PREWARM": "0"},
    )
    assert done.stdout.split() == ["False", "True"], done.stderr


def test_session_defaults_keep_the_config_they_were_validated_into(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = CellRunner()
    assert session.defaults_config is None
    session.configure({"procs": 3, "timeout": 600.0, "output": "rank0"})
    kept = session.defaults_config
    assert kept is not None
    assert (kept.job.world_size, kept.job.timeout, kept.view.output) == (3, 600.0, "rank0")
    builds: list[dict[str, Any]] = []
    real = LaunchConfig.build

    def counting(**kw: Any) -> LaunchConfig:
        builds.append(kw)
        return real(**kw)

    monkeypatch.setattr(runner_module.LaunchConfig, "build", counting)
    # A cell that adds no option runs with the kept config (its own process-group choice).
    cell = session.cell_config({}, init=False)
    assert not builds
    assert cell == replace(kept, job=replace(kept.job, init_process_group=False))
    assert session.cell_config({}, init=True) is kept
    # A cell with options of its own is validated over the defaults.
    own = session.cell_config({"procs": 1}, init=True)
    assert len(builds) == 1 and (own.job.world_size, own.job.timeout) == (1, 600.0)
    session.configure({}, reset=True)
    assert session.defaults_config is None


def test_a_bad_session_default_keeps_the_previous_config() -> None:
    session = CellRunner()
    session.configure({"procs": 2})
    kept = session.defaults_config
    with pytest.raises(UsageError, match="unknown --output 'some'"), _as_usage_error():
        session.configure({"output": "some"})  # type: ignore[typeddict-item]
    assert session.defaults_config is kept and session.defaults == {"procs": 2}
