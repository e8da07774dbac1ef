"""The panel's form as data: validation messages, launch options and the equivalent code."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.spelling import check_call
from nbddp.notebook.panel import panel as panel_module
from nbddp.notebook.panel import settings as settings_module
from nbddp.notebook.panel.code import call_source, run_code
from nbddp.notebook.panel.panel import Panel
from nbddp.notebook.panel.settings import PanelSettings, parse_kwargs

CPU = PanelSettings.initial(0)
GPUS = PanelSettings.initial(4)


def test_defaults_follow_the_machine() -> None:
    assert (CPU.device, CPU.procs, CPU.gpus) == ("cpu", "2", ())
    assert (GPUS.device, GPUS.gpus) == ("gpu", (0, 1, 2, 3))
    assert CPU.validate().errors == {}


def test_the_whole_config_is_checked_once_the_fields_are_valid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # With every GPU hidden the fields are fine, the launch they describe is not.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    errors = PanelSettings.initial(4, None).validate().errors
    assert list(errors) == ["launch"] and "none is visible" in errors["launch"]


def test_valid_settings_build_the_launch_they_show() -> None:
    settings = replace(
        CPU,
        procs="3",
        start_method="spawn",
        port=" 29511 ",
        timeout="90",
        max_restarts=" 2 ",
        mixed_precision="bf16",
        env="A=1\n\n# a comment\nB = x=y\n",
    )
    assert settings.validate().errors == {}
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
        ({"procs": "0"}, "procs", "from 1 to 256"),
        ({"procs": "10000"}, "procs", "from 1 to 256"),
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
    errors = replace(CPU, **change).validate().errors  # type: ignore[arg-type]
    assert list(errors) == [field]
    assert says in errors[field]


def test_no_gpu_chosen_is_an_error_on_the_gpu_list() -> None:
    assert list(replace(GPUS, gpus=()).validate().errors) == ["gpus"]


def test_gpu_choice_is_a_count_when_all_else_ids() -> None:
    assert GPUS.options() == {"gpus": 4}
    assert replace(GPUS, gpus=(1, 3)).options() == {"gpus": [1, 3]}


def test_initial_from_session_options() -> None:
    settings = PanelSettings.initial(
        0, {"procs": 4, "start_method": "spawn", "timeout": 30.0, "env": {"X": "1"}}
    )
    assert (settings.procs, settings.start_method, settings.timeout, settings.env) == (
        "4",
        "spawn",
        "30",
        "X=1",
    )
    assert PanelSettings.initial(0, {"max_restarts": 3}).max_restarts == "3"
    assert PanelSettings.initial(0, {}).max_restarts == ""
    assert PanelSettings.initial(4, {"gpus": [0, 2]}).gpus == (0, 2)
    assert PanelSettings.initial(4, {"gpus": 2}).gpus == (0, 1)


def test_code_for_literal_arguments_is_exact() -> None:
    def train(*args: object, **kwargs: object) -> None: ...

    source = call_source(train, (3, "x", [1.5, None]), {"lr": 0.1}, {"train": train})
    assert source.complete
    settings = replace(CPU, start_method="spawn", env="A=1")
    magic, launch = run_code(source, settings)
    assert magic == (
        "%%ddp --no-init --procs 2 --start-method spawn --env A=1 --out result\n"
        "result = train(3, 'x', [1.5, None], lr=0.1)"
    )
    assert launch == (
        "result = nbddp.launch(train, 3, 'x', [1.5, None], lr=0.1, procs=2, "
        "start_method='spawn', env={'A': '1'})"
    )


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        # The form only parses the text; the config's own check says what is wrong.
        # It names the form's fields, as the panel shows them.
        ({"port": "70000"}, "port", "Master port must be a number from 1 to 65535"),
        # The value as typed: a whole number stays one.
        ({"timeout": "-5"}, "timeout", "Timeout (s) must be positive (seconds), got -5;"),
        ({"timeout": "-2.5"}, "timeout", "Timeout (s) must be positive (seconds), got -2.5;"),
        ({"start_method": "thread"}, "start_method", "unknown Start method 'thread'"),
        ({"mixed_precision": "fp64"}, "mixed_precision", "unknown Mixed precision 'fp64'"),
    ],
)
def test_field_values_are_checked_by_the_config(
    change: dict[str, object], field: str, message: str
) -> None:
    assert message in replace(CPU, **change).validate().errors[field]  # type: ignore[arg-type]


def test_every_bad_field_is_reported_at_once_in_form_order() -> None:
    bad = replace(CPU, port="http", timeout="-1", start_method="thread", procs="0")
    assert list(bad.validate().errors) == ["procs", "start_method", "port", "timeout"]


def test_validate_carries_the_config_exactly_when_there_are_no_errors() -> None:
    checked = replace(CPU, procs="3", timeout="5").validate()
    assert checked.errors == {} and checked.config is not None
    assert (checked.config.job.world_size, checked.config.job.timeout) == (3, 5.0)
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
        panel.view.procs.value = "3"  # one change, one validation
        assert len(builds) == 2 and builds[-1].job.world_size == 3
        panel.code()
        with pytest.raises(RuntimeError, match="not started in this test"):
            panel.launch()
        assert len(builds) == 2
        assert launched == [builds[-1]] and launched[0] is builds[-1]
    finally:
        panel.close(wait=False)


# -- the function's keyword arguments ------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("", {}),
        ("epochs=3, lr=0.1", {"epochs": 3, "lr": 0.1}),
        ("  epochs = 3 ,\n lr=1e-3,", {"epochs": 3, "lr": 0.001}),
        (
            "name='a, b=c', sizes=[1, (2, 3)], opts={'k': None}",
            {"name": "a, b=c", "sizes": [1, (2, 3)], "opts": {"k": None}},
        ),
        ('flag=True\nnote="two\\nlines"', {"flag": True, "note": "two\nlines"}),
        ("x=-2, z=1+2j", {"x": -2, "z": 1 + 2j}),
        ("a=1,, b=2\n\n", {"a": 1, "b": 2}),  # empty entries are nothing
    ],
)
def test_keyword_arguments_are_python_literals(text: str, parsed: dict[str, object]) -> None:
    assert parse_kwargs(text) == parsed


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("epochs", "entry 1 (epochs): write NAME=VALUE, e.g. epochs=3"),
        ("epochs=3, lr=fast", "entry 2 (lr=fast): fast is not a Python literal"),
        ("epochs=3, lr=", "entry 2 (lr=): no value after ="),
        ("2x=1", "entry 1 (2x=1): '2x' is not a Python argument name"),
        ("class=1", "entry 1 (class=1): 'class' is not a Python argument name"),
        ("lr=0.1, lr=0.2", "entry 2 (lr=0.2): lr is given twice"),
        ("sizes=[1, 2", "sizes=[1, 2: a bracket or quote is not closed"),
        ("model=Net()", "entry 1 (model=Net()): Net() is not a Python literal"),
    ],
)
def test_a_wrong_keyword_argument_says_which_entry_and_why(text: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_kwargs(text)
    assert says in str(info.value)
    assert says in replace(CPU, kwargs=text).validate().errors["kwargs"]


def test_the_call_is_checked_with_the_keyword_arguments() -> None:
    def train(steps: int, *, lr: float = 0.1) -> None: ...

    def check(kwargs: dict[str, object]) -> None:
        check_call(train, (3,), kwargs)

    checked = replace(CPU, kwargs="lr=0.5").validate(check)
    assert checked.errors == {} and checked.kwargs == {"lr": 0.5}
    errors = replace(CPU, kwargs="epoch=2").validate(check).errors
    assert list(errors) == ["kwargs"]
    assert "unexpected keyword argument 'epoch'" in errors["kwargs"]


# -- number fields --------------------------------------------------------------


@pytest.mark.parametrize("typed", ["two", "2x", "2.5", " ", "-1", "0"])
def test_a_process_count_that_is_no_whole_number_is_refused_in_words(typed: str) -> None:
    errors = replace(CPU, procs=typed).validate().errors
    assert list(errors) == ["procs"]
    assert "a whole number, e.g. 2 (from 1 to 256)" in errors["procs"]
    assert repr(typed) in errors["procs"]  # what was typed, never silently dropped


def test_a_process_count_is_read_from_the_text() -> None:
    assert replace(CPU, procs=" 3 ").options() == {"procs": 3}


# -- every field at once ---------------------------------------------------------


def test_what_only_the_whole_launch_sees_is_flagged_with_the_other_fields() -> None:
    # MASTER_PORT is refused by the launch's own check, which the form runs too
    # while other fields are wrong; it is flagged on the Environment field.
    bad = replace(CPU, procs="two", port="http", env="MASTER_PORT=29500", kwargs="epochs=fast")
    errors = bad.validate().errors
    assert list(errors) == ["kwargs", "procs", "port", "env"]
    assert "nbddp sets MASTER_PORT itself" in errors["env"]
    # With the other fields fixed, the same message on the same field.
    assert list(replace(CPU, env="MASTER_PORT=29500").validate().errors) == ["env"]
