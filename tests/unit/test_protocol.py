"""Worker messages: framing survives any split of the byte stream; orders carry typed values."""

from __future__ import annotations

import socket

from nbddp.launcher import launching
from nbddp.launcher.config import LaunchConfig
from nbddp.launcher.devices import VisibleGpus
from nbddp.wire import protocol
from nbddp.wire.payload import Payload, load_call


def test_frames_survive_arbitrary_splits() -> None:
    data = protocol.encode("metrics", [{"loss": 1.5}]) + protocol.encode("result", b"x" * 100_000)
    for step in (1, 7, 4096, len(data)):
        reader = protocol.FrameReader()
        got = []
        for i in range(0, len(data), step):
            got += reader.feed(data[i : i + step])
        assert got == [("metrics", [{"loss": 1.5}]), ("result", b"x" * 100_000)]
        assert reader.pending == 0


def test_blocking_send_and_recv_over_a_socketpair() -> None:
    a, b = socket.socketpair()
    with a, b:
        protocol.send(a, "started", 42)
        assert protocol.recv(b) == ("started", 42)
        a.close()
        assert protocol.recv(b) is None


def test_a_run_order_arrives_with_its_typed_values_and_its_call_beside_it() -> None:
    payload = Payload.serialize(divmod, (7, 2), {})
    order = protocol.RunOrder(
        place=protocol.Placement(rank=1, local_rank=1, world_size=2, device="cuda", cuda_index=1),
        env={"RANK": "1"},
        call=payload.ref(),
        sys_path=["/src"],
        cwd="/",
        backend="nccl",
        init_process_group=True,
        threads=4,
    )
    a, b = socket.socketpair()
    with a, b:
        protocol.send_with_fds(a, *protocol.encode_with_fds("run", order))
        a.close()
        ((kind, body),) = list(protocol.messages(b))
    assert kind == "run" and (body.place, body.env, body.threads) == (order.place, order.env, 4)
    assert type(body.place.cuda_index) is int and type(body.threads) is int
    assert body.call.fds.owned and body.call.fds.fds[0] not in order.call.fds.fds  # its own copy
    call = load_call(body.call)
    assert call.fn(*call.args) == (3, 1)
    assert body.call.fds.fds == ()  # the rank's copies are closed once the call is loaded


def order_for(config: LaunchConfig, rank: int) -> protocol.RunOrder:
    """The notebook's side of a rank's order, without processes."""
    spec = config.job
    return launching.order(spec, spec.local(), rank, 29500, Payload(b"call", (7, 8)).ref(), "id")


def test_the_job_orders_a_gpu_rank_with_its_device_and_thread_count() -> None:
    config = LaunchConfig.build(
        gpus=2, visible=VisibleGpus(("0", "1"), "test"), env={"OMP_NUM_THREADS": "3"}
    )
    order = order_for(config, 1)
    assert order.place == protocol.Placement(
        rank=1, local_rank=1, world_size=2, device="cuda", cuda_index=1
    )
    assert (order.backend, order.init_process_group, order.threads) == ("nccl", False, 3)
    assert (order.call.size, order.call.fds.fds[1:]) == (4, (7, 8))
    assert order.env["RANK"] == "1"  # the environment is still set, for the user's code


def test_the_job_orders_cpu_and_inherit_ranks_without_a_cuda_device() -> None:
    cpu = LaunchConfig.build(
        procs=3, init_process_group=True, env={"OMP_NUM_THREADS": "not a number"}
    )
    order = order_for(cpu, 2)
    assert order.place.device == "cpu" and order.place.cuda_index is None
    assert order.place.world_size == 3 and order.init_process_group
    assert order.backend == "gloo" and order.threads is None
    inherit = LaunchConfig.build(procs=2, inherit_devices=True)
    order = order_for(inherit, 0)
    assert order.place.device == "inherit" and order.place.cuda_index is None
