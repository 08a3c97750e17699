"""Small synchronous helpers for talking to a worker from tools (`mindmotor npu-smi --worker`)."""

from __future__ import annotations

import grpc

from mindmotor.common import rpc
from mindmotor.common.roles import Role
from mindmotor.protocol import worker_pb2 as pb
from mindmotor.protocol import worker_pb2_grpc


def get_status(address: str, timeout: float = 5.0) -> pb.StatusResponse:
    """The worker's Status at `address` ("host:port"); grpc.RpcError on failure."""
    with rpc.channel(address) as channel:
        return worker_pb2_grpc.WorkerStub(channel).Status(pb.StatusRequest(), timeout=timeout)


def fetch_status(address: str, timeout: float = 5.0) -> dict:
    """One device snapshot, as `format_npu_smi` takes it (device, npu_id, utilization,
    hbm_used_bytes, hbm_total_bytes, power_w, temperature_c, aicore_freq_mhz, health), plus
    `load` (the Status load fields as a dict), worker_id, model, role, state and address.
    OSError when the worker cannot be reached."""
    try:
        status = get_status(address, timeout)
    except grpc.RpcError as exc:
        raise OSError(f"cannot read the status of worker {address}: "
                      f"{exc.code().name}: {exc.details()}") from exc
    snapshot = _fields(status.device)
    snapshot.update(load=_fields(status.load), worker_id=status.worker_id, model=status.model,
                    role=Role.from_proto(status.role, Role.MIXED), state=status.state, address=address)
    return snapshot


def _fields(message) -> dict:
    """A flat message as a dict of its (scalar) fields, defaults included."""
    return {f.name: getattr(message, f.name) for f in message.DESCRIPTOR.fields}
