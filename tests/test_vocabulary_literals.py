"""States, phases, reasons and kinds are compared as members of `mindmotor.vocabulary`, never as
literals (issue 25): a comparison in services/mindmotor (`==`, `!=`, `is`, or `in` a literal tuple,
list or set) whose string literal is the value of a vocabulary member is a failure, naming the file,
the line and the member to use. Membership in a variable (`"error" in reply`: a wire key) is not a
comparison of a state and is not flagged."""

from __future__ import annotations

import ast
import enum
from pathlib import Path

import mindmotor.vocabulary as vocabulary

ROOT = Path(__file__).resolve().parents[1] / "services" / "mindmotor"
SKIPPED_DIRS = {"protocol"}                       # generated code
# (path relative to services/mindmotor, literal): uses of a word that are not a vocabulary member
NOT_A_STATE = {
    ("trainer/store.py", "promoted"),             # a checkpoint reference (`latest`, `promoted`, a version)
}


def member_values() -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for name, obj in vars(vocabulary).items():
        if isinstance(obj, type) and issubclass(obj, enum.StrEnum) and obj.__module__ == vocabulary.__name__:
            for member in obj:
                values.setdefault(member.value, []).append(f"{name}.{member.name}")
    return values


def compared_literals(tree: ast.AST):
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for operand in operands:
            if isinstance(operand, ast.Constant) and isinstance(operand.value, str):
                literal_is_element = any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and operand is node.left
                if not literal_is_element:
                    yield node.lineno, operand.value
            elif isinstance(operand, (ast.Tuple, ast.List, ast.Set)):
                for element in operand.elts:
                    if isinstance(element, ast.Constant) and isinstance(element.value, str):
                        yield node.lineno, element.value


def offending(root: Path, values: dict[str, list[str]]) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if path.parent.name in SKIPPED_DIRS or path.name == "vocabulary.py":
            continue
        for line, literal in compared_literals(ast.parse(path.read_text(), str(path))):
            if literal in values and (relative, literal) not in NOT_A_STATE:
                found.append(f"{relative}:{line}: {literal!r} — use {' or '.join(values[literal])}")
    return found


def test_no_state_phase_or_reason_is_compared_as_a_literal():
    found = offending(ROOT, member_values())
    assert not found, "literals where vocabulary members belong:\n" + "\n".join(found)


def test_the_check_sees_each_kind_of_comparison(tmp_path):
    (tmp_path / "m.py").write_text(
        "a = s == 'ready'\n"
        "b = s in ('draining', 'x')\n"
        "c = 'length' != r\n"
        "d = 'stop' in reply\n"            # a key looked up in a mapping: not flagged
        "e = s == 'unrelated'\n")
    found = offending(tmp_path, member_values())
    assert [f.split(":")[1] for f in found] == ["1", "2", "3"]
    assert "InstanceState.READY" in found[0]
