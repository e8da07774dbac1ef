"""A call that cannot bind to the function fails before anything starts, in one line,
naming the launch option a mistaken keyword meant (in the entry point's spelling)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

import nbddp.entry as entry
from nbddp.entry import Launcher, launch, notebook_launcher, spawn
from nbddp.errors import ConfigError, PayloadError
from nbddp.launcher.spelling import FLAGS, PANEL, check_call, close_options, spoken
from nbddp.rank.context import WithRank


def train(data: int, epochs: int = 1) -> int:
    return data * epochs


def ranked(rank: int, data: int) -> int:
    return rank + data


def flexible(*args: Any, **kwargs: Any) -> None:
    del args, kwargs


class Trainer:
    def fit(self, data: int) -> int:
        return data

    def __call__(self, data: int) -> int:
        return data


def refused(fn: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> str:
    with pytest.raises(PayloadError) as info:
        check_call(fn, args, kwargs or {})
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def started(*args: object) -> None:
        raise AssertionError("a job was made for a call that cannot bind")

    monkeypatch.setattr(entry, "Job", started)


def test_a_keyword_meant_as_a_launch_option_is_named() -> None:
    assert refused(train, (1,), {"nprocs": 2}) == (
        "train() got an unexpected keyword argument 'nprocs'; "
        "did you mean the launch option procs=2?"
    )
    assert refused(train, (1,), {"gpu": 2}).endswith("did you mean the launch option gpus=2?")
    assert refused(train, (1,), {"nproc_per_node": 4}).endswith(
        "did you mean the launch option gpus=4 or procs=4?"
    )
    assert refused(train, (1,), {"master_port": 29500}).endswith("port=29500?")
    assert refused(train, (1,), {"lr": 0.1}) == "train() got an unexpected keyword argument 'lr'"


def test_other_mismatches_say_what_python_would() -> None:
    assert refused(train) == "train() missing a required argument: 'data'"
    assert refused(train, (1, 2, 3)) == "train() got too many positional arguments"
    assert refused(train, (1,), {"data": 2}) == ("train() got multiple values for argument 'data'")


def test_partials_bound_methods_and_callable_objects_are_read_through() -> None:
    check_call(functools.partial(train, 1), (), {"epochs": 2})
    assert refused(functools.partial(train, 1), (), {"nprocs": 2}).startswith("train() got")
    check_call(Trainer().fit, (1,), {})
    assert refused(Trainer().fit, (1, 2)) == "Trainer.fit() got too many positional arguments"
    check_call(Trainer(), (1,), {})
    assert "too many positional" in refused(Trainer(), (1, 2))


def test_star_args_take_anything_and_unreadable_signatures_are_not_checked() -> None:
    # Each would raise if it were checked (the closest option to nprocs is procs).
    assert check_call(flexible, (1, 2), {"nprocs": 2}) is None
    assert check_call(min, (1, 2, 3, 4), {"bogus": 1}) is None  # builtin: no signature
    assert "did you mean the launch option procs=2" in refused(train, (1,), {"nprocs": 2})


def test_spawn_checks_the_call_with_the_rank_first() -> None:
    check_call(WithRank(ranked), (1,), {})
    with pytest.raises(PayloadError) as info:
        check_call(WithRank(ranked), (1, 2), {})
    assert str(info.value) == (
        "ranked() got too many positional arguments (spawn calls it as fn(rank, *args))"
    )
    with pytest.raises(PayloadError, match=r"missing a required argument: 'data' \(spawn"):
        check_call(WithRank(ranked), (), {})


def test_the_panel_names_its_field() -> None:
    with pytest.raises(PayloadError) as info, PANEL.speaking():
        check_call(train, (1,), {"nprocs": 2})
    assert str(info.value).endswith("did you mean the panel's Processes field?")


def test_close_options_knows_other_launchers_names() -> None:
    assert close_options("nprocs") == ("procs",)
    assert close_options("--nproc-per-node") == ("gpus", "procs")
    assert close_options("num_processes") == ("gpus", "procs")
    assert close_options("gpu") == ("gpus",)
    assert close_options("timout") == ("timeout",)
    assert close_options("out") == () and close_options("lr") == ()
    assert FLAGS.suggest(("procs",), 2) == "the launch option --procs 2"


# -- every entry point checks before it starts anything -------------------------


@pytest.mark.usefixtures("nothing_starts")
def test_launch_and_launcher_refuse_before_starting() -> None:
    with pytest.raises(TypeError, match="did you mean the launch option procs=2"):
        launch(train, 1, nprocs=2)
    with pytest.raises(PayloadError, match="train\\(\\) got an unexpected keyword argument 'gpu'"):
        Launcher(procs=2).run(train, 1, gpu=1)  # type: ignore[call-arg]


@pytest.mark.usefixtures("nothing_starts")
def test_notebook_launcher_and_spawn_refuse_before_starting() -> None:
    with pytest.raises(PayloadError, match="train\\(\\) got too many positional arguments"):
        notebook_launcher(train, args=(1, 2, 3), num_processes=2)
    with pytest.raises(PayloadError, match="spawn calls it as fn\\(rank, \\*args\\)"):
        spawn(ranked, args=(1, 2), nprocs=2)


@pytest.mark.usefixtures("nothing_starts")
def test_notebook_launcher_and_spawn_name_their_own_parameters() -> None:
    with pytest.raises(ConfigError, match="num_processes must be at least 1, got 0"):
        notebook_launcher(train, args=(1,), num_processes=0)
    with pytest.raises(ConfigError, match="use_port must be a number from 1 to 65535"):
        notebook_launcher(train, args=(1,), num_processes=1, use_port=70000)
    with pytest.raises(ConfigError, match="nprocs must be at least 1, got 0"):
        spawn(ranked, args=(1,), nprocs=0)


def test_the_default_notice_of_notebook_launcher_names_num_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU visible, whatever the machine has
    seen: list[tuple[str, ...]] = []

    def start(config: Any, *args: object) -> Any:
        seen.append(tuple(spoken(notice) for notice in config.view.notices))
        raise RuntimeError("not started in this test")

    monkeypatch.setattr(entry, "start_run", start)
    with pytest.raises(RuntimeError, match="not started"):
        notebook_launcher(train, args=(1,))
    assert seen == [
        ("no GPU visible: running 2 CPU processes (gloo); pass num_processes=N to choose how many",)
    ]


def test_the_panel_refuses_a_call_that_cannot_bind() -> None:
    from nbddp.notebook.panel.panel import Panel

    with pytest.raises(PayloadError, match="did you mean the panel's Processes field"):
        Panel(train, (1,), {"nprocs": 2})
