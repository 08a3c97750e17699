"""`DeploymentRecord`: what the deployer stores per deployment — the desired spec (its traffic
included), the state of the last rollout, and whether it is being deleted. The record is the only
desired state there is: the reconcile loop reads it every pass, so a restarted deployer carries on
from it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from mindmotor.vocabulary import ACTIVE_ROLLOUT_PHASES, RolloutPhase

from .spec import DeploymentSpec



@dataclass
class RolloutState:
    version: str                      # the version being rolled out
    previous: str                     # the version it replaces
    canary: float                     # percent of the traffic for the new version once it is ready
    phase: str = RolloutPhase.STARTING
    reason: str = ""
    started_at: float = 0.0
    deadline: float = 0.0             # STARTING: not all ready by then -> FAILED (rolled back)
    updated_at: float = 0.0
    analysis: dict | None = None      # AnalysisSettings.to_dict() the canary is judged by (None: off)
    tokenizer_change: bool = False    # the new version was allowed another tokenizer / chat template
    canary_at: float = 0.0            # when the canary phase began (the analysis window starts there)
    adapter: str = ""                 # a LoRA adapter rollout: the adapter whose requests alone are split
    adapter_path: str = ""            # ... and the new version's directory of it
    adapter_before: dict | None = None   # the adapter's own split before the rollout (None: it had none)

    @property
    def active(self) -> bool:
        return self.phase in ACTIVE_ROLLOUT_PHASES


@dataclass
class DeploymentRecord:
    spec: DeploymentSpec
    generation: int = 1
    rollout: RolloutState | None = None
    deleting: bool = False
    updated_at: float = 0.0

    @property
    def name(self) -> str:
        return self.spec.name

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec.to_dict(), "generation": self.generation, "deleting": self.deleting,
                "updated_at": self.updated_at, "rollout": asdict(self.rollout) if self.rollout else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DeploymentRecord":
        rollout = data.get("rollout")
        return cls(spec=DeploymentSpec.model_validate(data["spec"]), generation=int(data.get("generation", 1)),
                   rollout=RolloutState(**rollout) if rollout else None, deleting=bool(data.get("deleting")),
                   updated_at=float(data.get("updated_at", 0.0)))

    def targets(self) -> dict[str, int]:
        """Replicas wanted per version (none at all while deleting)."""
        if self.deleting:
            return {}
        return {v.name: v.replicas for v in self.spec.versions}

    def desired_traffic(self) -> dict[str, float]:
        """The weights the controller should hold for this deployment ({} : none)."""
        return {} if self.deleting else dict(self.spec.traffic)

    def desired_adapter_traffic(self) -> dict[str, dict[str, float]]:
        """LoRA adapter -> the weights of its requests the controller should hold ({}: none)."""
        return {} if self.deleting else {name: dict(w) for name, w in self.spec.adapter_traffic.items()}
