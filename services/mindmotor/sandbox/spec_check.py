"""`SpecChecker`: is a structured-output spec acceptable? — the one check the coordinator and the
worker both run before a spec reaches anything that compiles it in-process.

    checker = SpecChecker(pool)
    await checker.check(constraint)        # InvalidRequest (naming constraint.param), or SpecsBusy

1. the cheap limits (`structured.constraint.check_limits`: sizes, depth, rules, `$ref`s);
2. the verdict cache: a spec seen before is answered at once (specs repeat: the same tool schema
   or response format on every call of an application), and so is one that crashed or timed out
   a helper — an attacker repeating it costs a dictionary lookup, not a helper;
3. a helper process compiles it (`compile_constraint`) on a stack 8× smaller than the engine's
   compile thread, within the pool's task timeout. A crash or a timeout is the spec's fault: a 400
   saying so (`structured_output_too_complex`). No idle helper in time is `SpecsBusy` (the
   service answers 429 / RESOURCE_EXHAUSTED); nothing is cached for it.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass

from mindmotor.rules.request_rules import InvalidRequest
from mindmotor.rules.constraint import Constraint, check_limits

from .pool import HelperBusy, HelperCrashed, HelperFailure, HelperPool, HelperTimeout

TASK = "compile_constraint"
TIMEOUT_VERDICT_TTL_S = 60.0     # a timeout may be the machine's load, not the spec: asked again after this


class SpecsBusy(Exception):
    """No helper could take the spec in time (overload, or helpers that cannot start)."""


@dataclass(frozen=True)
class _Verdict:
    message: str | None = None          # None: accepted
    code: str = "invalid_value"
    expires: float | None = None


class SpecChecker:
    def __init__(self, pool: HelperPool, cache_size: int = 2048):
        self.pool = pool
        self.cache_size = cache_size
        self._verdicts: OrderedDict[tuple[str, str], _Verdict] = OrderedDict()

    async def check(self, constraint: Constraint | None) -> None:
        if constraint is None:
            return
        check_limits(constraint)
        if constraint.kind == "json_object":
            return                                          # a fixed grammar: nothing of the request's to compile
        key = (constraint.kind, hashlib.sha256(constraint.spec.encode("utf-8", "surrogatepass")).hexdigest())
        verdict = self._cached(key)
        if verdict is None:
            verdict = await self._ask(constraint)
            self._remember(key, verdict)
        if verdict.message is not None:
            raise InvalidRequest(verdict.message, param=constraint.param, code=verdict.code)

    def _cached(self, key) -> _Verdict | None:
        verdict = self._verdicts.get(key)
        if verdict is None:
            return None
        if verdict.expires is not None and time.monotonic() > verdict.expires:
            del self._verdicts[key]
            return None
        self._verdicts.move_to_end(key)
        return verdict

    def _remember(self, key, verdict: _Verdict) -> None:
        self._verdicts[key] = verdict
        while len(self._verdicts) > self.cache_size:
            self._verdicts.popitem(last=False)

    async def _ask(self, constraint: Constraint) -> _Verdict:
        what = f"the {constraint.kind} constraint"
        try:
            await self.pool.run(TASK, kind=constraint.kind, spec=constraint.spec, param=constraint.param)
        except InvalidRequest as exc:
            return _Verdict(exc.message, exc.code)
        except HelperCrashed as exc:
            return _Verdict(f"{what} could not be compiled: the grammar compiler crashed on it ({_why(exc)}); "
                            "simplify it (fewer nesting levels, rules or references)", "structured_output_too_complex")
        except HelperTimeout:
            return _Verdict(f"{what} did not compile within {self.pool.task_timeout_s:g} s; simplify it",
                            "structured_output_too_complex", time.monotonic() + TIMEOUT_VERDICT_TTL_S)
        except HelperBusy as exc:
            raise SpecsBusy(str(exc)) from None
        except HelperFailure as exc:
            raise SpecsBusy(f"the structured output could not be checked: {exc}") from None
        return _Verdict()


def _why(exc: HelperCrashed) -> str:
    code = exc.returncode
    if code == -11:
        return "out of stack: nested too deeply"
    if code in (-9, -6):
        return "out of memory, or too large"
    return f"exit {code}"
