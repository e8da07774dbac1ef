"""When the forkserver refills its pool (``pool.refill_wait``): during a run only where a
core is spare, once the launch's requests are over; otherwise once no rank has run
for ``REFILL_DELAY``; never when the pool is full."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbddp.launcher.pool import REFILL_DELAY, SETTLE, STALLED, cpu_stall_us, refill_wait


def wait(
    running: int,
    cores: int,
    since_request: float = 10.0,
    since_active: float = 10.0,
    stalled: float = 0.0,
) -> float | None:
    return refill_wait(
        short=True,
        running=running,
        cores=cores,
        since_request=since_request,
        since_active=since_active,
        stalled=stalled,
    )


def test_a_full_pool_is_never_refilled() -> None:
    assert (
        refill_wait(short=False, running=0, cores=16, since_request=99.0, since_active=99.0) is None
    )


@pytest.mark.parametrize(("running", "cores"), [(8, 16), (1, 2), (15, 16)])
def test_with_a_core_to_spare_it_refills_during_the_run(running: int, cores: int) -> None:
    assert wait(running, cores) == 0.0


def test_during_the_run_it_waits_until_the_launchs_requests_are_over() -> None:
    assert wait(8, 16, since_request=0.0, since_active=0.0) == pytest.approx(SETTLE)
    assert wait(8, 16, since_request=SETTLE / 4, since_active=0.0) == pytest.approx(SETTLE * 0.75)
    assert wait(8, 16, since_request=SETTLE, since_active=0.0) == 0.0


@pytest.mark.parametrize(("running", "cores"), [(2, 2), (8, 8), (12, 8)])
def test_when_the_ranks_take_every_core_it_never_refills_during_the_run(
    running: int, cores: int
) -> None:
    assert wait(running, cores) is None


@pytest.mark.parametrize("cores", [1, 2, 16])
def test_once_no_rank_runs_it_refills_after_the_delay(cores: int) -> None:
    assert wait(0, cores, since_active=0.0) == pytest.approx(REFILL_DELAY)
    assert wait(0, cores, since_active=REFILL_DELAY / 2) == pytest.approx(REFILL_DELAY / 2)
    assert wait(0, cores, since_active=REFILL_DELAY) == 0.0


def test_a_core_is_not_spare_while_tasks_wait_for_cpu() -> None:
    assert wait(8, 16, stalled=STALLED) == 0.0
    assert wait(8, 16, stalled=STALLED * 2) is None
    assert wait(0, 16, stalled=1.0) == 0.0  # between runs: the delay alone decides


def test_the_cpu_stall_total_is_read_from_psi_and_none_where_there_is_none(
    tmp_path: Path,
) -> None:
    psi = tmp_path / "cpu"
    psi.write_text(
        "some avg10=31.34 avg60=25.16 avg300=42.33 total=2735577573\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    assert cpu_stall_us(str(psi)) == 2735577573
    psi.write_text("garbage\n")
    assert cpu_stall_us(str(psi)) is None
    assert cpu_stall_us(str(tmp_path / "absent")) is None


def test_the_stall_limit_comes_from_the_environment_when_it_is_a_share() -> None:
    from nbddp.launcher.pool import STALLED, stall_limit

    assert stall_limit({}) == STALLED
    assert stall_limit({"NBDDP_POOL_STALL": "1"}) == 1.0
    assert stall_limit({"NBDDP_POOL_STALL": "0.25"}) == 0.25
    assert stall_limit({"NBDDP_POOL_STALL": "lots"}) == STALLED
    assert stall_limit({"NBDDP_POOL_STALL": "-1"}) == STALLED
    # At 1, a stalled machine still has its spare core refilled.
    kw = {"short": True, "running": 1, "cores": 2, "since_request": 1.0, "since_active": 1.0}
    assert refill_wait(**kw, stalled=0.9) is None
    assert refill_wait(**kw, stalled=0.9, stall_limit=1.0) == 0.0
