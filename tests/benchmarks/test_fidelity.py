"""benchmarks/fidelity.py against the Vidur data: the table's contract (last line one JSON object),
the shipped NVIDIA kernel parameters being what the fit derives, and the calibration points met."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import fidelity  # noqa: E402
from mindmotor.device.specs import get_device_spec  # noqa: E402


def test_table_ends_with_one_json_object(capsys):
    assert fidelity.main([]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    cases = summary["cases"]
    # header, one line per case, one smooth-form bound per device, JSON
    assert len(lines) - 2 - len(fidelity.DEVICES) == len(cases) >= 30
    worst = max(cases, key=lambda k: abs(cases[k]))
    assert summary["worst_case"] == worst and summary["max_abs_error"] == abs(cases[worst])
    assert summary["max_abs_error"] < 0.10, worst      # the target: every case within 10%
    # The calibration points are met within 10% with the shipped defaults.
    for case in fidelity.cases():
        if case.kind == "fit":
            assert abs(cases[f"{case.device} {case.name}"]) < 0.10, case.name


def test_a100_decode_b128_full_step_by_hand():
    """The composed A100 step at b128 x kv512: GEMMs + vLLM's five elementwise kernels + decode
    attention (10.5 us per layer + KV bytes at 0.89 of 2.039 TB/s)."""
    case = next(c for c in fidelity.cases() if c.name == "decode b128 kv512")
    kv = 32 * (10.5e-6 + 128 * 512 * 2 * 32 * 128 * 2 / (0.89 * 2.039e12))
    assert kv == pytest.approx(19.3e-3, rel=0.01)
    assert case.predicted_s() == pytest.approx(case.measured_s, rel=0.10)


def test_fit_reproduces_the_shipped_parameters():
    fitted = fidelity.fit_attention()
    a100 = get_device_spec("A100-80G").kernels
    assert fitted["attention_fixed_s"] == pytest.approx(a100.attention_fixed_s, rel=0.01)
    assert fitted["attention_decode_eta_memory"] == pytest.approx(a100.attention_decode_eta_memory, abs=0.005)
    assert fitted["attention_prefill_eta_compute"] == pytest.approx(a100.attention_prefill_eta_compute, abs=0.001)
    for device in fidelity.DEVICES:
        shipped = asdict(get_device_spec(device).kernels)
        for name, value in fidelity.fit_gemm_and_elementwise(device).items():
            if name == "gemm_extra_tiles":              # the other kernels: (tile rows, eta_c) each
                assert [tile for tile, _ in shipped[name]] == [tile for tile, _ in value], device
                assert [eta for _, eta in shipped[name]] == pytest.approx([eta for _, eta in value], abs=0.005)
                continue
            assert shipped[name] == pytest.approx(value, rel=0.01), (device, name)
