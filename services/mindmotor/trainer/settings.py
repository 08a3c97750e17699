"""`TrainerSettings`: where the trainer service listens, where its checkpoint store is, and its
admin token — from flags, `MINDMOTOR_*` environment variables and a YAML file (common/settings.py).

    port: 50070
    store: /data/checkpoints
    admin_token_file: /run/secrets/admin-token

A training run's own settings (model shape, data, optimisation: `TrainConfig`, config.py) are not
these: they are a job's, sent with StartJob or given to `mindmotor train`, checked key by key and
hashed into the checkpoints they make.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import Field, model_validator

from mindmotor.common.exposure import DEFAULT_HOST, require_admin_token
from mindmotor.common.settings import ServiceSettings

Port = Field(ge=0, le=65535)


class TrainerSettings(ServiceSettings):
    secrets: ClassVar = {"admin_token": "admin token"}

    host: str = DEFAULT_HOST                   # beyond loopback it needs an admin token, TLS or a cluster token
    port: Annotated[int, Port] = 50070         # gRPC
    store: Path = Path("checkpoints")          # the checkpoint store directory
    metrics_port: Annotated[int, Port] | None = None   # Prometheus /metrics; none: not served
    admin_token: str | None = None             # $MINDMOTOR_ADMIN_TOKEN or the file; none: the Trainer API is open
    admin_token_file: str | None = None
    allow_open_admin: bool = False             # open beyond loopback on purpose

    @model_validator(mode="after")
    def _check(self) -> "TrainerSettings":
        require_admin_token("the Trainer", self.host, self.admin_token, self.allow_open_admin)
        return self
