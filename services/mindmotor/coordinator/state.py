"""`Coordinator`: everything a request handler needs, built once by the app; `CoordinatorDep`
is the typed FastAPI dependency that hands it to a route."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from mindmotor.coordinator.catalog.adapters import AdapterDirectory
from mindmotor.coordinator.dispatch.admission import Admission
from mindmotor.coordinator.http.auth import APIKeys
from mindmotor.coordinator.dispatch.channels import WorkerChannels
from mindmotor.common.tracing import Tracing
from mindmotor.coordinator.config import CoordinatorSettings
from mindmotor.coordinator.routing.table import RoutingTable
from mindmotor.coordinator.metrics import CoordinatorMetrics
from mindmotor.coordinator.catalog.models import ModelCatalog
from mindmotor.coordinator.dispatch.progress import ProgressGuard
from mindmotor.coordinator.http.rate_limit import RateLimiter
from mindmotor.coordinator.dispatch.resume import new_key
from mindmotor.coordinator.openai.responses.store import MemoryStore, ResponseStore, StoreLimits
from mindmotor.coordinator.routing.router import Router
from mindmotor.sandbox.spec_check import SpecChecker


@dataclass
class InFlight:
    """This process's open API requests and, of them, streams (a replica's /health shows them:
    what its death would cut)."""
    requests: int = 0
    streams: int = 0


@dataclass
class Coordinator:
    settings: CoordinatorSettings
    table: RoutingTable
    router: Router
    channels: WorkerChannels
    catalog: ModelCatalog
    admission: Admission
    metrics: CoordinatorMetrics
    keys: APIKeys
    limiter: RateLimiter | None
    specs: SpecChecker                  # structured-output specs, checked by helper processes
    started: bool = False          # the first look at the instances is done
    in_flight: InFlight = field(default_factory=InFlight)
    guard: ProgressGuard | None = None   # gives up silent worker calls (progress.py)
    resume_key: bytes = field(default_factory=new_key)   # signs stream positions (resume.py)
    responses: ResponseStore = field(default_factory=lambda: MemoryStore(StoreLimits()))  # /v1/responses
    adapters: AdapterDirectory | None = None   # LoRA adapters the workers serve (catalog/adapters.py)
    tracing: Tracing = field(default_factory=lambda: Tracing("mindmotor-coordinator"))    # off unless an endpoint


async def get_coordinator(request: Request) -> Coordinator:
    """Async on purpose: FastAPI runs a plain-function dependency on its thread pool, a thread hop
    per request (12–19 % of the coordinator's CPU, measured: issue 26)."""
    return request.app.state.coordinator


CoordinatorDep = Annotated[Coordinator, Depends(get_coordinator)]


def request_id(request: Request) -> str:
    return request.scope.get("state", {}).get("request_id") or "unknown"
