"""Run a function on a new thread with a stack of a given size: the grammar compiler recurses once
per nesting level of a spec, so where it runs decides how deep a spec it survives (compile.py)."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable, TypeVar

T = TypeVar("T")

_stack_size_lock = threading.Lock()     # threading.stack_size is process-wide: set, start, restore


def start_on_stack(fn: Callable[[], T], stack_bytes: int, name: str = "big-stack") -> "Future[T]":
    """`fn()` on a new daemon thread of `stack_bytes`; its result (or exception) in the future."""
    future: Future = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            future.set_exception(exc)

    with _stack_size_lock:
        previous = threading.stack_size(stack_bytes)
        try:
            threading.Thread(target=run, name=name, daemon=True).start()
        finally:
            threading.stack_size(previous)
    return future


def run_on_stack(fn: Callable[[], T], stack_bytes: int, name: str = "big-stack") -> T:
    """`fn()` on a new thread of `stack_bytes`, waited for."""
    return start_on_stack(fn, stack_bytes, name).result()
