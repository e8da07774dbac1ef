"""Pool settings a launch sends to the forkserver (``starters.pool_request``)."""

from __future__ import annotations

import pytest

from nbddp.errors import ConfigError
from nbddp.launcher.starters import POOL_IDLE, POOL_MAX, pool_request
from tests.procs import POOL_CAP


def test_the_pool_is_sized_to_the_launch_and_capped() -> None:
    assert pool_request({"LOCAL_WORLD_SIZE": "2"}) == (2, POOL_IDLE)
    assert pool_request({"LOCAL_WORLD_SIZE": str(POOL_MAX + 5)}) == (POOL_MAX, POOL_IDLE)
    assert pool_request({"LOCAL_WORLD_SIZE": "4", "NBDDP_POOL": "3"}) == (3, POOL_IDLE)


def test_nbddp_pool_0_turns_it_off_and_nbddp_pool_idle_sets_the_timeout() -> None:
    assert pool_request({"LOCAL_WORLD_SIZE": "2", "NBDDP_POOL": "0"})[0] == 0
    assert pool_request({"LOCAL_WORLD_SIZE": "2", "NBDDP_POOL_IDLE": "0.5"}) == (2, 0.5)


@pytest.mark.parametrize("setting", [{"NBDDP_POOL": "many"}, {"NBDDP_POOL_IDLE": "-1"}])
def test_a_bad_setting_says_what_to_do(setting: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="unset it for the default"):
        pool_request({"LOCAL_WORLD_SIZE": "2", **setting})


def test_the_leftover_check_knows_the_default_cap() -> None:
    assert POOL_CAP == POOL_MAX
