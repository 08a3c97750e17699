"""One configuration system for every service (common/settings.py): flags win over `MINDMOTOR_*`
environment variables, which win over the `--config` YAML file, which wins over the defaults; a
secret's file wins over its value; a bad setting is one clear line naming it, never a secret."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mindmotor.cli import build_parser
from mindmotor.common.settings import error_text

# (command, the flags it needs anyway, a port setting: its flag, its name)
SERVICES = [
    ("controller", [], "--admin-port", "admin_port"),
    ("worker", [], "--metrics-port", "metrics_port"),
    ("deployer", ["--controller", "127.0.0.1:1"], "--metrics-port", "metrics_port"),
    ("trainer", [], "--port", "port"),
]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    import os

    for name in [n for n in os.environ if n.startswith("MINDMOTOR_") and not n.startswith(("MINDMOTOR_TLS",
                                                                                           "MINDMOTOR_CLUSTER"))]:
        monkeypatch.delenv(name)


def load(command: str, argv: list[str]):
    from importlib import import_module

    args = build_parser().parse_args([command, *argv])
    return import_module(f"mindmotor.{command}.cli").FLAGS.load(args)


@pytest.mark.parametrize("command, needed, flag, name", SERVICES, ids=[s[0] for s in SERVICES])
def test_flags_win_over_the_environment_which_wins_over_the_file(command, needed, flag, name, tmp_path, monkeypatch):
    config = tmp_path / "settings.yaml"
    config.write_text(f"{name}: 1111\n")
    default = getattr(load(command, needed), name)
    assert default not in (1111, 2222, 3333)
    assert getattr(load(command, [*needed, "--config", str(config)]), name) == 1111
    monkeypatch.setenv(f"MINDMOTOR_{name.upper()}", "")                  # empty: unset
    assert getattr(load(command, [*needed, "--config", str(config)]), name) == 1111
    monkeypatch.setenv(f"MINDMOTOR_{name.upper()}", "2222")
    assert getattr(load(command, [*needed, "--config", str(config)]), name) == 2222
    assert getattr(load(command, [*needed, "--config", str(config), flag, "3333"]), name) == 3333


def test_up_reads_the_environment_between_its_flags_and_its_file(tmp_path, monkeypatch):
    from mindmotor.launcher.config import PlatformConfig

    config = tmp_path / "up.yaml"
    config.write_text("port: 1111\napi_keys: [from-the-file]\n")
    monkeypatch.setenv("MINDMOTOR_API_KEYS", "k1,k2")
    loaded = PlatformConfig.load(config)
    assert (loaded.port, loaded.api_keys) == (1111, ["k1", "k2"])
    assert PlatformConfig.load(config, port=3333).port == 3333


def test_a_nested_section_changes_only_the_keys_it_names(tmp_path, monkeypatch):
    config = tmp_path / "worker.yaml"
    config.write_text("engine:\n  max_num_seqs: 64\n  kv_host_budget_bytes: 2GiB\n"
                      "  max_num_batched_attention: auto\n")
    monkeypatch.setenv("MINDMOTOR_ENGINE__BLOCK_SIZE", "32")
    engine = load("worker", ["--config", str(config), "--device", "910B4"]).engine
    assert (engine.max_num_seqs, engine.kv_host_budget_bytes, engine.block_size, engine.device) == \
        (64, 2 * 2**30, 32, "910B4")
    assert engine.timing == "realtime" and engine.max_num_batched_attention is None   # the worker's own defaults
    deployer = load("deployer", ["--controller", "c:1", "--k8s-image", "img:2", "--analysis-window", "5"])
    assert (deployer.kubernetes.image, deployer.kubernetes.namespace) == ("img:2", "default")
    assert (deployer.analysis.window_s, deployer.analysis.min_requests) == (5.0, 20)


def test_lists_from_the_environment(monkeypatch):
    monkeypatch.setenv("MINDMOTOR_PD_SLO", "deployment=chat,ttft_ms=500,tpot_ms=40")     # one target, commas and all
    assert load("controller", []).pd.slo_for("m", "chat").ttft_s == 0.5
    monkeypatch.setenv("MINDMOTOR_PD_SLO", json.dumps(["deployment=chat,ttft_ms=500", "model=m,tpot_ms=20"]))
    pd = load("controller", []).pd
    assert (pd.slo_for("x", "chat").ttft_s, pd.slo_for("m", "other").tpot_s) == (0.5, 0.02)
    monkeypatch.setenv("MINDMOTOR_COORDINATORS", "http://a:1,http://b:2")
    assert load("deployer", ["--controller", "c:1"]).coordinators == ("http://a:1", "http://b:2")


def test_a_secrets_file_wins_over_its_value_and_a_secret_never_shows_in_an_error(tmp_path, monkeypatch):
    from mindmotor.controller.config import ControllerConfig

    token = tmp_path / "token"
    token.write_text("from-the-file\n")
    monkeypatch.setenv("MINDMOTOR_ADMIN_TOKEN", "from-the-environment")
    assert load("controller", []).admin_token == "from-the-environment"
    assert load("controller", ["--admin-token-file", str(token)]).admin_token == "from-the-file"
    with pytest.raises(ValueError) as bad:
        ControllerConfig.load(None, admin_token=987654321, port=70000)
    text = error_text(bad.value, ControllerConfig)
    assert "987654321" not in text and "admin_token: Input should be a valid string" in text
    assert "port: Input should be less than or equal to 65535 (got 70000)" in text


@pytest.mark.parametrize("content, message", [
    ("prot: 7\n", "prot: Extra inputs are not permitted"),
    ("- port: 7\n", "the top level must be a mapping of settings, not a list"),
    ("port: [7\n", "not valid YAML"),
], ids=["unknown key", "not a mapping", "not YAML"])
def test_a_bad_file_is_refused_naming_what_is_wrong(content, message, tmp_path):
    config = tmp_path / "controller.yaml"
    config.write_text(content)
    with pytest.raises(ValueError) as bad:
        load("controller", ["--config", str(config)])
    assert message in error_text(bad.value)
    with pytest.raises(FileNotFoundError, match="no such config file"):
        load("controller", ["--config", str(tmp_path / "missing.yaml")])


def test_help_shows_each_settings_default():
    """A bound flag's argparse default is None (an absent flag leaves the setting to the environment
    and the file); its help shows the setting's default instead."""
    parsers = {name: action for action in build_parser()._actions if action.choices for name, action in
               action.choices.items()}
    checked = 0
    for command in ("controller", "worker", "deployer", "trainer"):
        parser = parsers[command]
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            setting = getattr(action, "setting", None)
            if setting is None or "%(default)" not in (action.help or ""):
                continue
            assert action.default is None, action.option_strings
            shown = " ".join((action.help % {"default": setting.default()}).split())
            assert shown in text, (command, action.option_strings, shown)
            checked += 1
    assert checked > 40


def test_one_line_per_bad_setting_at_start_up(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mindmotor.cli", "worker", "--port", "70000", "--spec-helpers", "0",
                           "--timing", "virtual"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "MINDMOTOR_WORKER_READY" not in done.stdout
    (entry,) = [json.loads(line) for line in done.stderr.splitlines() if '"worker failed"' in line]
    assert entry["error"].splitlines() == ["port: Input should be less than or equal to 65535 (got 70000)",
                                           "spec_helpers: Input should be greater than or equal to 1 (got 0)"]


def test_up_keeps_its_own_settings_variables_from_its_services(monkeypatch):
    from mindmotor.launcher.up import own_settings_removed

    env = {"MINDMOTOR_MODELS": "[]", "MINDMOTOR_PORT": "9000", "MINDMOTOR_PORTS__CONTROLLER": "1",
           "MINDMOTOR_TLS_CA": "/ca.pem", "MINDMOTOR_HEARTBEAT_INTERVAL_S": "2", "PATH": "/bin"}
    assert own_settings_removed(env) == dict.fromkeys(["MINDMOTOR_MODELS", "MINDMOTOR_PORT",
                                                       "MINDMOTOR_PORTS__CONTROLLER"])


def test_a_deployment_spec_cannot_point_its_replicas_at_a_settings_file():
    from mindmotor.deployer.worker_settings import normalize_worker_settings

    with pytest.raises(ValueError, match="a replica's settings are the spec's"):
        normalize_worker_settings({"config": "/etc/worker.yaml"})


def test_building_the_command_line_imports_no_settings_class():
    """`mindmotor`'s parser (every service's flags) is built without pydantic: the settings classes
    are imported when a command runs or `--help` is shown."""
    heavy = ("pydantic", "pydantic_settings", "mindmotor.common.settings")
    probe = (f"import sys; from mindmotor.cli import build_parser; build_parser(); "
             f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr or done.stdout
