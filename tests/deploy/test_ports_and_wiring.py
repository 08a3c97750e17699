"""docker-compose.yml and the Prometheus configs agree with the services' own flags: scrape
targets hit the metrics ports the services listen on, every address one container dials names a
service that listens there, published ports and health checks point at real ports."""

from __future__ import annotations

from urllib.parse import urlparse

from . import artifacts as A

COMPOSE = A.compose()
SERVICES = {s.name: s for s in A.compose_services()}
BY_KIND = {kind: [s for s in SERVICES.values() if s.command == kind] for kind in ("controller", "coordinator", "worker")}
JOB_KIND = {"mindmotor-controller": "controller", "mindmotor-coordinator": "coordinator", "mindmotor-worker": "worker"}


def listening(name: str) -> set[int]:
    return set(SERVICES[name].listening_ports().values())


def test_prometheus_scrapes_every_service_on_its_metrics_port():
    config = A.load_yaml(A.PROMETHEUS_COMPOSE)
    scraped: dict[str, str] = {}
    for job in config["scrape_configs"]:
        if job["job_name"] not in JOB_KIND:
            continue
        kind = JOB_KIND[job["job_name"]]
        assert job.get("metrics_path", "/metrics") == "/metrics"
        for static in job["static_configs"]:
            for target in static["targets"]:
                host, port = A.split_address(target)
                assert host in SERVICES, f"{job['job_name']}: {target}: no compose service {host!r}"
                service = SERVICES[host]
                assert service.command == kind, f"{target} is a {service.command}, scraped as a {kind}"
                assert port == service.metrics_port(), \
                    f"{target}: {host} serves /metrics on {service.metrics_port()} (its flags), not {port}"
                scraped[host] = target
    assert set(scraped) == set(SERVICES), f"not scraped: {sorted(set(SERVICES) - set(scraped))}"
    assert set(JOB_KIND) <= {j["job_name"] for j in config["scrape_configs"]}


def test_containers_dial_service_names_and_listening_ports():
    (controller,) = BY_KIND["controller"]
    grpc = controller.listening_ports()["grpc"]
    for s in BY_KIND["worker"]:
        assert s.settings.controller == f"{controller.name}:{grpc}", s.where
        host, port = A.split_address(s.settings.advertise_address)
        assert (host, port) == (s.name, s.settings.port), (f"{s.where}: advertises {s.settings.advertise_address}; "
                                                          f"other containers reach it as {s.name}:{s.settings.port}")
    for s in BY_KIND["coordinator"]:
        assert A.coordinator_settings(s).controllers == [f"{controller.name}:{grpc}"], s.where
    redis_url = urlparse(controller.env["MINDMOTOR_REDIS_URL"])
    assert redis_url.hostname in COMPOSE["services"] and redis_url.port == 6379
    redis_command = COMPOSE["services"][redis_url.hostname].get("command") or []
    assert "--port" not in redis_command, "the Redis URL assumes the default port"


def test_published_ports_are_listened_on():
    for name, svc in COMPOSE["services"].items():
        for mapping in svc.get("ports") or []:
            container_port = int(str(mapping).split(":")[-1].split("/")[0])
            if name in SERVICES:
                assert container_port in listening(name), f"{name}: publishes {mapping}, listens on {listening(name)}"
    assert "8000" in str(COMPOSE["services"]["coordinator"]["ports"]), "the API on the host's :8000"


def test_health_checks_and_dependencies():
    for name, svc in COMPOSE["services"].items():
        for dep in svc.get("depends_on") or []:
            assert dep in COMPOSE["services"], f"{name} depends on unknown {dep}"
            if isinstance(svc["depends_on"], dict) and svc["depends_on"][dep].get("condition") == "service_healthy":
                assert "healthcheck" in COMPOSE["services"][dep], f"{name} waits for {dep}'s health, which has none"
        if name not in SERVICES:
            continue
        test = svc["healthcheck"]["test"]
        assert test[:2] == ["CMD", "mindmotor-healthcheck"], name
        kind, target = test[2], test[3]
        if kind == "grpc":
            assert A.split_address(target)[1] == SERVICES[name].listening_ports()["grpc"], name
        else:
            parsed = urlparse(target)
            assert parsed.port == SERVICES[name].listening_ports()["http"] and parsed.path == "/ready", name
    for s in BY_KIND["worker"]:
        grace = COMPOSE["services"][s.name]["stop_grace_period"]
        assert float(grace.rstrip("s")) > s.settings.drain_timeout_s, f"{s.name}: docker kills before the drain ends"


def test_prometheus_and_grafana_mounts():
    prom = COMPOSE["services"]["prometheus"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in prom["volumes"] if m.startswith("./")}
    config_path = next(a.split("=", 1)[1] for a in prom["command"] if a.startswith("--config.file="))
    assert (A.ROOT / mounts[config_path]).resolve() == A.PROMETHEUS_COMPOSE
    config_dir = config_path.rsplit("/", 1)[0]
    for rule_file in A.load_yaml(A.PROMETHEUS_COMPOSE)["rule_files"]:
        container_path = rule_file if rule_file.startswith("/") else f"{config_dir}/{rule_file}"
        assert container_path in mounts, f"rule file {rule_file} is not mounted at {container_path}"
        assert (A.ROOT / mounts[container_path]).is_file()

    grafana = COMPOSE["services"]["grafana"]
    gmounts = {m.split(":")[1]: m.split(":")[0] for m in grafana["volumes"] if m.startswith("./")}
    assert (A.ROOT / gmounts["/etc/grafana/provisioning"]).resolve() == (A.GRAFANA / "provisioning").resolve()
    provider = A.load_yaml(A.GRAFANA / "provisioning" / "dashboards" / "mindmotor.yml")["providers"][0]
    dashboards_dir = gmounts[provider["options"]["path"]]
    assert (A.ROOT / dashboards_dir).resolve() == (A.GRAFANA / "dashboards").resolve()

    (datasource,) = A.load_yaml(A.GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"]
    url = urlparse(datasource["url"])
    assert url.hostname == "prometheus" and url.port == 9090 and "prometheus" in COMPOSE["services"]
    for path in A.DASHBOARDS:
        for panel in A.dashboard_panels(A.load_dashboard(path)):
            ds = panel.get("datasource")
            if ds:
                assert ds == {"type": "prometheus", "uid": datasource["uid"]}, f"{path.name}: {panel.get('title')}"


def test_kubernetes_prometheus_jobs_match_the_manifests():
    """prometheus-kubernetes.yml keeps pods by the component label the manifests set, with the same
    job names as the compose config (so alerts and dashboards work on both), and sends the admin
    token to the controller (the manifests make it require one)."""
    config = A.load_yaml(A.PROMETHEUS_K8S)
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(JOB_KIND) == set(jobs)
    components = {s.command: w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
                  for w, _, s in A.k8s_services()}
    for name, job in jobs.items():
        keep = [r for r in job["relabel_configs"] if r.get("action") == "keep"
                and r["source_labels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_component"]]
        assert [r["regex"] for r in keep] == [components[JOB_KIND[name]]], name
        assert job["kubernetes_sd_configs"][0]["namespaces"]["names"] == [A.NAMESPACE]
    assert all("authorization" not in job for job in jobs.values())     # every /metrics is open
    assert config["rule_files"] == ["alerts.yml"]
