import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from mindmotor import npu_smi_cli as cli
from mindmotor.device.emulated_device import EmulatedDevice
from mindmotor.device.npu_smi import format_npu_smi

MiB = 2**20


def _parse(argv):
    parser = argparse.ArgumentParser(prog="mindmotor")
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_table_shows_devices_and_hbm():
    devices = [EmulatedDevice("910B3", profile="qwen2-7b"),
               EmulatedDevice("910B4", profile="qwen2-7b", device_id=1)]
    text = format_npu_smi([d.snapshot() for d in devices])
    assert "npu-smi" in text and "Version" in text
    for device in devices:
        assert device.spec.name in text
        assert f"{device.allocator.used // MiB} / {device.spec.hbm_bytes // MiB}" in text
    for header in ("NPU", "Name", "Health", "Power(W)", "Temp(C)", "AICore(%)", "HBM-Usage(MB)"):
        assert header in text
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1           # a rectangular box
    assert lines[0].startswith("+-") and any(line.startswith("+=") for line in lines)


def test_cli_status_json(tmp_path, capsys):
    snap = {"device": "910B3", "hbm_used_bytes": 1024 * MiB, "hbm_total_bytes": 65536 * MiB,
            "power_w": 120.0, "temperature_c": 50.0, "utilization": 33.0, "health": "OK"}
    path = tmp_path / "status.json"
    path.write_text(json.dumps({"devices": [snap]}))
    args = _parse(["npu-smi", "--status-json", str(path)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "910B3" in out and "1024 / 65536" in out


def test_cli_without_a_source_is_a_usage_error(capsys):
    args = _parse(["npu-smi"])
    assert args.func(args) == 2
    args = _parse(["npu-smi", "--worker", "127.0.0.1:1"])   # nothing listens there
    assert args.func(args) == 1
    assert "cannot read the status" in capsys.readouterr().err


def _metrics_text() -> bytes:
    registry = CollectorRegistry()
    values = {
        "mindmotor_npu_utilization_percent": (75.0, 10.0),
        "mindmotor_npu_hbm_used_bytes": (2048 * MiB, 4096 * MiB),
        "mindmotor_npu_hbm_total_bytes": (65536 * MiB, 32768 * MiB),
        "mindmotor_npu_power_watts": (300.0, 100.0),
        "mindmotor_npu_temperature_celsius": (70.0, 45.0),
    }
    for name, (first, second) in values.items():
        gauge = Gauge(name, name, ["device"], registry=registry)
        gauge.labels(device="npu0-910B3").set(first)
        gauge.labels(device="npu1-910B4").set(second)
    return generate_latest(registry)


def test_snapshots_from_metrics():
    snaps = cli.snapshots_from_metrics(_metrics_text().decode())
    assert [s["device"] for s in snaps] == ["npu0-910B3", "npu1-910B4"]
    assert snaps[0]["utilization"] == 75.0 and snaps[1]["hbm_used_bytes"] == 4096 * MiB


@pytest.fixture
def metrics_server():
    body = _metrics_text()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def test_cli_metrics_url(metrics_server, capsys):
    args = _parse(["npu-smi", "--metrics-url", metrics_server])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "npu0-910B3" in out and "2048 / 65536" in out and "4096 / 32768" in out
