"""SpecChecker over a real helper pool: the limits refuse the specs that crashed the coordinator
(a 3,000-rule Lark chain, a 2,500-deep `$ref` chain) without spending a helper; a spec within the
limits that still overflows a helper's stack is a 400 that says so, costs one helper (replaced)
and, asked again, is answered from the verdict cache; good specs pass and bad ones are refused
with the compiler's reason."""

from __future__ import annotations

import pytest
import pytest_asyncio

from mindmotor.engine.grammar import grammar_text
from mindmotor.rules.request_rules import InvalidRequest
from mindmotor.sandbox.pool import HelperPool
from mindmotor.sandbox.spec_check import SpecChecker
from mindmotor.rules.constraint import Constraint

from abuse_specs import as_json, chained_lark, nested_schema, optional_chain, ref_chain

pytestmark = pytest.mark.asyncio


def tasks_run(pool: HelperPool) -> float:
    return sum(s.value for s in pool.metrics.tasks.collect()[0].samples if s.name.endswith("_total"))


@pytest_asyncio.fixture
async def checker():
    pool = HelperPool("specs", size=1, task_timeout_s=10.0)
    await pool.start()
    yield SpecChecker(pool)
    await pool.close()


@pytest.mark.parametrize("constraint, code", [
    (Constraint("grammar", chained_lark(3000), "guided_grammar"), "grammar_too_large"),
    (Constraint("json", as_json(ref_chain(2500)), "response_format"), "schema_too_large"),
    (Constraint("json", as_json(nested_schema(100)), "tools"), "schema_too_deep"),
    (Constraint("regex", "a" * 70_000, "guided_regex"), "grammar_too_large"),
])
async def test_the_limits_refuse_without_a_helper(checker, constraint, code):
    with pytest.raises(InvalidRequest) as info:
        await checker.check(constraint)
    assert (info.value.param, info.value.code) == (constraint.param, code)
    assert "the limit is" in info.value.message
    assert tasks_run(checker.pool) == 0


async def test_a_spec_that_crashes_a_helper_is_a_clear_refusal_and_is_remembered(checker):
    crashing = Constraint("grammar", optional_chain(1997), "structured_outputs")
    with pytest.raises(InvalidRequest) as info:
        await checker.check(crashing)
    assert info.value.code == "structured_output_too_complex" and "crashed" in info.value.message
    assert info.value.param == "structured_outputs"
    await checker.check(Constraint("json", as_json(ref_chain(100)), "response_format"))   # the replacement
    before = tasks_run(checker.pool)
    with pytest.raises(InvalidRequest, match="crashed"):
        await checker.check(Constraint("grammar", crashing.spec, "guided_grammar"))       # the cache answers
    assert tasks_run(checker.pool) == before
    # what the helper could not compile, the engine's 64 MiB compile thread can: a helper's
    # "yes" is therefore safe for the engine
    assert grammar_text(crashing)


async def test_good_specs_pass_and_bad_ones_name_the_reason(checker):
    await checker.check(Constraint("grammar", chained_lark(1500), "guided_grammar"))
    await checker.check(Constraint("json", '{"type": "object", "properties": {"a": {"type": "integer"}}}'))
    with pytest.raises(InvalidRequest, match="regex constraint is not valid") as info:
        await checker.check(Constraint("regex", "[a-", "guided_regex"))
    assert info.value.param == "guided_regex"
