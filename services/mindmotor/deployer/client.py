"""`DeployerClient`: the Deployer's gRPC API for the `mindmotor deploy` command and for tests —
blocking calls, the admin token in every call's metadata; refusals raise `grpc.RpcError` with the
deployer's status code and message.

    with DeployerClient("127.0.0.1:50070", admin_token="T") as deployer:
        deployer.apply(load_spec("examples/deployments/demo.yaml"))
        deployer.rollout("demo", "v2", checkpoint="/ckpt/step-800", canary=10)
        deployment = deployer.wait_rollout("demo", timeout_s=300)     # until it leaves "starting"
"""

from __future__ import annotations

import time

from mindmotor.common import rpc
from mindmotor.common.admin_token import bearer_metadata
from mindmotor.vocabulary import RolloutPhase
from mindmotor.protocol import deployer_pb2 as pb
from mindmotor.protocol import deployer_pb2_grpc

from .convert import spec_to_proto
from .spec import DeploymentSpec

POLL_S = 0.2


class DeployerClient:
    def __init__(self, address: str, admin_token: str | None = None, timeout_s: float = 60.0,
                 sec: rpc.RpcSecurity | None = None):
        self.address = address
        self.timeout_s = timeout_s
        self.metadata = bearer_metadata(admin_token)
        self.channel = rpc.channel(address, sec=sec)      # sec: the cluster credentials (default: the process's)
        self.stub = deployer_pb2_grpc.DeployerStub(self.channel)

    def __enter__(self) -> "DeployerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def _call(self, method, request):
        return method(request, timeout=self.timeout_s, metadata=self.metadata)

    def apply(self, spec: DeploymentSpec, allow_tokenizer_change: bool = False) -> pb.Deployment:
        return self._call(self.stub.Apply, pb.ApplyRequest(spec=spec_to_proto(spec),
                                                           allow_tokenizer_change=allow_tokenizer_change))

    def get(self, name: str) -> pb.Deployment:
        return self._call(self.stub.Get, pb.GetDeploymentRequest(name=name))

    def list(self) -> list[pb.Deployment]:
        return list(self._call(self.stub.List, pb.ListDeploymentsRequest()).deployments)

    def delete(self, name: str) -> pb.Deployment:
        return self._call(self.stub.Delete, pb.DeleteDeploymentRequest(name=name))

    def set_traffic(self, name: str, weights: dict[str, float], adapter: str = "") -> pb.Deployment:
        return self._call(self.stub.SetTraffic, pb.SetDeploymentTrafficRequest(name=name, weights=weights,
                                                                               adapter=adapter))

    def rollout(self, name: str, version: str, checkpoint: str = "", canary: float = 10.0, replicas: int = 0,
                previous: str = "", ready_timeout_s: float = 0.0, allow_tokenizer_change: bool = False,
                analysis: dict | None = None, disable_analysis: bool = False, adapter: str = "",
                adapter_path: str = "") -> pb.Deployment:
        """`analysis`: RolloutAnalysis fields (max_error_rate_increase, max_ttft_p90_increase,
        window_s, min_requests); those left out or 0 take the deployer's defaults. `adapter`,
        `adapter_path`: a new version of that LoRA adapter (its requests alone are split)."""
        return self._call(self.stub.Rollout, pb.RolloutRequest(
            name=name, version=version, checkpoint=checkpoint, canary=canary, replicas=replicas, previous=previous,
            ready_timeout_s=ready_timeout_s, allow_tokenizer_change=allow_tokenizer_change,
            analysis=pb.RolloutAnalysis(**(analysis or {})), disable_analysis=disable_analysis, adapter=adapter,
            adapter_path=adapter_path))

    def promote(self, name: str) -> pb.Deployment:
        return self._call(self.stub.Promote, pb.PromoteRequest(name=name))

    def rollback(self, name: str, reason: str = "") -> pb.Deployment:
        return self._call(self.stub.Rollback, pb.RollbackRequest(name=name, reason=reason))

    def wait_rollout(self, name: str, timeout_s: float) -> pb.Deployment:
        """The deployment once its rollout has left "starting" (canary, or failed and rolled back);
        TimeoutError if it has not within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            deployment = self.get(name)
            if deployment.rollout.phase != RolloutPhase.STARTING:
                return deployment
            if time.monotonic() > deadline:
                raise TimeoutError(f"the rollout of {deployment.rollout.version} is still starting "
                                   f"after {timeout_s:g} s: {deployment.rollout.reason}")
            time.sleep(POLL_S)

    def wait_gone(self, name: str, timeout_s: float) -> None:
        """Until the deployment is deleted (its replicas gone); TimeoutError otherwise."""
        deadline = time.monotonic() + timeout_s
        while any(d.spec.name == name for d in self.list()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"deployment {name} is still being deleted after {timeout_s:g} s")
            time.sleep(POLL_S)
