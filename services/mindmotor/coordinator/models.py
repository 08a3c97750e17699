"""`ModelCatalog`: the models this coordinator serves — every model an instance in the routing
table serves, plus the ones configured by name — with the tokenizer (and chat template) of each,
loaded once from its checkpoint directory, and its context length (the smallest any instance has)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from mindmotor.common.tokenizer import Tokenizer

from .config import CoordinatorSettings
from .errors import BadRequest, InternalError
from .instances import RoutingTable
from .logprobs import TokenText


@dataclass(frozen=True)
class ServedModel:
    name: str
    tokenizer: Tokenizer
    max_model_len: int          # 0: no instance has reported it yet
    root: str                   # the checkpoint directory
    tokens: TokenText           # single-token text and bytes (logprobs), cached


class ModelCatalog:
    def __init__(self, settings: CoordinatorSettings, table: RoutingTable):
        self.settings = settings
        self.table = table
        self.created = int(time.time())
        self._tokenizers: dict[str, Tokenizer] = {}
        self._tokens: dict[str, TokenText] = {}

    def names(self) -> list[str]:
        names = set(self.table.models()) | set(self.settings.models)
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
        directory = self.settings.tokenizer_dir(name)
        if directory is None:
            raise InternalError(f"no tokenizer is configured for model {name!r} "
                                f"(start the coordinator with --model {name}=DIR or --model-dir DIR)")
        tokenizer = self._tokenizers.get(directory)
        if tokenizer is None:
            tokenizer = self._tokenizers[directory] = Tokenizer.from_dir(directory)
        return tokenizer
