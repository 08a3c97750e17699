"""How `mindmotor deploy` prints deployments: a short block per deployment, or JSON.

    demo  model=mindmotor-demo  generation=4
      VERSION  DESIRED  RUNNING  READY  TRAFFIC  RESTARTS  CHECKPOINT
      v1             2        2      2      90%         0  /ckpt/step-400
      v2             2        2      2      10%         0  /ckpt/step-800
      rollout v2 (replacing v1): canary — v2 is ready and takes 10% of the traffic
      analysis: error margin 5 points, p90 TTFT margin 50%, window 60 s, min 20 requests — passing (...)
"""

from __future__ import annotations

import json

from google.protobuf.json_format import MessageToDict

from mindmotor.protocol import deployer_pb2 as pb

HEADER = ("VERSION", "DESIRED", "RUNNING", "READY", "TRAFFIC", "RESTARTS", "CHECKPOINT")


def print_deployments(deployments: list[pb.Deployment], as_json: bool = False) -> None:
    if as_json:
        data = [MessageToDict(d, preserving_proto_field_name=True) for d in deployments]
        print(json.dumps(data if len(data) != 1 else data[0], indent=2, sort_keys=True))
        return
    if not deployments:
        print("no deployments")
    for deployment in deployments:
        print(describe(deployment))


def describe(deployment: pb.Deployment) -> str:
    spec = deployment.spec
    title = f"{spec.name}  model={spec.model}  generation={deployment.generation}"
    lines = [title + ("  (deleting)" if deployment.deleting else "")]
    checkpoints = {v.name: v.checkpoint or "(bundled)" for v in spec.versions}
    total = sum(v.weight for v in deployment.versions) or 1.0
    rows = [HEADER] + [(v.version, v.desired, v.running, v.ready, f"{100 * v.weight / total:.4g}%", v.restarts,
                        checkpoints.get(v.version, "(removed, draining)")) for v in deployment.versions]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(HEADER))]
    for row in rows:
        cells = [str(c).ljust(w) if i in (0, 6) else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  " + "  ".join(cells).rstrip())
    for adapter, split in sorted(spec.adapter_traffic.items()):
        total_a = sum(split.weights.values()) or 1.0
        shares = ", ".join(f"{v} {100 * w / total_a:.4g}%" for v, w in sorted(split.weights.items()))
        lines.append(f"  adapter {adapter}: {shares}")
    for status in deployment.versions:
        if status.last_failure:
            lines.append(f"  {status.version} last failure: {status.last_failure}")
    if deployment.HasField("rollout"):
        r = deployment.rollout
        what = f" of the adapter {r.adapter} ({r.adapter_path})" if r.adapter else ""
        lines.append(f"  rollout {r.version}{what} (replacing {r.previous}): {r.phase} — {r.reason}")
        if r.tokenizer_change:
            lines.append(f"  {r.version} serves another tokenizer than {r.previous} (allowed)")
        if r.analysis.enabled:
            a = r.analysis
            lines.append(f"  analysis: error margin {100 * a.max_error_rate_increase:g} points, p90 TTFT margin "
                         f"{100 * a.max_ttft_p90_increase:g}%, window {a.window_s:g} s, min {a.min_requests} requests"
                         + (f" — {r.figures}" if r.figures else ""))
    return "\n".join(lines)
