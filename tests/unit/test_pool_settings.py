"""Pool settings: read from the environment when the config is built (``NBDDP_POOL``,
``NBDDP_POOL_IDLE``), and sent to the forkserver as a typed request
(``forkserver_link.pool_request``)."""

from __future__ import annotations

import pytest

from nbddp.errors import ConfigError
from nbddp.launcher import settings
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.devices import VisibleGpus
from nbddp.launcher.forkserver_link import FORKSERVER, ForkserverLaunch, PoolRequest, pool_request
from nbddp.launcher.launching import starter
from nbddp.launcher.starters import ForkStarter, SpawnStarter
from tests.procs import POOL_CAP

NO_GPU = VisibleGpus((), "none in a test")
POOL_MAX = int(settings.POOL.default)
POOL_IDLE = settings.POOL_IDLE.default


def config(procs: int, environ: dict[str, str] | None = None, **kw: object) -> LaunchConfig:
    return LaunchConfig.build(procs=procs, visible=NO_GPU, environ=environ or {}, **kw)  # type: ignore[arg-type]


def test_the_pool_is_sized_to_the_launch_and_capped() -> None:
    assert pool_request(config(2).job, 2) == PoolRequest(2, POOL_IDLE)
    assert pool_request(config(POOL_MAX + 5).job, POOL_MAX + 5) == PoolRequest(POOL_MAX, POOL_IDLE)
    assert pool_request(config(4, {"NBDDP_POOL": "3"}).job, 4) == PoolRequest(3, POOL_IDLE)


def test_nbddp_pool_0_turns_it_off_and_nbddp_pool_idle_sets_the_timeout() -> None:
    assert pool_request(config(2, {"NBDDP_POOL": "0"}).job, 2).size == 0
    assert pool_request(config(2, {"NBDDP_POOL_IDLE": "0.5"}).job, 2) == PoolRequest(2, 0.5)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"NBDDP_POOL": "many"}, "NBDDP_POOL='many' is not a whole number of workers >= 0"),
        ({"NBDDP_POOL_IDLE": "-1"}, "NBDDP_POOL_IDLE='-1' is not a number of seconds >= 0"),
    ],
)
def test_a_bad_setting_is_refused_when_the_config_is_built(
    setting: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match="or unset it") as info:
        config(2, setting)
    assert message in str(info.value)


def test_the_notebooks_environment_is_read_once_when_the_config_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NBDDP_POOL", "1")
    monkeypatch.setenv("NBDDP_POOL_IDLE", "7")
    built = LaunchConfig.build(procs=2, visible=NO_GPU)
    monkeypatch.setenv("NBDDP_POOL", "many")  # after the build: this launch keeps its value
    assert pool_request(built.job, 2) == PoolRequest(1, 7.0)
    with pytest.raises(ConfigError, match="NBDDP_POOL='many'"):
        LaunchConfig.build(procs=2, visible=NO_GPU)


def test_the_launchs_env_option_counts_as_its_environment() -> None:
    # As when the setting was read from the rank's environment: env= wins over the notebook's.
    built = config(2, {"NBDDP_POOL": "4"}, env={"NBDDP_POOL": "0"})
    assert pool_request(built.job, 2).size == 0


def test_the_forkserver_starter_of_a_launch_carries_its_pool_request() -> None:
    assert starter(config(3, {"NBDDP_POOL": "2"}).job, 3) == ForkserverLaunch(
        FORKSERVER, PoolRequest(2, POOL_IDLE)
    )
    assert isinstance(starter(config(2, start_method="spawn").job, 2), SpawnStarter)
    assert isinstance(starter(config(2, start_method="fork").job, 2), ForkStarter)


def test_the_leftover_check_knows_the_default_cap() -> None:
    assert POOL_CAP == POOL_MAX
