"""The coordinator process loads neither the engine nor the native libraries a request could
crash (llguidance) nor numpy: what it validates comes from the neutral `mindmotor.rules`, what
may crash runs in its helper processes (issue 25)."""

from __future__ import annotations

import json
import subprocess
import sys

FORBIDDEN = ("mindmotor.engine", "mindmotor.model", "mindmotor.device", "llguidance", "numpy", "torch")


def test_the_coordinator_app_loads_no_engine_llguidance_or_numpy():
    code = ("import json, sys; import mindmotor.coordinator.app, mindmotor.coordinator.http.server; "
            "print(json.dumps(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = json.loads(done.stdout)
    assert [m for m in loaded if m.split(".")[0] in FORBIDDEN or m.startswith(FORBIDDEN)] == []
    assert "mindmotor.rules.sampling_params" in loaded          # the rules it checks requests with
