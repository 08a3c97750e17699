"""`ModelCatalog`: the models this coordinator serves, with the tokenizer (and chat template) of
each and its context length (the smallest any instance has).

A model's tokenizer comes from its local checkpoint directory when one is configured (`models`,
or `model_dir` for every model) — local configuration wins — else from its workers: model
discovery (`discovery.py`) adds it once an instance answered `ModelInfo`. Both are built by
`Tokenizer.from_files` from the same two files, so a discovered model tokenizes exactly as it
would from its directory. A model is served (listed, resolvable) once its tokenizer is known:
configured ones always, discovered ones from discovery until discovery forgets them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from mindmotor.common.tokenizer import Tokenizer, TokenizerFiles

from .config import CoordinatorSettings
from .errors import BadRequest
from .instances import RoutingTable
from .logprobs import TokenText


@dataclass(frozen=True)
class ServedModel:
    name: str
    tokenizer: Tokenizer
    max_model_len: int          # 0: no instance has reported it yet
    root: str                   # the checkpoint directory (the model name, when discovered)
    tokens: TokenText           # single-token text and bytes (logprobs), cached


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
        return self.settings.tokenizer_dir(name) or name

    def resolve(self, name: str) -> ServedModel:
        """The model a request names (or the only one, when it names none); BadRequest if unknown."""
        names = self.names()
        if not name:
            if len(names) != 1:
                raise BadRequest("'model' is required", param="model", code="missing_model")
            name = names[0]
        if name not in names:
            raise BadRequest(f"the model {name!r} does not exist; available: {', '.join(names) or 'none'}",
                             param="model", code="model_not_found")
        tokenizer = self.tokenizer(name)
        tokens = self._tokens.get(name)
        if tokens is None or tokens.tokenizer is not tokenizer:
            tokens = self._tokens[name] = TokenText(tokenizer)
        return ServedModel(name, tokenizer, self.max_model_len(name), self.root(name), tokens)

    def tokenizer(self, name: str) -> Tokenizer:
        return self._entry(name).tokenizer

    def _entry(self, name: str) -> ModelTokenizer:
        """KeyError for a model the catalog does not know (`resolve` refuses those first)."""
        directory = self.settings.tokenizer_dir(name)
        return self._local_tokenizer(directory) if directory is not None else self._discovered[name]
