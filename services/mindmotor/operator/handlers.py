"""The operator's kopf handlers, registered on a registry of their own (so a test or a second
operator in one process does not share kopf's global one):

- create / update of `.spec` / resume (an object found at start): a `ServiceReconciler` pass at
  once, its status written with the handler's patch;
- a timer every `resync_s` per object: the same pass (readiness and the routing table change
  without any event on the InferenceService: level-triggered, like the Deployer's loop);
- startup / cleanup: the traffic link to the controller starts and stops;
- delete: the finalizer's handler (`serving.mindmotor.io/operator`): every version and the traffic
  entry are removed before Kubernetes lets the object go.

kopf keeps its own bookkeeping in annotations under `serving.mindmotor.io/`, and posts Kubernetes
Events for warnings and errors only.
"""

from __future__ import annotations

import logging

import kopf

from .connection import Connection
from .reconcile import ServiceReconciler
from .resource import GROUP, PLURAL, VERSION
from .status import status_patch

FINALIZER = f"{GROUP}/operator"


def settings() -> kopf.OperatorSettings:
    config = kopf.OperatorSettings()
    config.persistence.finalizer = FINALIZER
    config.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    config.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP,
                                                                           key="last-handled-configuration")
    config.posting.level = logging.WARNING
    config.execution.default_backoff = 5          # a handler that raised runs again after 5 s (kopf: 60)
    config.scanning.disabled = True               # no watch on CRDs and namespaces: only the ones given
    config.watching.server_timeout = 300          # the API server ends a watch after this; kopf opens the next
    config.watching.client_timeout = 330          # ... and this side gives up a watch that outlives it
    config.networking.connect_timeout = 10        # every call to the API server is bounded
    config.networking.request_timeout = 30
    return config


def registry(reconciler: ServiceReconciler, connection: Connection, resync_s: float) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_):
        return connection.kopf_login()

    # the controller link's tasks live inside kopf's run: kopf waits for strangers' tasks at exit
    @kopf.on.startup(registry=registry)
    async def start_traffic(**_):
        await reconciler.traffic.start()

    @kopf.on.cleanup(registry=registry)
    async def stop_traffic(**_):
        await reconciler.traffic.stop()

    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, field="spec", registry=registry)
    async def apply(name, namespace, uid, meta, spec, status, patch, **_):
        await _pass(reconciler, name, namespace, uid, meta, spec, status, patch)

    @kopf.timer(GROUP, VERSION, PLURAL, interval=resync_s, registry=registry)
    async def resync(name, namespace, uid, meta, spec, status, patch, **_):
        if not meta.get("deletionTimestamp"):
            await _pass(reconciler, name, namespace, uid, meta, spec, status, patch)

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    async def delete(name, namespace, uid, **_):
        await reconciler.delete(namespace, name, uid)

    return registry


async def _pass(reconciler, name, namespace, uid, meta, spec, status, patch) -> None:
    old = dict(status or {})
    new = await reconciler.reconcile(namespace, name, uid, int(meta.get("generation") or 0), dict(spec or {}), old)
    for key, value in status_patch(old, new).items():
        if old.get(key) != new.get(key):                 # an unchanged status is not written again
            patch.status[key] = value
