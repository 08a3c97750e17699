"""Specs and records to and from their `deployer.proto` messages."""

from __future__ import annotations

from dataclasses import asdict, replace

from google.protobuf.json_format import MessageToDict

from mindmotor.protocol import deployer_pb2 as pb

from .reconcile import VersionStatus
from .records import DeploymentRecord
from .spec import DeploymentSpec, parse_spec


def spec_to_proto(spec: DeploymentSpec) -> pb.DeploymentSpec:
    return pb.DeploymentSpec(
        name=spec.name, model=spec.model, traffic=spec.traffic,
        adapter_traffic={a: pb.AdapterTraffic(weights=w) for a, w in spec.adapter_traffic.items()},
        versions=[pb.VersionSpec(name=v.name, checkpoint=v.checkpoint, replicas=v.replicas, prefill=v.prefill,
                                 decode=v.decode, worker=v.worker, resources=v.resources) for v in spec.versions])


def spec_from_proto(message: pb.DeploymentSpec) -> DeploymentSpec:
    """The spec a request carries, validated like a file (SpecError)."""
    data = MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    data["adapter_traffic"] = {a: dict(t.weights) for a, t in message.adapter_traffic.items()}
    return parse_spec(data, "spec")


def record_to_proto(record: DeploymentRecord, observed: list[VersionStatus], figures: str = "") -> pb.Deployment:
    """The record with the versions' status: desired replicas and weights from the record itself
    (always current), what runs and is ready from the reconcile loop's last pass (`observed`), and
    the rollout's last canary analysis (`figures`)."""
    message = pb.Deployment(spec=spec_to_proto(record.spec), generation=record.generation,
                            deleting=record.deleting, updated_at=record.updated_at,
                            versions=[pb.VersionStatus(**asdict(v)) for v in current_status(record, observed)])
    if record.rollout is not None:
        fields = asdict(record.rollout)
        analysis = fields.pop("analysis") or {"enabled": False}
        fields.pop("adapter_before")
        message.rollout.CopyFrom(pb.RolloutStatus(**fields, analysis=pb.RolloutAnalysis(**analysis),
                                                  figures=figures if record.rollout.active else ""))
    return message


def current_status(record: DeploymentRecord, observed: list[VersionStatus]) -> list[VersionStatus]:
    """Every version of the spec, then every removed one still running."""
    seen = {v.version: v for v in observed}
    targets, traffic = record.targets(), record.desired_traffic()
    empty = VersionStatus(version="", desired=0, running=0, ready=0, restarts=0, weight=0.0, last_failure="")
    rows = [replace(seen.get(name, empty), version=name, desired=targets.get(name, 0), weight=traffic.get(name, 0.0))
            for name in record.spec.version_names()]
    gone = [replace(v, desired=0, weight=0.0) for v in observed
            if v.version not in record.spec.version_names() and v.running]
    return rows + gone
