"""`request_digest`: a short fingerprint of what a Generate/Prefill call asks for — its prompt and
sampling parameters — computed alike by the coordinator and the worker, so that a stream resumed
on another coordinator (coordinator/dispatch/resume.py) continues the request it says it continues."""

from __future__ import annotations

import hashlib
from typing import Sequence

from . import worker_pb2 as pb


def request_digest(prompt: Sequence[int] | str, sampling: pb.SamplingParams) -> bytes:
    h = hashlib.sha256()
    if isinstance(prompt, str):
        h.update(b"text:" + prompt.encode("utf-8", "surrogatepass"))
    else:
        h.update(b"ids:" + ",".join(map(str, map(int, prompt))).encode())    # the same bytes, at C speed
    h.update(b"|" + sampling.SerializeToString(deterministic=True))
    return h.digest()[:16]
