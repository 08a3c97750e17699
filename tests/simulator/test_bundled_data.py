"""The data `mindmotor simulate` and the benchmarks read ships inside the package (issue 24): a clone
with nothing beside it replays the trace by default, and the calibration data is there to fit on."""

from __future__ import annotations

import json
import subprocess
import sys

from mindmotor.common.bundled_data import AZURE_TRACE, DATA_DIR, VIDUR_DIR
from mindmotor.simulator.trace import DEFAULT_TRACE, load_trace


def test_the_default_trace_is_the_packaged_azure_trace():
    assert DEFAULT_TRACE == AZURE_TRACE and AZURE_TRACE.is_relative_to(DATA_DIR)
    requests = load_trace()
    assert len(requests) == 19_366                    # the whole hour, as its README says
    assert requests[0].arrival_s == 0.0 and max(r.prompt_tokens for r in requests) == 14_050


def test_the_calibration_data_and_its_licenses_ship_too():
    assert {p.name for p in VIDUR_DIR.iterdir()} >= {"a100_llama2-7b_mlp.csv.gz", "h100_llama2-7b_mlp.csv.gz",
                                                    "calibration.json", "README.md"}
    json.loads((VIDUR_DIR / "calibration.json").read_text())
    readme = (DATA_DIR / "README.md").read_text()
    assert "CC-BY" in readme and "MIT" in readme


def test_simulate_runs_with_no_trace_given(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mindmotor.cli", "simulate", "--duration", "20", "--json"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["requests"] > 0
