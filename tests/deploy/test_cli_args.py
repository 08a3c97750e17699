"""Every `mindmotor` command line in docker-compose.yml and deploy/kubernetes parses with the real
CLI parser and builds a valid service configuration, so a renamed or removed flag, a bad value, a
typo in a device or profile name, or a model path the image does not have fails here."""

from __future__ import annotations

import pytest

from mindmotor.device.profiles import get_profile
from mindmotor.device.specs import get_device_spec

from . import artifacts as A

COMPOSE = A.compose_services()
K8S = [s for _, _, s in A.k8s_services()]
ALL = COMPOSE + K8S


def test_every_platform_service_is_declared():
    for services, where in ((COMPOSE, "docker-compose.yml"), (K8S, "deploy/kubernetes")):
        commands = sorted(s.command for s in services)
        assert {"controller", "coordinator", "worker"} <= set(commands), (where, commands)
    assert sum(s.command == "worker" for s in COMPOSE) == 2


def test_an_unknown_flag_is_caught():
    """The check itself: argparse errors surface as CLIError, not as a silent pass."""
    with pytest.raises(A.CLIError, match="unrecognized arguments: --no-such-flag"):
        A.parse_cli(["worker", "--no-such-flag", "1"])
    with pytest.raises(A.CLIError, match="invalid choice"):
        A.parse_cli(["worker", "--timing", "sometimes"])


@pytest.mark.parametrize("service", [s for s in ALL if s.command == "worker"], ids=lambda s: s.where)
def test_worker_flags_make_a_valid_config(service):
    from mindmotor.worker.cli import config_from_args

    config = config_from_args(service.args)           # ValueError for inconsistent values
    get_device_spec(config.engine.device)              # KeyError/ValueError for an unknown card
    if config.engine.emulate:
        get_profile(config.engine.emulate, config.engine.tensor_parallel)
    assert config.engine.model == A.IMAGE_MODEL_DIR, "serve the model the image bundles"
    assert config.controller, "a worker must register with the controller"
    assert config.advertise_address, "the default (hostname:port) is not what other containers dial"
    assert config.host == "0.0.0.0", "listen on every interface of the container"
    assert config.metrics_port != 0, "Prometheus needs a fixed metrics port"
    assert config.port != 0


@pytest.mark.parametrize("service", [s for s in ALL if s.command == "controller"], ids=lambda s: s.where)
def test_controller_flags_make_a_valid_config(service):
    from mindmotor.controller.cli import config_from_args

    with A.environment(service.env):
        config = config_from_args(A.parse_cli(service.argv, service.env))
    assert config.redis_url and config.redis_url.startswith("redis://"), "state in Redis (restarts keep the registry)"
    assert config.host == "0.0.0.0" and config.admin_host == "0.0.0.0"
    assert config.port != 0 and config.admin_port != 0


@pytest.mark.parametrize("service", [s for s in ALL if s.command == "coordinator"], ids=lambda s: s.where)
def test_coordinator_settings_load(service):
    settings = A.coordinator_settings(service)        # ValidationError: bad policy, model dir, ...
    assert settings.controllers, "the coordinator watches the controller's routing table"
    assert not settings.workers
    assert "mindmotor-demo" in settings.models
    assert settings.host == "0.0.0.0" and settings.port != 0


def test_worker_identities_are_unique():
    for services in (COMPOSE,):
        workers = [s.settings for s in services if s.command == "worker"]
        assert len({w.worker_id for w in workers}) == len(workers)
        assert len({w.advertise_address for w in workers}) == len(workers)
        assert len({w.node for w in workers}) == 2, "the two compose workers sit on two emulated nodes"


def test_kubernetes_variables_are_defined():
    """$(POD_IP) and friends come from the container's env (downward API), else the kubelet would
    pass the literal text and the worker would advertise '$(POD_IP):50051'."""
    for w, c, service in A.k8s_services():
        assert not any("$(" in a for a in service.argv), service.where
        if service.command == "worker":
            host, port = A.split_address(service.settings.advertise_address)
            assert host == A.DOWNWARD_SAMPLES["status.podIP"], "workers advertise their pod IP"
            assert service.settings.worker_id == A.DOWNWARD_SAMPLES["metadata.name"]
            assert service.settings.node == A.DOWNWARD_SAMPLES["spec.nodeName"]
