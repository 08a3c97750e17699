"""The InferenceService CRD and the operator's manifests (deploy/kubernetes/operator): each object
against the Kubernetes API's own schemas (kubernetes-validate's bundled OpenAPI schemas, strict:
an unknown field fails), the example against the CRD's openAPIV3Schema, and the CRD's schema and
the operator's model (operator/resource.py) accepting and refusing the same specs."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from mindmotor.deployer.backends.base import VersionTarget
from mindmotor.deployer.backends.manifests import render_version
from mindmotor.operator.reconcile import MANAGER
from mindmotor.operator.resource import API_VERSION, KIND, PLURAL, ResourceError, parse_resource

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_DIR = ROOT / "deploy" / "kubernetes" / "operator"
K8S_VERSION = "1.31.0"          # the oldest Kubernetes with every feature used here (CEL rules are GA in 1.29)


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((OPERATOR_DIR / name).read_text()) if d]


CRD = docs("crd.yaml")[0]
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
EXAMPLE = docs("inferenceservice.yaml")[0]


def ids(doc) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize("doc", docs("crd.yaml") + docs("operator.yaml"), ids=ids)
def test_manifests_validate_against_the_kubernetes_schemas(doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_kustomization_lists_every_manifest_but_the_example():
    listed = yaml.safe_load((OPERATOR_DIR / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in OPERATOR_DIR.glob("*.yaml")
                                    if p.name not in ("kustomization.yaml", "inferenceservice.yaml"))


def test_the_crd_names_what_the_operator_watches():
    spec = CRD["spec"]
    assert (f"{spec['group']}/{spec['versions'][0]['name']}", spec["names"]["kind"], spec["names"]["plural"]) == \
        (API_VERSION, KIND, PLURAL)
    assert CRD["metadata"]["name"] == f"{PLURAL}.{spec['group']}"
    jsonschema.Draft4Validator.check_schema(SCHEMA)


def test_the_example_validates_against_the_crd_and_the_operator():
    jsonschema.Draft4Validator(SCHEMA).validate(EXAMPLE)
    spec = parse_resource(EXAMPLE["spec"])
    assert (spec.replicas, spec.resources.npu, spec.roles.prefill, spec.roles.decode) == (4, 8, 1, 1)
    deployment = spec.deployment_spec(EXAMPLE["metadata"]["name"], canary_ready=True)
    assert deployment.traffic == {"v1": 90.0, "v2": 10.0}
    serving, canary = deployment.versions
    assert serving.worker["tp"] == "8" and serving.worker["emulate"] == "qwen2-7b"   # npu: 8 -> --tp 8
    assert (canary.replicas, canary.prefill, canary.decode) == (1, 0, 0)           # the split does not fit in 1


def test_the_example_renders_objects_the_kubernetes_schemas_accept():
    spec = parse_resource(EXAMPLE["spec"])
    deployment = spec.deployment_spec("qwen", canary_ready=True)
    owner = {"apiVersion": API_VERSION, "kind": KIND, "name": "qwen", "uid": "0f6c2a48-5b1e-4c1f-9d1e-1f2a3b4c5d6e",
             "controller": True, "blockOwnerDeletion": True}
    for version in deployment.versions:
        for obj in render_version(VersionTarget(deployment, version), version.replicas, "mindmotor", "mindmotor:dev",
                                  "mindmotor-controller:50050", "checkpoints", manager=MANAGER, owner=owner,
                                  pod_annotations={"serving.mindmotor.io/npu": "8"}):
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "mindmotor-operator"


def with_spec(**changes) -> dict:
    doc = copy.deepcopy(EXAMPLE)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = doc["spec"]
        for key in parents:
            node = node[key]
        if value is None:
            node.pop(leaf)
        else:
            node[leaf] = value
    return doc


# Each is refused by both the CRD's schema and the operator (`field` named in the operator's error).
REFUSED = {
    "negative replicas": (with_spec(replicas=-1), "replicas"),
    "no model": (with_spec(model=None), "model"),
    "a version name Kubernetes cannot use": (with_spec(version="V_1"), "version"),
    "zero NPUs": (with_spec(resources__npu=0), "resources.npu"),
    "a canary above 100%": (with_spec(canary__traffic=101), "canary.traffic"),
    "a canary without a version": (with_spec(canary__version=None), "canary.version"),
    "an unknown timing": (with_spec(runtime__timing="fast"), "runtime.timing"),
    "a worker flag that is not text": (with_spec(runtime__worker={"max-num-seqs": 64}), "runtime.worker"),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_the_crd_and_the_operator_refuse_the_same_specs(case):
    doc, field = REFUSED[case]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(SCHEMA).validate(doc)
    with pytest.raises(ResourceError, match=field.replace(".", r"\.")):
        parse_resource(doc["spec"])


def test_what_only_the_operator_can_check_is_refused_in_one_line_per_problem():
    """CEL rules (the API server's) and the worker's own flags (the operator's)."""
    cases = [
        (with_spec(roles__prefill=3, roles__decode=2), "exceed replicas"),
        (with_spec(canary__version="v1"), "must differ"),
        (with_spec(runtime__worker={"max-num-seqs": "many"}), "runtime.worker: .*--max-num-seqs"),
        (with_spec(runtime__worker={"port": "1"}), "runtime.worker: port: set by the deployer"),
    ]
    for doc, message in cases:
        with pytest.raises(ResourceError, match=message) as caught:
            parse_resource(doc["spec"]).deployment_spec("qwen", canary_ready=False)
        assert "Traceback" not in str(caught.value)
    rules = [r["rule"] for r in SCHEMA["properties"]["spec"]["x-kubernetes-validations"]]
    assert any("canary.version != self.version" in r for r in rules)
    assert any("self.roles.prefill" in r and "<= self.replicas" in r for r in rules)


def test_the_operator_deployment_runs_a_command_the_real_parser_accepts():
    from mindmotor.cli import build_parser

    (deployment,) = [d for d in docs("operator.yaml") if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    assert (args.command, args.namespace, args.controller) == ("operator", ["mindmotor"], "mindmotor-controller:50050")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "mindmotor-operator"


def test_a_name_the_objects_cannot_carry_is_refused_naming_metadata_name():
    with pytest.raises(ResourceError, match=r"^invalid InferenceService spec:\n  metadata\.name: must match"):
        parse_resource(EXAMPLE["spec"]).deployment_spec("a-name-longer-than-24-characters", canary_ready=False)
