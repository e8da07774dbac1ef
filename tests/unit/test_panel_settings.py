"""The panel's form as data: validation messages, launch options and the equivalent code."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from nbddp.launcher.config import LaunchConfig
from nbddp.notebook.panel import panel as panel_module
from nbddp.notebook.panel import settings as settings_module
from nbddp.notebook.panel.panel import Panel
from nbddp.notebook.panel.settings import PanelSettings, call_code

CPU = PanelSettings.initial(0)
GPUS = PanelSettings.initial(4)


def test_defaults_follow_the_machine() -> None:
    assert (CPU.device, CPU.procs, CPU.gpus) == ("cpu", 2, ())
    assert (GPUS.device, GPUS.gpus) == ("gpu", (0, 1, 2, 3))
    assert CPU.errors() == {}


def test_the_whole_config_is_checked_once_the_fields_are_valid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With every GPU hidden the fields are fine, the launch they describe is not.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    errors = PanelSettings.initial(4, None).errors()
    assert list(errors) == ["launch"] and "none is visible" in errors["launch"]


def test_valid_settings_build_the_launch_they_show() -> None:
    settings = replace(
        CPU,
        procs=3,
        start_method="spawn",
        port=" 29511 ",
        timeout="90",
        max_restarts=" 2 ",
        mixed_precision="bf16",
        env="A=1\n\n# a comment\nB = x=y\n",
    )
    assert settings.errors() == {}
    options = settings.options()
    assert options == {
        "procs": 3,
        "start_method": "spawn",
        "port": 29511,
        "timeout": 90.0,
        "max_restarts": 2,
        "env": {"A": "1", "B": " x=y"},
        "mixed_precision": "bf16",
    }
    config = LaunchConfig.build(**options)
    assert (config.job.world_size, config.job.start_method, config.job.timeout) == (
        3,
        "spawn",
        90.0,
    )
    assert config.job.max_restarts == 2
    assert config.job.env["A"] == "1"


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"procs": 0}, "procs", "from 1 to 256"),
        ({"procs": 10_000}, "procs", "from 1 to 256"),
        ({"port": "http"}, "port", "a port number"),
        ({"port": "70000"}, "port", "from 1 to 65535"),
        ({"timeout": "soon"}, "timeout", "seconds"),
        ({"timeout": "-1"}, "timeout", "positive"),
        ({"timeout": "inf"}, "timeout", "positive"),
        ({"max_restarts": "twice"}, "max_restarts", "a whole number of restarts"),
        ({"max_restarts": "-1"}, "max_restarts", "a whole number of restarts"),
        ({"env": "JUSTANAME"}, "env", "line 1: NAME=VALUE"),
        ({"env": "OK=1\n1BAD=2"}, "env", "line 2"),
        ({"start_method": "thread"}, "start_method", "forkserver, spawn, fork"),
        ({"mixed_precision": "fp64"}, "mixed_precision", "no, fp16, bf16, fp8"),
        ({"device": "gpu"}, "device", "no GPU is visible"),
    ],
)
def test_each_bad_field_says_what_to_type(change: dict[str, object], field: str, says: str) -> None:
    errors = replace(CPU, **change).errors()  # type: ignore[arg-type]
    assert list(errors) == [field]
    assert says in errors[field]


def test_no_gpu_chosen_is_an_error_on_the_gpu_list() -> None:
    assert list(replace(GPUS, gpus=()).errors()) == ["gpus"]


def test_gpu_choice_is_a_count_when_all_else_ids() -> None:
    assert GPUS.options() == {"gpus": 4}
    assert replace(GPUS, gpus=(1, 3)).options() == {"gpus": [1, 3]}


def test_initial_from_session_options() -> None:
    settings = PanelSettings.initial(
        0, {"procs": 4, "start_method": "spawn", "timeout": 30.0, "env": {"X": "1"}}
    )
    assert (settings.procs, settings.start_method, settings.timeout, settings.env) == (
        4,
        "spawn",
        "30",
        "X=1",
    )
    assert PanelSettings.initial(0, {"max_restarts": 3}).max_restarts == "3"
    assert PanelSettings.initial(0, {}).max_restarts == ""
    assert PanelSettings.initial(4, {"gpus": [0, 2]}).gpus == (0, 2)
    assert PanelSettings.initial(4, {"gpus": 2}).gpus == (0, 1)


def test_code_for_literal_arguments_is_exact() -> None:
    args, exact = call_code((3, "x", [1.5, None]), {"lr": 0.1})
    assert (args, exact) == ("3, 'x', [1.5, None], lr=0.1", True)
    settings = replace(CPU, start_method="spawn", env="A=1")
    assert settings.magic_cell(f"train({args})") == (
        "%%ddp --no-init --procs 2 --start-method spawn --env A=1\n"
        "train(3, 'x', [1.5, None], lr=0.1)"
    )
    assert settings.launch_call("train", args) == (
        "nbddp.launch(train, 3, 'x', [1.5, None], lr=0.1, procs=2, "
        "start_method='spawn', env={'A': '1'})"
    )


def test_code_names_objects_it_cannot_write() -> None:
    args, exact = call_code((object(), 1), {"data": list(range(1000)), "n": float("nan")})
    assert args == "args[0], 1, data=kwargs['data'], n=kwargs['n']"
    assert not exact


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        # The form only parses the text; the config's own check says what is wrong.
        # It names the form's fields, as the panel shows them.
        ({"port": "70000"}, "port", "Master port must be a number from 1 to 65535"),
        ({"timeout": "-1"}, "timeout", "Timeout (s) must be positive (seconds), got -1.0"),
        ({"start_method": "thread"}, "start_method", "unknown Start method 'thread'"),
        ({"mixed_precision": "fp64"}, "mixed_precision", "unknown Mixed precision 'fp64'"),
    ],
)
def test_field_values_are_checked_by_the_config(
    change: dict[str, object], field: str, message: str
) -> None:
    assert message in replace(CPU, **change).errors()[field]  # type: ignore[arg-type]


def test_every_bad_field_is_reported_at_once_in_form_order() -> None:
    bad = replace(CPU, port="http", timeout="-1", start_method="thread", procs=0)
    assert list(bad.errors()) == ["procs", "start_method", "port", "timeout"]


def test_validate_carries_the_config_exactly_when_there_are_no_errors() -> None:
    checked = replace(CPU, procs=3, timeout="5").validate()
    assert checked.errors == {} and checked.config is not None
    assert (checked.config.job.world_size, checked.config.job.timeout) == (3, 5.0)
    assert checked.options == {"procs": 3, "timeout": 5.0}
    bad = replace(CPU, port="http").validate()
    assert bad.config is None and list(bad.errors) == ["port"]


def test_the_panel_validates_once_per_change_and_launches_with_that_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    builds: list[LaunchConfig] = []
    real = LaunchConfig.build

    def counting(**kw: Any) -> LaunchConfig:
        builds.append(real(**kw))
        return builds[-1]

    monkeypatch.setattr(settings_module.LaunchConfig, "build", counting)
    launched: list[LaunchConfig] = []

    def start(config: LaunchConfig, *args: object) -> Any:
        launched.append(config)
        raise RuntimeError("not started in this test")

    monkeypatch.setattr(panel_module, "start_with_display", start)
    panel = Panel(print)
    try:
        assert len(builds) == 1  # the form shown
        panel.view.procs.value = 3  # one change, one validation
        assert len(builds) == 2 and builds[-1].job.world_size == 3
        panel.code()
        with pytest.raises(RuntimeError, match="not started in this test"):
            panel.launch()
        assert len(builds) == 2
        assert launched == [builds[-1]] and launched[0] is builds[-1]
    finally:
        panel.close(wait=False)
