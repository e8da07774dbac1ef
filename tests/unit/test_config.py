"""LaunchConfig validation: every bad input is a one-line ConfigError, before any process."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from nbddp.entry import NOTEBOOK_LAUNCHER, SPAWN
from nbddp.errors import ConfigError
from nbddp.launcher.checks import USER_MAY_SET
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.devices import VisibleGpus, parse_visible_devices, visible_gpus
from nbddp.launcher.spelling import FLAGS, KEYWORDS, PANEL, Spelling, spoken
from tests.unit.configs import build

TWO_GPUS = VisibleGpus(("4", "5"), "CUDA_VISIBLE_DEVICES=4,5")


def rank_env(cfg: LaunchConfig, local: int, port: int) -> dict[str, str]:
    """The environment of ``cfg``'s ``local``-th rank, the run on this machine."""
    return cfg.job.rank_env(cfg.job.local(), local, port)


def notices(cfg: LaunchConfig, spelling: Spelling = KEYWORDS) -> list[str]:
    with spelling.speaking():
        return [spoken(notice) for notice in cfg.view.notices]


def test_defaults_without_gpu_are_two_cpu_ranks_with_a_notice() -> None:
    cfg = build()
    assert (cfg.job.world_size, cfg.job.device, cfg.job.backend) == (2, "cpu", "gloo")
    assert notices(cfg) and "procs=N" in notices(cfg)[0]


def test_defaults_with_gpus_take_every_visible_gpu_and_nccl() -> None:
    cfg = build(visible=TWO_GPUS)
    assert (cfg.job.world_size, cfg.job.device, cfg.job.backend, cfg.job.gpu_tokens) == (
        2,
        "cuda",
        "nccl",
        ("4", "5"),
    )
    assert not cfg.view.notices


def test_gpu_ids_map_through_the_notebooks_visible_devices() -> None:
    cfg = build(visible=TWO_GPUS, gpus=[1])
    assert cfg.job.gpu_tokens == ("5",)
    assert rank_env(cfg, 0, 1234)["CUDA_VISIBLE_DEVICES"] == "5"


BAD_INPUT = pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"procs": 0}, "procs must be at least 1"),
        ({"procs": -2}, "procs must be at least 1"),
        ({"procs": 1.5}, "positive whole number"),
        ({"procs": True}, "positive whole number"),
        ({"procs": "2"}, "positive whole number"),
        ({"gpus": 0, "visible": TWO_GPUS}, "gpus must be at least 1"),
        ({"gpus": 4, "visible": TWO_GPUS}, "use gpus=2, or procs=4 to run on CPU"),
        ({"gpus": 1}, "use procs=1 to run on CPU"),
        ({"gpus": [0, 0], "visible": TWO_GPUS}, "lists a GPU twice"),
        ({"gpus": [3], "visible": TWO_GPUS}, "GPU id 3 is not visible"),
        ({"gpus": [], "visible": TWO_GPUS}, "selects no GPU"),
        ({"gpus": "0,1", "visible": TWO_GPUS}, "got the string"),
        ({"gpus": 2, "procs": 2, "visible": TWO_GPUS}, "not both"),
        ({"start_method": "thread"}, "choose one of forkserver, spawn, fork"),
        ({"backend": "mpi"}, "choose one of nccl, gloo"),
        ({"backend": "nccl"}, "backend 'nccl' needs GPUs"),
        ({"mixed_precision": "fp64"}, "unknown mixed_precision"),
        ({"port": 70000}, "port must be a number from 1 to 65535"),
        ({"port": "http"}, "port must be a number"),
        ({"env": {1: "x"}}, "env keys must be non-empty strings"),
        ({"env": {"A=B": "x"}}, "without '='"),
        ({"env": {"A": object()}}, "must be a string"),
        ({"env": ["A"]}, "env must be a dict"),
        ({"timeout": 0}, "timeout must be positive"),
        ({"timeout": -1}, "timeout must be positive"),
        ({"timeout": "soon"}, "number of seconds"),
        ({"master_addr": ""}, "master_addr must be a host name"),
        ({"output": "some"}, "unknown output 'some'; choose one of all, rank0, none"),
        ({"tail": 0}, "tail=0 shows nothing; use tail=1 or more"),
        ({"tail": 2.5}, "tail must be a positive whole number"),
        ({"environ": {"NBDDP_POOL": "x"}}, "NBDDP_POOL='x' is not a whole number of workers >= 0"),
        ({"gpus": [0, -1], "visible": TWO_GPUS}, "GPU ids must be non-negative"),
        ({"gpus": 1.5, "visible": TWO_GPUS}, "gpus must be a count or a list of GPU ids"),
    ],
)


@BAD_INPUT
def test_bad_input_is_a_one_line_error_that_says_what_to_do(
    kwargs: dict[str, object], needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        build(**kwargs)
    message = str(info.value)
    assert needle in message
    assert "\n" not in message


def test_rank_env_has_the_torch_distributed_variables() -> None:
    cfg = build(procs=3, env={"EXTRA": "1"}, mixed_precision="BF16")
    env = rank_env(cfg, 2, 29999)
    assert env["RANK"] == env["LOCAL_RANK"] == "2"
    assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3"
    assert (env["GROUP_RANK"], env["NODE_RANK"]) == ("0", "0")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29999")
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # CPU ranks do not see GPUs
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["EXTRA"] == "1"


def test_inherit_devices_leaves_cuda_visible_devices_alone() -> None:
    env = rank_env(build(procs=2, inherit_devices=True), 0, 1)
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_string_port_from_accelerate_signature_is_accepted() -> None:
    assert build(port="29500").job.port == 29500


def test_cuda_visible_devices_parsing_follows_the_runtime() -> None:
    assert parse_visible_devices("0,2", 4) == ("0", "2")
    assert parse_visible_devices("1,7,0", 4) == ("1",)  # stops at the first invalid entry
    assert parse_visible_devices("", 4) == ()
    assert parse_visible_devices("GPU-abc,MIG-def", 0) == ("GPU-abc", "MIG-def")
    assert parse_visible_devices("0,0", 2) == ("0",)


def test_visible_gpus_reads_the_driver_listing_without_cuda(tmp_path: Path) -> None:
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (tmp_path / bus).mkdir()
    assert visible_gpus({}, tmp_path).tokens == ("0", "1", "2")
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,0"}, tmp_path).tokens == ("2", "0")
    assert len(visible_gpus({}, tmp_path / "missing")) == 0


def test_rank_threads_follow_env_then_the_notebook_then_the_cores(monkeypatch: Any) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    shared = LaunchConfig.build(procs=2)
    assert shared.job.threads(2) == 4 and rank_env(shared, 0, 1)["OMP_NUM_THREADS"] == "4"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert LaunchConfig.build(procs=2).job.threads(2) == 3
    assert "OMP_NUM_THREADS" not in rank_env(LaunchConfig.build(procs=2), 0, 1)  # the notebook's
    given = LaunchConfig.build(procs=2, env={"OMP_NUM_THREADS": "5"})
    assert given.job.threads(2) == 5 and rank_env(given, 0, 1)["OMP_NUM_THREADS"] == "5"
    odd = LaunchConfig.build(procs=2, env={"OMP_NUM_THREADS": "4,2"})  # nested OpenMP levels
    assert odd.job.threads(2) is None and rank_env(odd, 0, 1)["OMP_NUM_THREADS"] == "4,2"


# -- env cannot override what nbddp sets ----------------------------------------


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"MASTER_PORT": "1"},
            "env['MASTER_PORT']: nbddp sets MASTER_PORT itself; use port=1 instead",
        ),
        (
            {"MASTER_ADDR": "10.0.0.1"},
            "env['MASTER_ADDR']: nbddp sets MASTER_ADDR itself; use master_addr='10.0.0.1' instead",
        ),
        ({"RANK": "5"}, "env['RANK']: RANK is per rank and set by nbddp"),
        ({"LOCAL_RANK": "0"}, "env['LOCAL_RANK']: LOCAL_RANK is per rank and set by nbddp"),
        ({"NODE_RANK": "0"}, "NODE_RANK is per rank and set by nbddp"),
        ({"WORLD_SIZE": "4"}, "nbddp sets WORLD_SIZE itself from the number of ranks; use gpus=N"),
        (
            {"ACCELERATE_MIXED_PRECISION": "BF16"},
            "nbddp sets ACCELERATE_MIXED_PRECISION itself; use mixed_precision='bf16' instead",
        ),
        ({"CUDA_VISIBLE_DEVICES": ""}, "use procs=N to run on CPU instead"),
        ({"CUDA_VISIBLE_DEVICES": "1"}, "use gpus=N instead"),
        ({"TORCHELASTIC_RUN_ID": "x"}, "nbddp sets TORCHELASTIC_RUN_ID itself"),
        ({"EXTRA": "1", "MASTER_PORT": "1"}, "env['MASTER_PORT']"),
    ],
)
def test_env_cannot_set_what_nbddp_sets(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        build(procs=2, env=env)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_every_variable_nbddp_sets_is_refused_unless_users_may_tune_it() -> None:
    launches: list[dict[str, object]] = [
        {"procs": 2},
        {"visible": TWO_GPUS},
        {"procs": 2, "inherit_devices": True, "host_store": False},
    ]
    for kwargs in launches:
        sets = set(rank_env(build(**kwargs), 0, 1))
        assert {"RANK", "MASTER_PORT", "TORCHELASTIC_RUN_ID"} <= sets
        for key in sets - USER_MAY_SET:
            with pytest.raises(ConfigError, match=re.escape(f"env[{key!r}]: ")):
                build(**kwargs, env={key: "1"})


def test_env_keeps_what_users_may_set() -> None:
    env = {"OMP_NUM_THREADS": "3", "PYTHONUNBUFFERED": "0", "NCCL_DEBUG": "INFO", "EXTRA": "x"}
    assert rank_env(build(procs=2, env=env), 0, 1)["OMP_NUM_THREADS"] == "3"
    # Ranks that see the notebook's devices (spawn()) choose their own: nbddp sets none.
    inherit = build(procs=2, inherit_devices=True, env={"CUDA_VISIBLE_DEVICES": "1"})
    assert rank_env(inherit, 0, 1)["CUDA_VISIBLE_DEVICES"] == "1"
    # Without the notebook hosting the store, its variable is not nbddp's either.
    store = build(procs=2, host_store=False, env={"TORCHELASTIC_USE_AGENT_STORE": "False"})
    assert rank_env(store, 0, 1)["TORCHELASTIC_USE_AGENT_STORE"] == "False"


def test_the_magics_and_the_panel_get_the_env_message_in_their_words() -> None:
    with pytest.raises(ConfigError) as info:
        build(procs=2, env={"MASTER_PORT": "1"}, spelling=FLAGS)
    assert str(info.value) == (
        "--env MASTER_PORT=1: nbddp sets MASTER_PORT itself; use --port 1 instead"
    )
    with pytest.raises(ConfigError) as info:
        build(procs=2, env={"RANK": "5"}, spelling=FLAGS)
    assert str(info.value).startswith("--env RANK=5: RANK is per rank and set by nbddp")
    with pytest.raises(ConfigError) as info:
        build(procs=2, env={"MASTER_PORT": "1"}, spelling=PANEL)
    assert "nbddp sets MASTER_PORT itself; use Master port 1 instead" in str(info.value)


# -- each entry point's messages name its own parameters ------------------------


def messages(spelling: Spelling, **kwargs: object) -> str:
    """The error of ``build``, or else its notices, as one text."""
    try:
        return " | ".join(notices(build(spelling, **kwargs), spelling))
    except ConfigError as exc:
        return str(exc)


def test_the_default_notice_names_the_callers_parameter() -> None:
    assert "pass procs=N to choose how many" in messages(KEYWORDS)
    assert "pass --procs N to choose how many" in messages(FLAGS)
    assert "pass num_processes=N to choose how many" in messages(NOTEBOOK_LAUNCHER)


def test_too_many_gpus_says_what_each_entry_point_takes() -> None:
    assert messages(KEYWORDS, gpus=4, visible=TWO_GPUS).endswith(
        "use gpus=2, or procs=4 to run on CPU"
    )
    flags = messages(FLAGS, gpus=4, visible=TWO_GPUS)
    assert flags.startswith("--gpus 4 asked for 4 GPUs but")
    assert flags.endswith("use --gpus 2, or --procs 4 to run on CPU")
    # num_processes takes the GPUs whenever any is visible: no CPU alternative to offer.
    accelerate = messages(NOTEBOOK_LAUNCHER, gpus=4, visible=TWO_GPUS)
    assert accelerate.startswith("num_processes=4 asked for 4 GPUs but")
    assert accelerate.endswith("use num_processes=2")
    assert "procs" not in accelerate.replace("num_processes", "")
    assert messages(FLAGS, gpus=1).endswith("use --procs 1 to run on CPU")


@pytest.mark.parametrize(
    ("spelling", "kwargs", "message"),
    [
        (SPAWN, {"procs": 0}, "nprocs must be at least 1, got 0"),
        (NOTEBOOK_LAUNCHER, {"procs": 0}, "num_processes must be at least 1, got 0"),
        (NOTEBOOK_LAUNCHER, {"port": "http"}, "use_port must be a number from 1 to 65535"),
        (FLAGS, {"port": 70000}, "--port must be a number from 1 to 65535 (or leave out --port"),
        (FLAGS, {"timeout": -1}, "--timeout must be positive (seconds), got -1; leave out"),
        (FLAGS, {"gpus": 2, "procs": 2}, "give either --gpus N (one process per GPU) or --procs N"),
        (FLAGS, {"gpus": [], "visible": TWO_GPUS}, "or use --procs N for CPU"),
        (PANEL, {"port": 70000}, "Master port must be a number from 1 to 65535 (or leave"),
        (PANEL, {"timeout": -1}, "leave Timeout (s) empty for no limit"),
        (KEYWORDS, {"timeout": -1}, "timeout must be positive (seconds), got -1; use timeout=None"),
    ],
)
def test_messages_use_the_callers_spelling(
    spelling: Spelling, kwargs: dict[str, object], message: str
) -> None:
    assert message in messages(spelling, **kwargs)


FLAGGED = "gpus|procs|port|timeout|start_method|master_addr|env|mixed_precision|output"


@BAD_INPUT
def test_no_magic_message_names_a_keyword_the_magics_spell_as_a_flag(
    kwargs: dict[str, object], needle: str
) -> None:
    del needle  # the keyword spelling's; here only what it must not say matters
    text = messages(FLAGS, **kwargs)
    assert text and not re.search(rf"(?<![-\w/])({FLAGGED})\b(?!-)", text), text


def test_the_panels_spelling_is_its_fields_labels() -> None:
    from nbddp.notebook.panel.settings import PanelSettings
    from nbddp.notebook.panel.view import PanelView

    view = PanelView("t", PanelSettings.initial(0), "GPUs: none")
    for name, label in PANEL.names.items():
        assert view.fields[name].description == label, name


def test_fork_after_the_notebook_initialised_cuda_is_refused_before_any_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from nbddp.launcher.spelling import FLAGS

    initialised = SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", initialised)
    with pytest.raises(ConfigError, match=r"start_method='fork' cannot start GPU ranks") as info:
        build(visible=TWO_GPUS, start_method="fork")
    assert "use the default start_method='forkserver', or start_method='spawn'" in str(info.value)
    with pytest.raises(ConfigError, match=r"--start-method fork cannot start GPU ranks"):
        build(visible=TWO_GPUS, start_method="fork", spelling=FLAGS)
    # CPU ranks never touch CUDA, and the other methods never fork this process.
    assert build(procs=2, start_method="fork").job.start_method == "fork"
    assert build(visible=TWO_GPUS, start_method="spawn").job.start_method == "spawn"
    monkeypatch.setitem(
        sys.modules, "torch", SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda: False))
    )
    assert build(visible=TWO_GPUS, start_method="fork").job.start_method == "fork"
