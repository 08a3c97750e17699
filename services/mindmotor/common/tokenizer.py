"""Tokenizer: a Hugging Face `tokenizer.json` through the `tokenizers` library, the chat template
from `tokenizer_config.json`, and incremental detokenization for streaming.

`TokenizerFiles` is those two files as bytes — read from a checkpoint directory, or received from a
worker (`ModelInfo`) by a coordinator that has no copy of the checkpoint; `Tokenizer.from_files`
builds the tokenizer from them, so both ways give the same tokenizer.

Also `train_bpe`, which trains a byte-level BPE tokenizer (used by the trainer and by the tiny
test checkpoints), so that no tokenizer is ever downloaded.
"""

from __future__ import annotations

import functools

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import jinja2
import jinja2.meta
import jinja2.sandbox
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from tokenizers.decoders import DecodeStream

EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [EOS_TOKEN, IM_START, IM_END]
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

# ChatML, as Qwen2 uses it: https://huggingface.co/docs/transformers/chat_templating
# ChatML, with tools: their signatures in a system turn, calls as <tool_call>{"name", "arguments"}</tool_call>
# in assistant turns, results as tool turns (<tool_response>); without tools, plain ChatML.
CHATML_TEMPLATE = "{%- if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}You may call these functions:\n<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\nTo call one, answer with <tool_call>{\"name\": <function name>, \"arguments\": <arguments object>}</tool_call><|im_end|>\n{% endif %}\n{%- for message in messages %}\n{%- if tools and loop.first and message['role'] == 'system' %}\n{%- elif message['role'] == 'tool' %}{{ '<|im_start|>tool\\n<tool_response>' + (message['content'] or '') + '</tool_response><|im_end|>\\n' }}\n{%- else %}{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}\n{%- for call in message['tool_calls'] or [] %}{{ '<tool_call>{\"name\": ' }}{{ call['function']['name'] | tojson }}{{ ', \"arguments\": ' + call['function']['arguments'] + '}</tool_call>' }}{% endfor %}\n{{- '<|im_end|>\\n' }}\n{%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"


class TokenizerError(ValueError):
    """Tokenizer files that cannot be used; the message names the file and where it came from."""


@dataclass(frozen=True)
class TokenizerFiles:
    """A checkpoint's `tokenizer.json` and `tokenizer_config.json` (chat template, special tokens),
    byte for byte."""

    tokenizer_json: bytes
    tokenizer_config_json: bytes = b""      # b"": the checkpoint has none

    @classmethod
    def read(cls, directory: str | Path) -> "TokenizerFiles":
        directory = Path(directory)
        path = directory / TOKENIZER_FILE
        if not path.is_file():
            raise TokenizerError(f"{path}: missing (a checkpoint needs {TOKENIZER_FILE})")
        config_path = directory / TOKENIZER_CONFIG_FILE
        return cls(path.read_bytes(), config_path.read_bytes() if config_path.is_file() else b"")

    def digest(self) -> str:
        """Hex sha256 over both files, each preceded by its length (8 bytes, big-endian): equal
        digests mean the same tokenization and chat template."""
        h = hashlib.sha256()
        for content in (self.tokenizer_json, self.tokenizer_config_json):
            h.update(len(content).to_bytes(8, "big"))
            h.update(content)
        return h.hexdigest()


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> HFTokenizer:
    """Train a byte-level BPE tokenizer (GPT-2 style: every byte is a token, so nothing is unknown)."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok: HFTokenizer, directory: str | Path, model_max_length: int,
                   chat_template: str = CHATML_TEMPLATE) -> None:
    """Write `tokenizer.json` and `tokenizer_config.json` (with the chat template) in HF layout."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / TOKENIZER_FILE))
    added = {
        str(tok.token_to_id(t)): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                  "normalized": False, "single_word": False}
        for t in SPECIAL_TOKENS if tok.token_to_id(t) is not None
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "model_max_length": model_max_length,
        "added_tokens_decoder": added,
        "clean_up_tokenization_spaces": False,
        "chat_template": chat_template,
    }
    (directory / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def _token_content(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


@dataclass
class Tokenizer:
    """What the engine and the services need of a tokenizer."""

    hf: HFTokenizer
    eos_token: str | None = None
    bos_token: str | None = None
    chat_template: str | None = None
    eos_token_ids: tuple[int, ...] = ()
    _template: jinja2.Template | None = field(default=None, repr=False)

    @classmethod
    def from_dir(cls, directory: str | Path, extra_eos_ids: Sequence[int] = ()) -> "Tokenizer":
        return cls.from_files(TokenizerFiles.read(directory), str(directory), extra_eos_ids)

    @classmethod
    def from_files(cls, files: TokenizerFiles, source: str, extra_eos_ids: Sequence[int] = ()) -> "Tokenizer":
        """The tokenizer the files describe; `source` (a directory, a worker) names them in errors."""
        try:
            hf = HFTokenizer.from_str(files.tokenizer_json.decode("utf-8"))
        except Exception as exc:  # the tokenizers library raises plain Exceptions
            raise TokenizerError(f"{source}/{TOKENIZER_FILE}: cannot be loaded: {exc}") from exc
        config: dict = {}
        if files.tokenizer_config_json:
            try:
                config = json.loads(files.tokenizer_config_json)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise TokenizerError(f"{source}/{TOKENIZER_CONFIG_FILE}: invalid JSON: {exc}") from exc
        eos = _token_content(config.get("eos_token"))
        bos = _token_content(config.get("bos_token"))
        eos_ids = {int(i) for i in extra_eos_ids}
        if eos is not None and hf.token_to_id(eos) is not None:
            eos_ids.add(hf.token_to_id(eos))
        template = config.get("chat_template")
        if isinstance(template, list):  # HF allows a list of named templates
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        tokenizer = cls(hf=hf, eos_token=eos, bos_token=bos, chat_template=template,
                        eos_token_ids=tuple(sorted(eos_ids)))
        tokenizer.max_token_chars                 # computed with the rest of the loading, not per request
        return tokenizer

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The text's token ids; `add_special_tokens`: with what the tokenizer's post-processor
        adds around a sequence (a BOS, for Llama's), as Hugging Face's and vLLM's option."""
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token decodes to: text of more than `n * max_token_chars`
        characters has more than n tokens, known without tokenizing it."""
        size = self.vocab_size
        return max(1, max((len(t) for t in self.hf.decode_batch([[i] for i in range(size)],
                                                                 skip_special_tokens=False)), default=1))

    def encode_many(self, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
        """`encode` of each text, in the tokenizers library's batch call, which releases the GIL
        while it works (the single `encode` holds it: 0.5 s per MB of text with every other
        thread of the process stopped) — call it on a worker thread to keep an event loop free."""
        return [e.ids for e in self.hf.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self.hf.id_to_token(int(token_id))

    def _compiled_template(self) -> jinja2.Template:
        if not self.chat_template:
            raise TokenizerError("this model has no chat template (tokenizer_config.json: chat_template)")
        if self._template is None:
            env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            self._template = env.from_string(self.chat_template)
        return self._template

    @functools.cached_property
    def template_variables(self) -> frozenset[str]:
        """The variables the chat template reads (none without a template): a request's
        `chat_template_kwargs` or `documents` that it does not read change nothing."""
        if not self.chat_template:
            return frozenset()
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return frozenset(jinja2.meta.find_undeclared_variables(env.parse(self.chat_template)))

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, documents: list[dict] | None = None,
                            continue_final_message: bool = False, extra: dict | None = None) -> str:
        """The messages rendered by the chat template. `extra`: more template variables (a request's
        `chat_template_kwargs`, e.g. `enable_thinking`). `continue_final_message`: the text ends
        with the last message's content, left open for the model to continue (what the template
        writes after it, an end-of-turn token, is cut) — as Hugging Face's `apply_chat_template`."""
        text = self._compiled_template().render(
            **(extra or {}), messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "", tools=tools or None,
            documents=documents or None)
        if continue_final_message:
            text = _cut_after_final_message(text, messages[-1].get("content") or "")
        return text


def _cut_after_final_message(text: str, final: str) -> str:
    """`text` up to the end of the final message's content (its last occurrence); ValueError when
    the template did not write it."""
    stripped = final.strip()
    if not stripped or stripped not in text:
        raise TokenizerError("continue_final_message needs a final message with content that the chat "
                             "template writes into the prompt")
    at = text.rindex(stripped)
    if text[at:at + len(final.lstrip())] == final.lstrip():
        return text[:at + len(final.lstrip())]     # the template kept its trailing spaces
    return text[:at + len(stripped)]


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without splitting a UTF-8 character.

    The `tokenizers` library's `DecodeStream` does the work (in Rust, one call per token); it holds
    back bytes until they form whole characters. A short window of prompt tokens primes it, so the
    first generated token decodes as it would after the prompt.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), window: int = 6,
                 skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        primer = [int(t) for t in prompt_ids[-window:]]
        self._stream = DecodeStream(ids=primer or None, skip_special_tokens=skip_special_tokens)
        self.ids: list[int] = []
        self.text = ""

    def add(self, token_ids: Sequence[int]) -> str:
        pieces = []
        for token in token_ids:
            self.ids.append(int(token))
            chunk = self._stream.step(self.tokenizer.hf, int(token))
            if chunk:
                pieces.append(chunk)
        delta = "".join(pieces)
        self.text += delta
        return delta

    def add_one(self, token: int) -> str:
        """`add([token])`, without the list (once per sampled token of every sequence)."""
        token = int(token)
        self.ids.append(token)
        chunk = self._stream.step(self.tokenizer.hf, token)
        if chunk:
            self.text += chunk
            return chunk
        return ""

    def flush(self) -> str:
        """At the end of a sequence: emit whatever was held back (an incomplete character)."""
        full = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip_special_tokens)
        delta = full[len(self.text):] if full.startswith(self.text) else ""
        self.text += delta
        return delta
