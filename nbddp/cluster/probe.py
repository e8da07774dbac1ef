"""Asking an address whether it is the Ray endpoint the notebook was given, in seconds.

``probe(cluster)`` returns None when the address answers as the Ray service its
form names (``ray://``: Ray Client; ``host:port``: a GCS), else one line saying
what answers instead and what to use. A gRPC call with a deadline, since
``ray.init`` at a wrong port waits 20-35 s before failing; skipped under TLS.
"""

from __future__ import annotations

import os
import socket

PROBE_TIMEOUT = 4.0  # seconds the address gets to answer the probe's call
CONNECT_TIMEOUT = 3.0  # seconds it gets to accept a TCP connection

CLIENT_METHOD = "/ray.rpc.RayletDriver/ClusterInfo"
GCS_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"


def probe(address: str) -> str | None:
    """Why ``address`` is not the Ray endpoint it names, or None; ``auto`` is not probed."""
    if address == "auto":
        return None
    client = address.startswith("ray://")
    host, _, port_text = address.removeprefix("ray://").rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        return f"{port_text!r} is not a port number"
    try:
        socket.create_connection((host.strip("[]"), port), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        return f"nothing answers there ({why})"
    if os.environ.get("RAY_USE_TLS", "0") not in ("", "0"):
        return None
    return _grpc_probe(f"{host}:{port}", client)


def _grpc_probe(target: str, client: bool) -> str | None:
    import grpc  # type: ignore[import-untyped]

    method = CLIENT_METHOD if client else GCS_METHOD
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            method,
            request_serializer=lambda _: _request(client),
            response_deserializer=lambda data: data,
        )
        try:
            call(None, timeout=PROBE_TIMEOUT)
            return None
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
    if code == grpc.StatusCode.UNIMPLEMENTED:
        if client:
            return (
                "it answers, but not as a Ray Client server (a GCS port?); use it as "
                f"'{target}' without ray://, or the Ray Client port (default 10001) with ray://"
            )
        return (
            "it answers, but not as a Ray GCS (a Ray Client port?); use "
            f"'ray://{target}', or the GCS port (default 6379) without ray://"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"it accepts connections but did not answer within {PROBE_TIMEOUT:g}s"
    if code == grpc.StatusCode.UNAVAILABLE:
        return "it accepts connections but does not speak gRPC (not a Ray port)"
    return None  # any other answer is a gRPC server that knows the method: Ray


def _request(client: bool) -> bytes:
    if client:
        from ray.core.generated import ray_client_pb2 as client_pb

        kinds = getattr(client_pb, "ClusterInfoType")  # generated: no stubs  # noqa: B009
        request = getattr(client_pb, "ClusterInfoRequest")(type=kinds.PING)  # noqa: B009
        return bytes(request.SerializeToString())
    from ray.core.generated import gcs_service_pb2 as gcs_pb

    return bytes(getattr(gcs_pb, "GetClusterIdRequest")().SerializeToString())  # noqa: B009
