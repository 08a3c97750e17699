"""Tool calls parsed as the output grows, the way vLLM's tool parsers stream them: content until a
`<tool_call>` opening is recognised (a partial marker is held back, never sent as content), then
per call a header (index, name) once the name is whole, then its arguments' raw JSON text as it
grows. `auto` reads the chat template's `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
blocks; `required` the grammar-forced array `[{"name": ..., "parameters": {...}}, ...]`.

The non-streamed response is parsed by feeding the whole text through the same parser, so a
streamed choice accumulates to exactly the non-streamed one. Whitespace next to a call is not
content: it is held until more content follows, and dropped at the end when a call was made."""

from __future__ import annotations

import json
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"
WHITESPACE = " \t\r\n"


@dataclass(frozen=True)
class Delta:
    """Content text, or a call's header (`name` set), or more of a call's arguments."""
    content: str = ""
    index: int | None = None
    name: str | None = None
    arguments: str = ""


class CallObject:
    """One call's JSON object followed character by character: its "name" once whole, and the raw
    text of its arguments value (`args_key`) as it grows, in either order."""

    def __init__(self, args_key: str):
        self.args_key = args_key
        self.depth = 0
        self.in_string = self.escaped = False
        self.expect = "open"              # open | key | colon | value
        self.key_chars: list[str] = []
        self.key = ""
        self.value: list[str] = []
        self.name: str | None = None
        self.args: str | None = None      # the arguments value, once it ended
        self.closed = self.broken = False

    def arguments(self) -> str:
        """The arguments text that can be sent now (trailing whitespace held)."""
        if self.args is not None:
            return self.args
        if self.key == self.args_key and self.expect == "value":
            return "".join(self.value).strip()
        return ""

    def feed(self, c: str) -> bool:
        """Consume `c`; False when it is not part of the object (it is closed, or `c` breaks it)."""
        if self.closed or self.broken:
            return False
        if self.in_string:
            (self.key_chars if self.expect == "key" else self.value).append(c)
            if self.escaped:
                self.escaped = False
            elif c == "\\":
                self.escaped = True
            elif c == '"':
                self.in_string = False
                if self.expect == "key":
                    self.key, self.expect = json.loads("".join(self.key_chars)), "colon"
            return True
        if c in WHITESPACE and (self.expect != "value" or not self.value):
            return True
        return self._structural(c)

    def _structural(self, c: str) -> bool:
        if self.expect == "open":
            self.depth, self.expect = 1, "key"
            return self._ok(c == "{")
        if self.expect == "key":
            if c == "}" and not self.key:
                self.closed = True
                return True
            self.key_chars, self.in_string = [c], True
            return self._ok(c == '"')
        if self.expect == "colon":
            self.expect, self.value = "value", []
            return self._ok(c == ":")
        if self.depth == 1 and c in ",}":
            self._end_value()
            self.closed = c == "}"
            self.expect = "value" if self.closed else "key"
            return not self.broken
        self.value.append(c)
        if c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
        return True

    def _ok(self, good: bool) -> bool:
        self.broken = self.broken or not good
        return good

    def _end_value(self) -> None:
        text = "".join(self.value).strip()
        if self.key == "name":
            try:
                name = json.loads(text)
            except ValueError:
                name = None
            self._ok(isinstance(name, str))
            self.name = name if isinstance(name, str) else None
        elif self.key == self.args_key:
            self.args = text
        self.key = ""


class ToolCallStream:
    """One choice's output → Deltas, fed piece by piece (`feed`), then `finish`."""

    def __init__(self, mode: str, names: set[str]):
        self.mode = mode                  # "auto" or "required"
        self.names = names
        self.state = "text" if mode == "auto" else "array"
        self.buffer = ""                  # text not yet decided
        self.pending_ws = ""              # content whitespace held
        self.raw = ""                     # auto: the current block's text, should it not be a call
        self.call: CallObject | None = None
        self.header = False               # the current call's header was sent
        self.sent_args = 0                # of the current call's arguments
        self.calls = 0                    # headers sent
        self.out: list[Delta] = []

    def feed(self, text: str) -> list[Delta]:
        self.buffer += text
        progress = True
        while self.buffer and progress:
            progress = getattr(self, "_" + self.state)()
        return self._take()

    def finish(self) -> list[Delta]:
        if self.state == "call" and not self.header:
            self._content(self.raw + self.buffer)
        elif self.state in ("text", "array", "close"):
            self._content(self.buffer)
        self.buffer = ""
        if not self.calls and self.pending_ws:
            self.out.append(Delta(content=self.pending_ws))
        self.pending_ws = ""
        return self._take()

    # ---- states: each consumes from the buffer; False when it needs more text --------------------
    def _text(self) -> bool:
        at = self.buffer.find(OPEN)
        if at < 0:
            keep = _partial_suffix(self.buffer, OPEN)
            self._content(self.buffer[:len(self.buffer) - keep])
            self.buffer = self.buffer[len(self.buffer) - keep:]
            return False
        self._content(self.buffer[:at])
        self.buffer = self.buffer[at + len(OPEN):]
        self._start_call(raw=OPEN)
        return True

    def _array(self) -> bool:
        c = self.buffer[0]
        if c in WHITESPACE or c in "[,]":
            self.buffer = self.buffer[1:]
            return True
        if c == "{":
            self._start_call(raw="")
            return True
        self._content(self.buffer)       # anything the grammar did not force: not a call
        self.buffer = ""
        return False

    def _call(self) -> bool:
        call, used = self.call, 0
        for c in self.buffer:
            if not call.feed(c):
                break                     # `c` is not the call's: left in the buffer
            used += 1
            if call.closed:
                break
        self.raw, self.buffer = self.raw + self.buffer[:used], self.buffer[used:]
        self._emit_call()
        if call.closed or call.broken:
            return self._end_call()
        return False

    def _close(self) -> bool:
        rest = self.buffer.lstrip(WHITESPACE)
        if rest.startswith(CLOSE):
            self.buffer, self.state = rest[len(CLOSE):], "text"
            return True
        if CLOSE.startswith(rest):
            return False                  # maybe the closing tag, not yet whole
        self.state = "text"               # no closing tag: the call ended with its object
        return True

    # ---- helpers ----------------------------------------------------------------------------------
    def _start_call(self, raw: str) -> None:
        args_key = "arguments" if self.mode == "auto" else "parameters"
        self.call, self.raw, self.state = CallObject(args_key), raw, "call"
        self.header, self.sent_args = False, 0

    def _emit_call(self) -> None:
        """The header once the name is whole and a tool's (then the call is committed: whatever
        follows it is sent), and the arguments grown since."""
        call = self.call
        if not self.header:
            if call.name not in self.names:
                return
            self.header, self.pending_ws = True, ""
            self.out.append(Delta(index=self.calls, name=call.name))
            self.calls += 1
        args = "{}" if call.closed and call.args is None else call.arguments()
        if len(args) > self.sent_args:
            self.out.append(Delta(index=self.calls - 1, arguments=args[self.sent_args:]))
            self.sent_args = len(args)

    def _end_call(self) -> bool:
        if not self.header and self.mode == "auto":
            self._content(OPEN)           # not a call: content, read again after the marker
            self.buffer = self.raw[len(OPEN):] + self.buffer
        elif not self.header:
            self._content(self.raw)
        self.state = "array" if self.mode == "required" else ("close" if self.header else "text")
        self.call = None
        return True

    def _content(self, text: str) -> None:
        if not text:
            return
        body = text.rstrip(WHITESPACE)
        if not body:
            self.pending_ws += text
            return
        self.out.append(Delta(content=self.pending_ws + body))
        self.pending_ws = text[len(body):]

    def _take(self) -> list[Delta]:
        out, self.out = _coalesce(self.out), []
        return out


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _coalesce(deltas: list[Delta]) -> list[Delta]:
    """Adjacent content deltas, and adjacent argument deltas of one call, joined."""
    out: list[Delta] = []
    for d in deltas:
        last = out[-1] if out else None
        if last and d.content and last.content:
            out[-1] = Delta(content=last.content + d.content)
        elif last and d.arguments and last.arguments and d.index == last.index:
            out[-1] = Delta(index=d.index, arguments=last.arguments + d.arguments)
        else:
            out.append(d)
    return out


def parse_all(mode: str, names: set[str], text: str) -> tuple[str, list[tuple[str, str]]]:
    """A whole output through the stream parser: (content, [(name, arguments)])."""
    stream = ToolCallStream(mode, names)
    content, calls = [], []
    for d in stream.feed(text) + stream.finish():
        if d.name is not None:
            calls.append([d.name, ""])
        elif d.index is not None:
            calls[d.index][1] += d.arguments
        else:
            content.append(d.content)
    return "".join(content), [(n, a) for n, a in calls]
