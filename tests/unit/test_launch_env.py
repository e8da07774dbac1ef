"""The launch's environment is checked before any process starts: what a new process
could not be given is a one-line ``ConfigError`` that says what to do."""

from __future__ import annotations

from functools import partial

import pytest

from nbddp.errors import ConfigError
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.spelling import FLAGS
from tests.unit import configs
from tests.unit.configs import NO_GPU

build = partial(configs.build, procs=2)


@pytest.mark.parametrize("method", ["forkserver", "spawn", "fork"])
def test_a_nul_byte_in_an_env_value_is_a_config_error(method: str) -> None:
    with pytest.raises(ConfigError) as info:
        build(env={"TOKEN": "ab\0cd"}, start_method=method)
    assert "\n" not in str(info.value)
    assert "TOKEN" in str(info.value) and "NUL" in str(info.value)


def test_the_magics_name_the_nul_byte_in_their_words() -> None:
    with pytest.raises(ConfigError, match="--env TOKEN="), FLAGS.speaking():
        LaunchConfig.build(visible=NO_GPU, procs=2, env={"TOKEN": "\0"})


def test_a_variable_too_long_for_a_new_process_is_refused_for_spawn_only() -> None:
    big = {"BIG": "x" * (200 * 1024)}
    with pytest.raises(ConfigError, match="BIG is 204800 bytes"):
        build(env=big, start_method="spawn")
    with pytest.raises(ConfigError, match="BIG"):
        LaunchConfig.build(visible=NO_GPU, procs=2, start_method="spawn", environ=big)
    assert build(env=big, start_method="forkserver").job.env == big
    assert build(env=big, start_method="fork").job.env == big


def test_an_environment_too_large_in_all_for_a_new_process_is_refused_for_spawn() -> None:
    many = {f"V{i}": "x" * 100_000 for i in range(40)}  # each fits, 4 MB in all do not
    with pytest.raises(ConfigError, match="environment") as info:
        build(env=many, start_method="spawn")
    assert "\n" not in str(info.value)
