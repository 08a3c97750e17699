"""`FakeKubeServer`: a stand-in for a Kubernetes API server over real HTTP, for the operator's
tests — no API server can run where the suite runs (no etcd, no kube-apiserver binary, no
container runtime), so kopf's real client and the backend's `KubeHTTPAPI` talk to this instead.

It serves, on 127.0.0.1 from a thread of its own (aiohttp):

- discovery (`/version`, `/api`, `/api/v1`, `/apis`, `/apis/GROUP/VERSION`) for namespaces,
  services, events, apps/v1 deployments, CRDs and the custom resources of the CRDs it is given;
- per resource: list (label selectors), watch (`?watch=true`: JSON lines from a resourceVersion,
  ended after `timeoutSeconds`), get, create (POST), delete, and PATCH as server-side apply
  (`application/apply-patch+yaml`: metadata's labels, annotations and ownerReferences and the
  spec replaced, status kept — what `InMemoryKubeAPI.apply` does), JSON merge patch and JSON
  patch, on the object or its `status` subresource; a CRD's `scale` subresource (`kubectl scale`:
  an autoscaling/v1 Scale read from and written to the CRD's replica paths, merge patch only);
- `metadata.resourceVersion` (one counter), `uid`, `creationTimestamp`, `generation` (bumped when
  the spec changes), finalizers (a delete sets `deletionTimestamp`; the object goes when the last
  finalizer does);
- admission: custom resources are validated against their CRD's openAPIV3Schema (jsonschema,
  draft 4 like OpenAPI v3.0; CEL rules are not evaluated), Deployments and Services by
  `fake_kube.check_object`; a refusal is a 422 Status, as an API server answers.

It is not an API server: no pods run (a test sets a Deployment's `status.readyReplicas` through
the status subresource, as the kubelet and the Deployment controller would), no garbage
collection of owned objects, no RBAC, no defaulting, no pruning of unknown fields.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import json
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import jsonpatch
import jsonschema
import yaml
from aiohttp import web

from fake_kube import check_object


@dataclass(frozen=True)
class Kind:
    group: str          # "" for the core API
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    schema: dict | None = None       # a CRD's openAPIV3Schema
    status_subresource: bool = False
    scale: dict | None = None        # a CRD's scale subresource: specReplicasPath, statusReplicasPath, ...

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


BUILTIN = [Kind("", "v1", "namespaces", "Namespace", namespaced=False),
           Kind("", "v1", "services", "Service"),
           Kind("", "v1", "events", "Event"),
           Kind("apps", "v1", "deployments", "Deployment", status_subresource=True),
           Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                namespaced=False)]
CHECKED = {"Deployment", "Service"}          # fake_kube.check_object's kinds


def kinds_of_crd(crd: dict) -> list[Kind]:
    spec = crd["spec"]
    return [Kind(spec["group"], v["name"], spec["names"]["plural"], spec["names"]["kind"],
                 namespaced=spec["scope"] == "Namespaced", schema=v["schema"]["openAPIV3Schema"],
                 status_subresource="status" in (v.get("subresources") or {}),
                 scale=(v.get("subresources") or {}).get("scale"))
            for v in spec["versions"] if v.get("served", True)]


class Refused(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def status_body(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message}


def matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def now_text() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKubeServer:
    def __init__(self, crds: list[dict] = ()):
        self.kinds = [*BUILTIN, *(k for crd in crds for k in kinds_of_crd(crd))]
        self.objects: dict[tuple[str, str, str], dict] = {}       # (plural, namespace, name) -> object
        self.history: list[tuple[int, str, str, dict]] = []       # (rv, plural, type, object)
        self.requests: list[tuple[str, str, bool, str]] = []      # (method, path, watch, user agent)
        self._rv = itertools.count(1)
        self._changed: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._watches: set[asyncio.Task] = set()
        self.port = 0
        for crd in crds:
            self._store("customresourcedefinitions", "", copy.deepcopy(crd), "ADDED")

    # ---- life -------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FakeKubeServer":
        started = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run():
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._start())
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="fake-kube-api", daemon=True)
        self._thread.start()
        assert started.wait(10), "the fake API server did not start"
        return self

    async def _start(self) -> None:
        self._changed = asyncio.Condition()
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        """End every watch stream, close the server, stop its thread."""
        if self._loop is None:
            return

        async def close():
            for task in list(self._watches):
                task.cancel()
            await asyncio.gather(*self._watches, return_exceptions=True)
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = None

    def snapshot(self, plural: str) -> dict[str, dict]:
        """name -> a copy of every object of `plural` (any namespace), read on the server's loop."""
        async def read():
            return {name: copy.deepcopy(o) for (p, _, name), o in self.objects.items() if p == plural}
        return asyncio.run_coroutine_threadsafe(read(), self._loop).result(10)

    # ---- storage ----------------------------------------------------------------------------
    def _store(self, plural: str, namespace: str, obj: dict, event: str) -> dict:
        rv = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(rv)
        key = (plural, namespace, obj["metadata"]["name"])
        if event == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj
        self.history.append((rv, plural, event, copy.deepcopy(obj)))
        if self._changed is not None:
            asyncio.get_running_loop().create_task(self._notify())
        return obj

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # ---- HTTP -------------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path, request.query.get("watch") in ("true", "1"),
                              request.headers.get("User-Agent", "")))
        try:
            return await self._route(request)
        except Refused as exc:
            return web.json_response(status_body(exc.code, exc.reason, exc.message), status=exc.code)

    async def _route(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if parts == ["version"]:
            return web.json_response({"major": "1", "minor": "31", "gitVersion": "v1.31.0-fake"})
        if parts == ["api"]:
            return web.json_response({"kind": "APIVersions", "versions": ["v1"]})
        if parts == ["apis"]:
            return web.json_response(self._groups())
        if parts[:1] == ["api"] and len(parts) == 2 or parts[:1] == ["apis"] and len(parts) == 3:
            return web.json_response(self._resources(*(["", parts[1]] if parts[0] == "api" else parts[1:3])))
        group, version, rest = ("", parts[1], parts[2:]) if parts[0] == "api" else (parts[1], parts[2], parts[3:])
        namespace = ""
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        kind = self._kind(group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        if name is None:
            if request.method == "GET" and request.query.get("watch") in ("true", "1"):
                return await self._watch(request, kind, namespace)
            if request.method == "GET":
                return web.json_response(self._list(kind, namespace, request.query.get("labelSelector", "")))
            if request.method == "POST":
                return web.json_response(self._create(kind, namespace, await request.json()), status=201)
        elif subresource == "scale" and kind.scale:
            if request.method == "PATCH":
                self._scale_patch(kind, namespace, name, request.content_type, await request.text())
            return web.json_response(self._scale(kind, self._get(kind, namespace, name)))
        elif request.method == "GET":
            return web.json_response(self._get(kind, namespace, name))
        elif request.method == "PATCH":
            body = await request.text()
            return web.json_response(self._patch(kind, namespace, name, subresource,
                                                 request.content_type, body))
        elif request.method == "DELETE":
            return web.json_response(self._delete(kind, namespace, name))
        raise Refused(405, "MethodNotAllowed", f"{request.method} {request.path}")

    def _groups(self) -> dict:
        groups: dict[str, list[str]] = {}
        for k in self.kinds:
            if k.group:
                groups.setdefault(k.group, [])
                if k.version not in groups[k.group]:
                    groups[k.group].append(k.version)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
             "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}} for g, vs in groups.items()]}

    def _resources(self, group: str, version: str) -> dict:
        kinds = [k for k in self.kinds if (k.group, k.version) == (group, version)]
        if not kinds:
            raise Refused(404, "NotFound", f"no API {group}/{version}")
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        resources = []
        for k in kinds:
            resources.append({"name": k.plural, "singularName": k.kind.lower(), "namespaced": k.namespaced,
                              "kind": k.kind, "verbs": verbs})
            if k.status_subresource:
                resources.append({"name": f"{k.plural}/status", "singularName": "", "namespaced": k.namespaced,
                                  "kind": k.kind, "verbs": ["get", "patch", "update"]})
            if k.scale:
                resources.append({"name": f"{k.plural}/scale", "singularName": "", "namespaced": k.namespaced,
                                  "group": "autoscaling", "version": "v1", "kind": "Scale",
                                  "verbs": ["get", "patch", "update"]})
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": kinds[0].api_version,
                "resources": resources}

    def _kind(self, group: str, version: str, plural: str) -> Kind:
        for k in self.kinds:
            if (k.group, k.version, k.plural) == (group, version, plural):
                return k
        raise Refused(404, "NotFound", f"the server could not find the requested resource ({group}/{version} {plural})")

    # ---- verbs ------------------------------------------------------------------------------
    def _list(self, kind: Kind, namespace: str, selector: str) -> dict:
        items = [copy.deepcopy(o) for (p, ns, _), o in sorted(self.objects.items())
                 if p == kind.plural and (not namespace or ns == namespace)
                 and matches(o["metadata"].get("labels") or {}, selector)]
        rv = str(self.history[-1][0]) if self.history else "0"
        return {"kind": f"{kind.kind}List", "apiVersion": kind.api_version, "metadata": {"resourceVersion": rv},
                "items": items}

    def _get(self, kind: Kind, namespace: str, name: str) -> dict:
        obj = self.objects.get((kind.plural, namespace, name))
        if obj is None:
            raise Refused(404, "NotFound", f'{kind.plural} "{name}" not found')
        return copy.deepcopy(obj)

    def _admit(self, kind: Kind, obj: dict) -> None:
        try:
            if kind.schema is not None:
                jsonschema.Draft4Validator(kind.schema).validate(obj)
            if kind.kind in CHECKED:
                check_object(obj)
        except (jsonschema.ValidationError, AssertionError, KeyError) as exc:
            where = "/".join(str(p) for p in getattr(exc, "absolute_path", ()))
            message = getattr(exc, "message", None) or str(exc)
            raise Refused(422, "Invalid", f"{kind.kind} {obj.get('metadata', {}).get('name')!r} is invalid: "
                                          f"{where}: {message}") from None

    def _create(self, kind: Kind, namespace: str, obj: dict) -> dict:
        metadata = obj.setdefault("metadata", {})
        if "name" not in metadata and "generateName" in metadata:
            metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
        metadata["namespace"] = namespace or metadata.get("namespace", "")
        if not kind.namespaced:
            metadata.pop("namespace", None)
        if (kind.plural, namespace, metadata["name"]) in self.objects:
            raise Refused(409, "AlreadyExists", f'{kind.plural} "{metadata["name"]}" already exists')
        obj.setdefault("apiVersion", kind.api_version)
        obj.setdefault("kind", kind.kind)
        self._admit(kind, obj)
        metadata.update(uid=str(uuid.uuid4()), creationTimestamp=now_text(), generation=1)
        if kind.status_subresource:
            obj.pop("status", None)
        return copy.deepcopy(self._store(kind.plural, namespace, obj, "ADDED"))

    def _patch(self, kind: Kind, namespace: str, name: str, subresource: str | None, content_type: str,
               body: str) -> dict:
        current = self.objects.get((kind.plural, namespace, name))
        if content_type == "application/apply-patch+yaml":
            manifest = yaml.safe_load(body)
            if current is None:
                return self._create(kind, namespace, manifest)
            new = copy.deepcopy(current)
            for key in ("labels", "annotations", "ownerReferences"):
                if key in manifest["metadata"]:
                    new["metadata"][key] = manifest["metadata"][key]
            new["spec"] = manifest.get("spec", {})
        else:
            if current is None:
                raise Refused(404, "NotFound", f'{kind.plural} "{name}" not found')
            document = json.loads(body)
            if content_type == "application/merge-patch+json":
                new = merge_patch(current, document)
            elif content_type == "application/json-patch+json":
                try:
                    new = jsonpatch.apply_patch(current, document)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                    raise Refused(422, "Invalid", f"json patch: {exc}") from None
            else:
                raise Refused(415, "UnsupportedMediaType", f"unsupported patch type {content_type}")
        if kind.status_subresource:                          # each endpoint changes its own part
            if subresource == "status":
                new = {**copy.deepcopy(current), "status": new.get("status", {})}
            else:
                new["status"] = copy.deepcopy(current.get("status", {}))
                if "status" not in current:
                    new.pop("status")
        for key in ("uid", "creationTimestamp", "generation", "deletionTimestamp"):
            if key in current["metadata"]:
                new["metadata"][key] = current["metadata"][key]
            else:
                new["metadata"].pop(key, None)
        if new.get("spec") != current.get("spec"):
            new["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        self._admit(kind, new)
        if new == current:
            return copy.deepcopy(current)                    # no change: no new resourceVersion, no event
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self._store(kind.plural, namespace, new, "DELETED")
            return copy.deepcopy(new)
        return copy.deepcopy(self._store(kind.plural, namespace, new, "MODIFIED"))

    # ---- the scale subresource (kubectl scale): an autoscaling/v1 Scale over the CRD's paths ----
    def _scale(self, kind: Kind, obj: dict) -> dict:
        def at(path: str):
            node = obj
            for key in path.strip(".").split("."):
                node = (node or {}).get(key) if isinstance(node, dict) else None
            return node

        return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {k: obj["metadata"][k] for k in ("name", "namespace", "resourceVersion", "uid")},
                "spec": {"replicas": at(kind.scale["specReplicasPath"]) or 0},
                "status": {"replicas": at(kind.scale["statusReplicasPath"]) or 0,
                           "selector": at(kind.scale.get("labelSelectorPath", "")) or ""}}

    def _scale_patch(self, kind: Kind, namespace: str, name: str, content_type: str, body: str) -> None:
        if content_type != "application/merge-patch+json":
            raise Refused(415, "UnsupportedMediaType", f"scale: unsupported patch type {content_type}")
        replicas = (json.loads(body).get("spec") or {}).get("replicas")
        if not isinstance(replicas, int):
            raise Refused(422, "Invalid", "scale: spec.replicas must be an integer")
        *parents, leaf = kind.scale["specReplicasPath"].strip(".").split(".")
        patch: dict = {leaf: replicas}
        for key in reversed(parents):
            patch = {key: patch}
        self._patch(kind, namespace, name, None, "application/merge-patch+json", json.dumps(patch))

    def _delete(self, kind: Kind, namespace: str, name: str) -> dict:
        current = self.objects.get((kind.plural, namespace, name))
        if current is None:
            raise Refused(404, "NotFound", f'{kind.plural} "{name}" not found')
        if current["metadata"].get("finalizers"):
            if not current["metadata"].get("deletionTimestamp"):
                new = copy.deepcopy(current)
                new["metadata"]["deletionTimestamp"] = now_text()
                return copy.deepcopy(self._store(kind.plural, namespace, new, "MODIFIED"))
            return copy.deepcopy(current)
        self._store(kind.plural, namespace, copy.deepcopy(current), "DELETED")
        return status_body(200, "", "deleted") | {"status": "Success"}

    async def _watch(self, request: web.Request, kind: Kind, namespace: str) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or 0)
        selector = request.query.get("labelSelector", "")
        timeout_s = float(request.query.get("timeoutSeconds") or 300)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        deadline = asyncio.get_running_loop().time() + timeout_s
        task = asyncio.current_task()
        self._watches.add(task)
        try:
            while True:
                latest = self.history[-1][0] if self.history else 0
                events = [(rv, event, obj) for rv, plural, event, obj in self.history
                          if since < rv <= latest and plural == kind.plural
                          and (not namespace or obj["metadata"].get("namespace") == namespace)
                          and matches(obj["metadata"].get("labels") or {}, selector)]
                for _, event, obj in events:
                    await response.write(json.dumps({"type": event, "object": obj}).encode() + b"\n")
                since = max(since, latest)
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                async with self._changed:
                    if (self.history[-1][0] if self.history else 0) != latest:
                        continue                          # stored while this stream was writing
                    try:
                        await asyncio.wait_for(self._changed.wait(), timeout=left)
                    except asyncio.TimeoutError:
                        pass
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._watches.discard(task)
        return response


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result
