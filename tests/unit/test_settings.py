"""The ``NBDDP_*`` settings: read in one place, each at its default when unset, and a
bad value refused with one line naming the variable, what it must be and its default."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbddp.errors import ConfigError
from nbddp.launcher import settings

MB = 1 << 20


def test_defaults() -> None:
    read = settings.read({})
    assert (read.prewarm, read.pool, read.pool_idle) == (True, 8, 300.0)
    assert (read.log_dir, read.log_keep, read.log_max_bytes) == (None, 50, 500 * MB)
    assert read.cluster is None


def test_values_are_read_from_the_environment(tmp_path: Path) -> None:
    read = settings.read(
        {
            "NBDDP_PREWARM": "0",
            "NBDDP_POOL": " 3 ",
            "NBDDP_POOL_IDLE": "2.5",
            "NBDDP_LOG_KEEP": "7",
            "NBDDP_LOG_MAX_MB": "1.5",
            "NBDDP_LOG_DIR": str(tmp_path),
            "NBDDP_CLUSTER": "ray://head:10001",
        }
    )
    assert (read.prewarm, read.pool, read.pool_idle) == (False, 3, 2.5)
    assert (read.log_dir, read.log_keep, read.log_max_bytes) == (tmp_path, 7, int(1.5 * MB))
    assert read.cluster == "ray://head:10001"


def test_an_empty_value_is_the_default() -> None:
    assert settings.read({"NBDDP_POOL": " ", "NBDDP_LOG_KEEP": ""}).pool == 8


@pytest.mark.parametrize(
    ("name", "value", "default"),
    [
        ("NBDDP_PREWARM", "maybe", "True"),
        ("NBDDP_POOL", "lots", "8"),
        ("NBDDP_POOL", "-1", "8"),
        ("NBDDP_POOL", "1.5", "8"),
        ("NBDDP_POOL_IDLE", "-1", "300.0"),
        ("NBDDP_POOL_IDLE", "inf", "300.0"),
        ("NBDDP_LOG_KEEP", "lots", "50"),
        ("NBDDP_LOG_KEEP", "0", "50"),
        ("NBDDP_LOG_KEEP", "2.5", "50"),
        ("NBDDP_LOG_KEEP", "-3", "50"),
        ("NBDDP_LOG_MAX_MB", "big", "500"),
        ("NBDDP_LOG_MAX_MB", "0", "500"),
        ("NBDDP_LOG_MAX_MB", "-1", "500"),
        ("NBDDP_LOG_MAX_MB", "nan", "500"),
    ],
)
def test_a_bad_value_says_which_variable_what_it_must_be_and_what_to_set(
    name: str, value: str, default: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        settings.read({name: value})
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{name}={value!r} is not ")
    assert f"set {name}={default} (the default)" in message


def test_importing_never_raises_a_bad_prewarm_only_turns_it_off() -> None:
    assert settings.prewarm_wanted({})
    assert not settings.prewarm_wanted({"NBDDP_PREWARM": "0"})
    assert not settings.prewarm_wanted({"NBDDP_PREWARM": "maybe"})
