"""`Deployments`: what each Deployer call means — check it against the stored state, write the new
desired state (before anything acts on it), and poke the reconcile loop, which does the acting.

Errors say what to do instead: `InvalidArgument` (a bad request: fix it), `NotFound`,
`FailedPrecondition` (the state does not allow it now). A checkpoint is verified (in a thread: it
hashes every file) before anything is written, so a bad one changes nothing.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Callable

from pydantic import ValidationError

from mindmotor.vocabulary import RolloutPhase
from mindmotor.model.config import CheckpointError

from . import rollout
from .analysis import AnalysisSettings
from .records import DeploymentRecord
from .spec import (DeploymentSpec, VersionSpec, check_adapter_name, check_traffic, describe_errors,
                   tokenizer_difference, tokenizer_files, verify_checkpoint)
from .store import DeploymentStore

TOKENIZER_ADVICE = ("; the coordinators would tokenize its requests for the other version. Train it from the "
                    "serving checkpoint (`mindmotor train --init-from DIR` or `--tokenizer-from DIR`), or allow "
                    "the change (--allow-tokenizer-change): each request is then tokenized with the tokenizer of "
                    "the version that serves it")


class DeployerError(Exception):
    """A refused call; the message is for the operator."""


class InvalidArgument(DeployerError):
    pass


class NotFound(DeployerError):
    pass


class FailedPrecondition(DeployerError):
    pass


class Deployments:
    def __init__(self, store: DeploymentStore, on_change: Callable[[], None] = lambda: None,
                 rollout_timeout_s: float = 120.0, clock: Callable[[], float] = time.time,
                 analysis: AnalysisSettings = AnalysisSettings(enabled=False)):
        self.store = store
        self.on_change = on_change
        self.rollout_timeout_s = rollout_timeout_s
        self.clock = clock
        self.analysis = analysis           # the defaults; enabled when the deployer reads coordinator metrics

    # ---- reads ------------------------------------------------------------------------------
    async def get(self, name: str) -> DeploymentRecord:
        record = await self.store.get(name)
        if record is None:
            raise NotFound(f"no deployment named {name!r}")
        return record

    async def list(self) -> list[DeploymentRecord]:
        return await self.store.list()

    # ---- Apply ------------------------------------------------------------------------------
    async def apply(self, spec: DeploymentSpec, allow_tokenizer_change: bool = False) -> DeploymentRecord:
        existing = await self.store.get(spec.name)
        known = {v.name: v for v in existing.spec.versions} if existing else {}
        spec = await self._with_verified_checkpoints(spec, skip=set(known))
        if not allow_tokenizer_change:
            serving = list(existing.spec.versions) if existing else spec.versions[:1]
            await _check_same_tokenizer(serving, [v for v in spec.versions if v.name not in known])
        await self._check_model_is_free(spec)
        now = self.clock()
        if existing is None and await self.store.create(DeploymentRecord(spec=spec, updated_at=now)):
            self.on_change()
            return await self.get(spec.name)

        def change(record: DeploymentRecord):
            _check_update(record, spec)
            if record.spec != spec:
                record.spec, record.generation, record.updated_at = spec, record.generation + 1, now

        record = await self.store.update(spec.name, change)
        if record is None:                                   # deleted meanwhile: create it again
            return await self.apply(spec)
        self.on_change()
        return record

    async def _with_verified_checkpoints(self, spec: DeploymentSpec, skip: set[str]) -> DeploymentSpec:
        """The spec with every checkpoint path absolute; new versions' checkpoints verified."""
        versions = []
        for i, version in enumerate(spec.versions):
            if version.name in skip:
                checkpoint = str(Path(version.checkpoint).resolve()) if version.checkpoint else ""
            else:
                checkpoint = await _verified(version.checkpoint, f"versions[{i}].checkpoint")
            versions.append(version.model_copy(update={"checkpoint": checkpoint}))
        return spec.model_copy(update={"versions": versions})

    async def _check_model_is_free(self, spec: DeploymentSpec) -> None:
        for other in await self.store.list():
            if other.name != spec.name and other.spec.model == spec.model and not other.deleting:
                raise FailedPrecondition(f"deployment {other.name!r} already serves the model {spec.model!r}; "
                                         "one deployment per served model (its versions split the traffic)")

    # ---- Delete, SetTraffic -----------------------------------------------------------------
    async def delete(self, name: str) -> DeploymentRecord:
        now = self.clock()

        def change(record: DeploymentRecord):
            if not record.deleting:
                record.deleting, record.generation, record.updated_at = True, record.generation + 1, now

        return await self._update(name, change)

    async def set_traffic(self, name: str, weights: dict[str, float], adapter: str = "") -> DeploymentRecord:
        """The model's weights, or (`adapter`) that LoRA adapter's own split ({}: clear it, the
        adapter follows the model's weights again)."""
        now = self.clock()
        if adapter:
            try:
                check_adapter_name(adapter)
            except ValueError as exc:
                raise InvalidArgument(f"adapter: {exc}") from None

        def change(record: DeploymentRecord):
            _check_not_deleting(record)
            if adapter and record.rollout is not None and record.rollout.active and record.rollout.adapter == adapter:
                raise FailedPrecondition(f"the rollout of {record.rollout.version!r} splits the adapter {adapter!r}; "
                                         "promote or roll it back first")
            adapters = dict(record.spec.adapter_traffic)
            if adapter and not weights:
                adapters.pop(adapter, None)
            else:
                try:
                    check_traffic(weights, record.spec.version_names())
                except ValueError as exc:
                    raise InvalidArgument(f"weights: {exc}") from None
                if adapter:
                    adapters[adapter] = dict(weights)
            update = {"adapter_traffic": adapters} if adapter else {"traffic": dict(weights)}
            record.spec = record.spec.model_copy(update=update)
            record.generation, record.updated_at = record.generation + 1, now

        return await self._update(name, change)

    # ---- Rollout, Promote, Rollback ---------------------------------------------------------
    async def rollout(self, name: str, version: str, checkpoint: str, canary: float, replicas: int = 0,
                      previous: str = "", ready_timeout_s: float = 0.0, allow_tokenizer_change: bool = False,
                      analysis: dict | None = None, disable_analysis: bool = False, adapter: str = "",
                      adapter_path: str = "") -> DeploymentRecord:
        """A new version (its checkpoint verified first); with `adapter`, a new version of that
        LoRA adapter instead: the previous version's checkpoint and settings with the adapter served
        from `adapter_path` (verified against the base), its requests alone split."""
        record = await self.get(name)
        _check_not_deleting(record)
        _check_no_rollout(record)
        old = _previous_version(record, previous)
        new = _new_version(record, old, version, replicas)
        if not 0 < canary <= 100:
            raise InvalidArgument(f"canary: a percent of the traffic in (0, 100], got {canary:g}")
        if adapter or adapter_path:
            if checkpoint:
                raise InvalidArgument("checkpoint: an adapter rollout keeps the previous version's checkpoint "
                                      "(roll out a new checkpoint without --adapter)")
            adapter_path = await _verified_adapter(old, adapter, adapter_path)
            new = with_adapter(new, adapter, adapter_path)
        else:
            checkpoint = await _verified(checkpoint, "checkpoint")
            new = new.model_copy(update={"checkpoint": checkpoint})
        changed = await _tokenizer_change(old, new)
        if changed and not allow_tokenizer_change:
            raise FailedPrecondition(changed + TOKENIZER_ADVICE)
        settings = self._analysis_settings(analysis or {}, disable_analysis)
        timeout_s = ready_timeout_s or self.rollout_timeout_s
        now = self.clock()

        def change(current: DeploymentRecord):
            _check_not_deleting(current)
            _check_no_rollout(current)
            if current.spec.version(new.name) is not None:
                raise FailedPrecondition(f"version {new.name!r} already exists")
            if current.spec.version(old.name) is None:
                raise FailedPrecondition(f"version {old.name!r} is gone")
            share = rollout.canary_share(current.spec.traffic, canary)
            if share > current.spec.traffic.get(old.name, 0.0) + 1e-9:
                raise FailedPrecondition(f"a canary of {canary:g}% is more traffic than {old.name} has "
                                         f"({current.spec.traffic.get(old.name, 0.0):g} of "
                                         f"{sum(current.spec.traffic.values()):g})")
            rollout.begin(current, new, old.name, canary, now, timeout_s,
                          analysis=settings.to_dict() if settings.enabled else None, tokenizer_change=bool(changed),
                          adapter=adapter, adapter_path=adapter_path)

        return await self._update(name, change)

    def _analysis_settings(self, given: dict, disabled: bool) -> AnalysisSettings:
        """The deployer's defaults with the request's non-zero values; InvalidArgument for bad
        ones, FailedPrecondition when asked for analysis this deployer cannot do."""
        if disabled:
            return AnalysisSettings(enabled=False)
        if any(given.values()) and not self.analysis.enabled:
            raise FailedPrecondition("analysis settings given, but this deployer reads no coordinator metrics "
                                     "(start it with --coordinator URL) and cannot judge a canary; leave them out")
        try:
            return self.analysis.overridden(**given)
        except ValueError as exc:
            raise InvalidArgument(f"analysis: {exc}") from None

    async def promote(self, name: str) -> DeploymentRecord:
        now = self.clock()

        def change(record: DeploymentRecord):
            _check_not_deleting(record)
            state = record.rollout
            if state is None or state.phase != RolloutPhase.CANARY:
                phase = state.phase if state else "none"
                raise FailedPrecondition(f"no rollout in the canary phase to promote (last rollout: {phase}); "
                                         "a rollout is promoted once its replicas are ready")
            rollout.promote(record, now)

        return await self._update(name, change)

    async def roll_back(self, name: str, reason: str = "") -> DeploymentRecord:
        now = self.clock()

        def change(record: DeploymentRecord):
            _check_not_deleting(record)
            state = record.rollout
            if state is None or not state.active:
                phase = state.phase if state else "none"
                raise FailedPrecondition(f"no rollout in progress to roll back (last rollout: {phase}); after a "
                                         "promote, roll out the previous checkpoint as a new version")
            rollout.roll_back(record, reason or "rolled back by the operator", now)

        return await self._update(name, change)

    async def _update(self, name: str, change: Callable[[DeploymentRecord], object]) -> DeploymentRecord:
        record = await self.store.update(name, change)
        if record is None:
            raise NotFound(f"no deployment named {name!r}")
        self.on_change()
        return record


# ---- checks ---------------------------------------------------------------------------------

async def _verified(checkpoint: str, field: str) -> str:
    try:
        directory = await asyncio.to_thread(verify_checkpoint, checkpoint)
    except CheckpointError as exc:
        raise InvalidArgument(f"{field}: {exc}") from None
    return str(directory) if checkpoint else ""


async def _verified_adapter(old: VersionSpec, adapter: str, path: str) -> str:
    """The adapter directory, absolute, once it reads as a LoRA adapter the previous version's
    workers could serve (LoRA enabled, its base checkpoint's shapes, their rank limit)."""
    if not adapter or not path:
        raise InvalidArgument("adapter: an adapter rollout needs the adapter's name and its new directory (NAME=PATH)")
    try:
        check_adapter_name(adapter)
    except ValueError as exc:
        raise InvalidArgument(f"adapter: {exc}") from None
    if old.worker.get("enable_lora") != "true":
        raise FailedPrecondition(f"version {old.name!r} does not serve LoRA adapters (its worker settings have no "
                                 "enable_lora: true); apply a version that does first")
    directory = Path(path).expanduser().resolve()
    if any(c.isspace() or c == "," for c in str(directory)):
        raise InvalidArgument(f"adapter_path: no spaces or commas in the path (--lora-modules takes NAME=PATH): {directory}")

    def check() -> None:
        from mindmotor.model.config import LlamaConfig
        from mindmotor.model.lora import load_adapter

        config = LlamaConfig.from_dir(verify_checkpoint(old.checkpoint))
        load_adapter(directory, config, int(old.worker.get("max_lora_rank", "16")), name=adapter)

    try:
        await asyncio.to_thread(check)
    except (CheckpointError, ValueError) as exc:
        raise InvalidArgument(f"adapter_path: {exc}") from None
    return str(directory)


def with_adapter(version: VersionSpec, adapter: str, path: str) -> VersionSpec:
    """`version` whose workers serve `adapter` from `path` (replacing its directory, or added)."""
    from mindmotor.worker.cli import lora_modules

    modules = [(n, p) for n, p in lora_modules([version.worker.get("lora_modules", "")]) if n != adapter]
    modules.append((adapter, path))
    worker = {**version.worker, "lora_modules": " ".join(f"{n}={p}" for n, p in modules)}
    try:
        return VersionSpec.model_validate({**version.model_dump(mode="json"), "worker": worker})
    except ValidationError as exc:
        raise InvalidArgument(f"invalid new version:\n{describe_errors(exc)}") from None


async def _tokenizer_change(serving: VersionSpec, new: VersionSpec) -> str | None:
    """None if `new` tokenizes like `serving`, else what differs (both digests named)."""
    def compare() -> str | None:
        return tokenizer_difference(serving.name, tokenizer_files(serving.checkpoint), new.name,
                                    tokenizer_files(new.checkpoint))

    try:
        return await asyncio.to_thread(compare)
    except CheckpointError as exc:
        raise InvalidArgument(f"checkpoint: {exc}") from None


async def _check_same_tokenizer(serving: list[VersionSpec], new: list[VersionSpec]) -> None:
    """FailedPrecondition if a new version's tokenizer differs from the serving versions'."""
    for version in new:
        for other in serving:
            if other.name != version.name:
                changed = await _tokenizer_change(other, version)
                if changed:
                    raise FailedPrecondition(changed + TOKENIZER_ADVICE)
                break


def _check_update(record: DeploymentRecord, spec: DeploymentSpec) -> None:
    _check_not_deleting(record)
    _check_no_rollout(record)
    if record.spec.model != spec.model:
        raise FailedPrecondition(f"model: the deployment serves {record.spec.model!r}; the served model name "
                                 "cannot change (delete the deployment and apply it again)")
    for version in spec.versions:
        current = record.spec.version(version.name)
        if current is not None and current.template() != version.template():
            changed = sorted(k for k, v in version.template().items() if current.template()[k] != v)
            raise FailedPrecondition(f"version {version.name!r} exists with other {', '.join(changed)}; a version "
                                     "cannot change (only its replicas): roll out a new version instead")


def _check_not_deleting(record: DeploymentRecord) -> None:
    if record.deleting:
        raise FailedPrecondition(f"deployment {record.name!r} is being deleted; wait until it is gone")


def _check_no_rollout(record: DeploymentRecord) -> None:
    if record.rollout is not None and record.rollout.active:
        raise FailedPrecondition(f"the rollout of {record.rollout.version!r} is in progress "
                                 f"({record.rollout.phase}); promote or roll it back first")


def _previous_version(record: DeploymentRecord, previous: str) -> VersionSpec:
    if previous:
        version = record.spec.version(previous)
        if version is None:
            raise InvalidArgument(f"previous: no version {previous!r} (versions: {', '.join(record.spec.version_names())})")
        return version
    if len(record.spec.versions) != 1:
        raise InvalidArgument(f"previous: the deployment has versions {', '.join(record.spec.version_names())}; "
                              "name the one the new version replaces")
    return record.spec.versions[0]


def _new_version(record: DeploymentRecord, old: VersionSpec, name: str, replicas: int) -> VersionSpec:
    """The new version: the previous one's replicas, roles, worker settings and resources, unless given."""
    if record.spec.version(name) is not None:
        raise FailedPrecondition(f"version {name!r} already exists; a rollout starts a new version")
    count = replicas or old.replicas
    if count < 1:
        raise InvalidArgument(f"replicas: a rollout needs at least one replica ({old.name} has none; give replicas)")
    fields = {**old.model_dump(mode="json"), "name": name, "replicas": count}
    if old.prefill + old.decode > count:
        fields.update(prefill=0, decode=0)
    try:
        return VersionSpec.model_validate(fields)
    except ValidationError as exc:
        raise InvalidArgument(f"invalid new version:\n{describe_errors(exc)}") from None
