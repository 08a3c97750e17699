"""`ModelCatalog`: the models this coordinator serves, with the tokenizer (and chat template) of
each and its context length (the smallest any instance has).

A model's tokenizer comes from its local checkpoint directory when one is configured (`models`,
or `model_dir` for every model) — local configuration wins — else from its workers: model
discovery (`discovery.py`) adds it once an instance answered `ModelInfo`. Both are built by
`Tokenizer.from_files` from the same two files, so a discovered model tokenizes exactly as it
would from its directory. A model is served (listed, resolvable) once its tokenizer is known:
configured ones always, discovered ones from discovery until discovery forgets them.

Versions with another tokenizer. A rollout may be allowed to serve a model's versions with
different tokenizers (the Deployer's `allow_tokenizer_change`). Discovery then records the digest
each version's instances report (`note_version`) and the tokenizer of every digest it meets
(`add_tokenizer`). For a generation request, `resolve(name, choose_version)` picks the version
first — by the traffic weights, among the versions whose tokenizer is known — and returns the
model with that version's tokenizer and the versions that share it (`ServedModel.versions`): the
request is tokenized with that tokenizer and routed (retries included) only to those versions.
While every version tokenizes alike (the normal case) nothing is restricted — and if they all
tokenize unlike the model (the canary was promoted, the model's tokenizer not relearnt yet), with
theirs. An instance not checked yet counts as serving the model's tokenizer.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection

from mindmotor.common.tokenizer import Tokenizer, TokenizerFiles

from mindmotor.coordinator.config import CoordinatorSettings
from mindmotor.coordinator.http.errors import BadRequest, ModelNotFound
from mindmotor.coordinator.routing.table import RoutingTable
from mindmotor.coordinator.openai.logprobs import TokenText


@dataclass(frozen=True)
class ServedModel:
    name: str
    tokenizer: Tokenizer
    max_model_len: int          # 0: no instance has reported it yet
    root: str                   # what /v1/models shows: the name or a configured URI, never a local path
    tokens: TokenText           # single-token text and bytes (logprobs), cached
    versions: frozenset[str] | None = None   # routed only to these versions (None: any)
    lora: str | None = None     # the LoRA adapter the request named (`name` is then its base model)


@dataclass(frozen=True)
class ModelTokenizer:
    """A model's tokenizer and the digest of the files it was built from."""
    tokenizer: Tokenizer
    digest: str                 # TokenizerFiles.digest(), as workers report it in ModelInfo

    @classmethod
    def build(cls, files: TokenizerFiles, source: str) -> "ModelTokenizer":
        """Parses the tokenizer (tens of ms for a large vocabulary): not on the event loop."""
        return cls(Tokenizer.from_files(files, source), files.digest())


class ModelCatalog:
    def __init__(self, settings: CoordinatorSettings, table: RoutingTable):
        self.settings = settings
        self.table = table
        self.created = int(time.time())
        self._local: dict[str, ModelTokenizer] = {}        # checkpoint directory -> its tokenizer
        self._discovered: dict[str, ModelTokenizer] = {}   # model -> the tokenizer its workers sent
        self._tokens: dict[str, TokenText] = {}
        self._by_digest: dict[str, ModelTokenizer] = {}          # digest -> tokenizer (versions' own)
        self._version_digest: dict[tuple[str, str], str] = {}     # (model, version) -> digest reported
        self._version_tokens: dict[str, TokenText] = {}          # digest -> its TokenText
        self.adapters = None        # catalog/adapters.py AdapterDirectory: adapter names resolve to their base

    # ---- local checkpoint directories ----------------------------------------------------
    def load_local(self) -> None:
        """Read every configured checkpoint directory (blocking: the app runs it in a thread at start)."""
        for directory in self.settings.tokenizer_dirs():
            self._local_tokenizer(directory)

    def _local_tokenizer(self, directory: str) -> ModelTokenizer:
        entry = self._local.get(directory)
        if entry is None:
            entry = self._local[directory] = ModelTokenizer.build(TokenizerFiles.read(directory), directory)
        return entry

    def is_local(self, name: str) -> bool:
        return self.settings.tokenizer_dir(name) is not None

    # ---- discovered models (written by discovery.py) -------------------------------------
    def discovered(self) -> list[str]:
        return sorted(self._discovered)

    def set_discovered(self, name: str, entry: ModelTokenizer) -> None:
        self._discovered[name] = entry

    def forget(self, name: str) -> None:
        self._discovered.pop(name, None)
        self._tokens.pop(name, None)
        for key in [k for k in self._version_digest if k[0] == name]:
            del self._version_digest[key]

    # ---- versions with their own tokenizer (written by discovery.py) ----------------------
    def note_version(self, model: str, version: str, digest: str) -> None:
        """The instances of `version` serve the tokenizer `digest`."""
        self._version_digest[(model, version)] = digest

    def add_tokenizer(self, entry: ModelTokenizer) -> None:
        self._by_digest.setdefault(entry.digest, entry)

    def has_tokenizer(self, digest: str) -> bool:
        return digest in self._by_digest or any(e.digest == digest for e in self._discovered.values()) \
            or any(e.digest == digest for e in self._local.values())

    def version_digest(self, model: str, version: str) -> str | None:
        """The digest `version` of `model` tokenizes with (unchecked: the model's)."""
        return self._version_digest.get((model, version)) or self.digest(model)

    # ---- read by the routes and discovery ------------------------------------------------
    def knows(self, name: str) -> bool:
        return self.is_local(name) or name in self._discovered

    def digest(self, name: str) -> str | None:
        """The digest of the tokenizer `name` is served with; None while it is unknown."""
        return self._entry(name).digest if self.knows(name) else None

    def names(self) -> list[str]:
        names = {m for m in self.table.models() if self.knows(m)} | set(self.settings.models) | set(self._discovered)
        if self.settings.model_dir:
            names.add(Path(self.settings.model_dir).name)
        return sorted(names)

    def max_model_len(self, name: str) -> int:
        lengths = [v.max_model_len for v in self.table.models().get(name, []) if v.max_model_len]
        return min(lengths) if lengths else 0

    def root(self, name: str) -> str:
        """The model's `root` in /v1/models: its configured URI (`model_uris`), else its name; never
        the checkpoint directory (a client has no business knowing the server's filesystem)."""
        return self.settings.model_uris.get(name) or name

    def resolve(self, name: str,
                choose_version: Callable[[str, Collection[str]], str | None] | None = None) -> ServedModel:
        """The model a request names (or the only one, when it names none); BadRequest if unknown.
        With `choose_version` (the router's weighted pick among versions) and versions that
        tokenize differently: the chosen version's tokenizer and the versions sharing it."""
        names = self.names()
        if not name:
            if len(names) != 1:
                raise BadRequest("'model' is required", param="model", code="missing_model")
            name = names[0]
        parent = self.adapters.parent(name) if self.adapters is not None and name not in names else None
        if parent is not None and parent in names:         # a LoRA adapter: its base model's, with the adapter
            base = self.resolve(parent, choose_version)
            return dataclasses.replace(base, lora=name)
        if name not in names:
            raise ModelNotFound(f"the model {name!r} does not exist; available: {', '.join(names) or 'none'}",
                                param="model", code="model_not_found")
        tokenizer = self.tokenizer(name)
        tokens = self._tokens.get(name)
        if tokens is None or tokens.tokenizer is not tokenizer:
            tokens = self._tokens[name] = TokenText(tokenizer)
        served = ServedModel(name, tokenizer, self.max_model_len(name), self.root(name), tokens)
        return self._for_version(served, choose_version) if choose_version is not None else served

    def _for_version(self, served: ServedModel,
                     choose_version: Callable[[str, Collection[str]], str | None]) -> ServedModel:
        name = served.name
        versions = {v.version for v in self.table.candidates(name)}
        digests = {v: self.version_digest(name, v) for v in versions}
        if len(set(digests.values())) <= 1:                # every version tokenizes alike ...
            only = next(iter(digests.values()), None)
            if only is None or only == self.digest(name) or only not in self._by_digest:
                return served
            return self._with_tokenizer(served, only, None)   # ... but not like the model (a promoted canary)
        known = [v for v, d in digests.items() if d == self.digest(name) or d in self._by_digest]
        version = choose_version(name, known) if known else None
        if version is None:
            return served
        digest = digests[version]
        allowed = frozenset(v for v, d in digests.items() if d == digest)
        if digest == self.digest(name):
            return ServedModel(name, served.tokenizer, served.max_model_len, served.root, served.tokens, allowed)
        return self._with_tokenizer(served, digest, allowed)

    def _with_tokenizer(self, served: ServedModel, digest: str, versions: frozenset[str] | None) -> ServedModel:
        entry = self._by_digest[digest]
        tokens = self._version_tokens.get(digest)
        if tokens is None:
            tokens = self._version_tokens[digest] = TokenText(entry.tokenizer)
        return ServedModel(served.name, entry.tokenizer, served.max_model_len, served.root, tokens, versions)

    def tokenizer(self, name: str) -> Tokenizer:
        return self._entry(name).tokenizer

    def _entry(self, name: str) -> ModelTokenizer:
        """KeyError for a model the catalog does not know (`resolve` refuses those first)."""
        directory = self.settings.tokenizer_dir(name)
        return self._local_tokenizer(directory) if directory is not None else self._discovered[name]
