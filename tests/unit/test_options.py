"""Every place that takes launch options matches their one definition (``LaunchOptions``).

Adding an option is one key in ``nbddp/launcher/options.py`` plus the code that
uses it; a place that forgets it (``launch()``'s parameters, the magics' flags,
the panel's fields, ``LaunchConfig.build``) fails here.
"""

from __future__ import annotations

import argparse
import inspect
from dataclasses import fields, replace
from typing import Any, get_type_hints

import pytest

import nbddp.entry as entry
from nbddp.entry import Launcher, launch
from nbddp.errors import ConfigError
from nbddp.launcher.checks import Values, check_option
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.devices import VisibleGpus
from nbddp.launcher.options import (
    DEFAULTS,
    OPTIONS,
    LaunchOptions,
    format_options,
    literal_choices,
    magic_options,
    merge_options,
)
from nbddp.notebook.magics import DdpMagics, launch_options, parse
from nbddp.notebook.panel.settings import FIELDS, PanelSettings
from nbddp.notebook.panel.view import PanelView

NO_GPU = VisibleGpus((), "none in a test")
TWO_GPUS = VisibleGpus(("4", "5"), "CUDA_VISIBLE_DEVICES=4,5")

SAMPLE: dict[str, Any] = {
    "gpus": [0, 1],
    "procs": 3,
    "nodes": 2,
    "cluster": "ray://head:10001",
    "start_method": "spawn",
    "port": 29511,
    "master_addr": "10.0.0.1",
    "timeout": 90.0,
    "env": {"A": "1", "B": "x=y"},
    "mixed_precision": "bf16",
    "backend": "gloo",
    "init_process_group": True,
    "max_restarts": 3,
    "output": "rank0",
    "tail": 5,
    "debug": True,
}
"""A valid value other than the default for every option (add one with a new option)."""

MAGICS = {
    "%%ddp": DdpMagics.ddp,
    "%ddp_config": DdpMagics.ddp_config,
    "%ddp_panel": DdpMagics.ddp_panel,
}


def test_every_option_has_a_sample_that_differs_from_its_default() -> None:
    assert list(SAMPLE) == list(OPTIONS)
    for name, option in OPTIONS.items():
        assert SAMPLE[name] != option.default, name
        assert option.help and "\n" not in option.help, name


def test_choices_come_from_the_literal_types() -> None:
    assert OPTIONS["start_method"].choices == ("forkserver", "spawn", "fork")
    assert OPTIONS["mixed_precision"].choices == ("no", "fp16", "bf16", "fp8")
    assert OPTIONS["backend"].choices == ("nccl", "gloo")  # inside "Backend | None"
    assert OPTIONS["output"].choices == ("all", "rank0", "none")
    assert OPTIONS["port"].choices == ()
    assert literal_choices(int) == ()
    for option in OPTIONS.values():
        if option.choices:
            assert option.default in (None, *option.choices), option.name


# -- launch() -----------------------------------------------------------------


def test_launch_parameters_are_the_options_with_their_defaults_and_types() -> None:
    params = inspect.signature(launch).parameters
    keywords = {name: p for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(keywords) - {"block"} == set(OPTIONS)
    hints = get_type_hints(launch)
    for name, option in OPTIONS.items():
        assert keywords[name].default == option.default, name
        assert hints[name] == option.type, name


class Captured(Exception):
    """Raised by a stand-in ``LaunchConfig.build`` to hand back its keywords."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        super().__init__("captured")
        self.kwargs = kwargs


def capture_build(monkeypatch: pytest.MonkeyPatch) -> None:
    def build(**kwargs: Any) -> LaunchConfig:
        raise Captured(kwargs)

    monkeypatch.setattr(entry.LaunchConfig, "build", build)


def test_launch_hands_every_option_to_build(monkeypatch: pytest.MonkeyPatch) -> None:
    capture_build(monkeypatch)
    with pytest.raises(Captured) as info:
        launch(print, 1, **SAMPLE)
    assert info.value.kwargs == SAMPLE
    with pytest.raises(Captured) as info:
        launch(print)
    assert info.value.kwargs == DEFAULTS


def test_launcher_takes_the_options_as_keywords_or_one_dict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    launcher = Launcher({"procs": 2, "output": "all"}, output="none", timeout=9.0)
    assert launcher.options == {"procs": 2, "output": "none", "timeout": 9.0}
    assert launcher.output == "none"
    assert Launcher().output == "all" and Launcher().options == {}
    capture_build(monkeypatch)
    with pytest.raises(Captured) as info:
        Launcher(**SAMPLE).run(print, 1)
    assert info.value.kwargs == SAMPLE


# -- LaunchConfig.build -------------------------------------------------------


def test_build_takes_every_option_and_no_other() -> None:
    # gpus and procs together are refused; restarts are not made on a cluster (yet)
    sample = {**SAMPLE, "gpus": None, "nodes": 1, "cluster": None}
    config = LaunchConfig.build(visible=TWO_GPUS, environ={}, **sample)
    job = config.job
    assert (job.world_size, job.start_method, job.port) == (3, "spawn", 29511)
    assert (job.master_addr, job.timeout, job.env) == ("10.0.0.1", 90.0, SAMPLE["env"])
    assert (job.mixed_precision, job.backend, job.init_process_group) == ("bf16", "gloo", True)
    assert (config.view.output, config.view.tail, job.max_restarts) == ("rank0", 5, 3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        LaunchConfig.build(bogus=1)  # type: ignore[call-arg]


def test_build_defaults_are_the_option_defaults() -> None:
    plain = LaunchConfig.build(visible=NO_GPU, environ={})
    assert plain == LaunchConfig.build(visible=NO_GPU, environ={}, **DEFAULTS)
    for name in ("start_method", "master_addr", "port", "timeout", "mixed_precision"):
        assert getattr(plain.job, name) == OPTIONS[name].default, name
    assert (plain.job.init_process_group, plain.view.output, plain.view.tail) == (
        OPTIONS["init_process_group"].default,
        OPTIONS["output"].default,
        OPTIONS["tail"].default,
    )
    assert plain.job.max_restarts == OPTIONS["max_restarts"].default


def test_each_option_is_checked_on_its_own() -> None:
    checked = {f.name for f in fields(Values)}
    assert checked == set(OPTIONS)
    for name, option in OPTIONS.items():
        check_option(name, option.default)
        check_option(name, SAMPLE[name])
        if option.choices:
            with pytest.raises(ConfigError, match="choose one of " + ", ".join(option.choices)):
                check_option(name, "bogus")
    with pytest.raises(ValueError, match="no launch option is named 'bogus'"):
        check_option("bogus", 1)
    # Whether GPU 5 is visible is the combination's question, not the option's.
    check_option("gpus", [5])
    with pytest.raises(ConfigError, match="GPU id 5 is not visible"):
        LaunchConfig.build(visible=TWO_GPUS, gpus=[5])


# -- the magics ---------------------------------------------------------------


def launch_group(magic: Any) -> list[argparse.Action]:
    parser: argparse.ArgumentParser = magic.parser
    (group,) = [g for g in parser._action_groups if (g.title or "").startswith("launch options")]
    return list(group._group_actions)


@pytest.mark.parametrize("name", list(MAGICS))
def test_the_magics_flags_are_the_options(name: str) -> None:
    actions = launch_group(MAGICS[name])
    expected = magic_options()
    assert [a.option_strings for a in actions] == [[o.flag] for o in expected]
    for action, option in zip(actions, expected, strict=True):
        assert action.dest == option.name
        assert action.default is None  # not given: the option's default applies
        assert tuple(action.choices or ()) == option.choices
        assert action.help == option.help
    doc = MAGICS[name].__doc__ or ""
    for option in expected:
        assert option.flag in doc
        if option.choices:
            assert "{" + ",".join(option.choices) + "}" in doc


def test_options_the_magics_spell_round_trip_through_format_options() -> None:
    given = {o.name: SAMPLE[o.name] for o in magic_options()}
    line = format_options(given)  # type: ignore[arg-type]
    assert launch_options(parse(DdpMagics.ddp, line, "%%ddp")) == given
    with pytest.raises(ValueError, match="no flag for backend"):
        format_options({"backend": "gloo"})


def test_merging_follows_the_definition() -> None:
    defaults: LaunchOptions = {"gpus": 2, "env": {"A": "1"}, "timeout": 9.0}
    merged = merge_options(defaults, {"procs": 1, "env": {"B": "2"}, "timeout": 3.0})
    assert merged == {"procs": 1, "env": {"A": "1", "B": "2"}, "timeout": 3.0}
    grouped = {o.name for o in OPTIONS.values() if o.group == "devices"}
    assert grouped == {"gpus", "procs"}
    assert [o.name for o in OPTIONS.values() if o.merges] == ["env"]


# -- the panel ----------------------------------------------------------------


PANEL_OPTIONS = {"cluster", "env", "gpus", "max_restarts", "mixed_precision", "nodes", "port"}
PANEL_OPTIONS |= {"procs", "start_method", "timeout"}


def test_the_panels_fields_are_the_panel_options() -> None:
    assert set(FIELDS) & set(OPTIONS) == PANEL_OPTIONS  # the form lays them out its own way
    assert set(FIELDS) - set(OPTIONS) == {"device"}
    view = PanelView("t", PanelSettings.initial(0), "GPUs: none")
    assert tuple(view.fields) == FIELDS


def test_the_panels_defaults_are_the_option_defaults() -> None:
    assert PanelSettings.initial(0).options() == {"procs": 2}
    assert PanelSettings.initial(2).options() == {"gpus": 2}
    for name in ("start_method", "mixed_precision"):
        assert getattr(PanelSettings(), name) == OPTIONS[name].default


def test_the_panel_offers_the_options_choices() -> None:
    view = PanelView("t", PanelSettings.initial(0), "GPUs: none")
    offered = [name for name, option in OPTIONS.items() if name in PANEL_OPTIONS and option.choices]
    assert offered == ["start_method", "mixed_precision"]  # else this test would check nothing
    for name in offered:
        choices = OPTIONS[name].choices
        assert tuple(view.fields[name].options) == choices, name
        for choice in choices:
            settings = replace(PanelSettings.initial(0), **{name: choice})
            assert settings.validate().errors == {}, (name, choice)


def test_the_panel_presets_every_panel_option_and_reads_it_back() -> None:
    given = {name: SAMPLE[name] for name in OPTIONS if name in PANEL_OPTIONS - {"gpus"}}
    settings = PanelSettings.initial(0, given)  # type: ignore[arg-type]
    assert settings.options() == given
    assert PanelSettings.initial(4, {"gpus": [0, 1]}).options() == {"gpus": [0, 1]}


@pytest.mark.parametrize("value", [-1, 1.5, True, "2"])
def test_max_restarts_must_be_a_whole_number_of_restarts(value: object) -> None:
    with pytest.raises(ConfigError, match="max_restarts must be a whole number of restarts"):
        check_option("max_restarts", value)


def test_every_rank_sees_its_restart_count_as_torchrun_sets_it() -> None:
    spec = LaunchConfig.build(visible=NO_GPU, environ={}, procs=2, max_restarts=3).job
    env = spec.rank_env(spec.local(), 0, 29500)
    assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "3")
    again = replace(spec, restart_count=2)
    assert again.rank_env(again.local(), 1, 29500)["TORCHELASTIC_RESTART_COUNT"] == "2"
