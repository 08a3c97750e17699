"""One free-port helper in the tree: `mindmotor.common.ports` (issue 25). Copies had crept into
tests, services' testing modules and benchmarks; this test fails if one comes back.

A function is taken for a free-port helper if it is named like one (`free_port`, `_free_ports`,
`unused_port`, ...) or if it binds a socket to port 0, reads the port back with `getsockname()` and
closes that socket itself (a `with` block or `.close()`): the port is wanted, not the socket. A server
that binds port 0 and listens on that socket (and reports its port) is not one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEARCHED = ("services", "tests", "benchmarks", "loadtest", "examples", "scripts")
THE_HELPER = ROOT / "services" / "mindmotor" / "common" / "ports.py"
HELPER_NAME = re.compile(r"^_*(free|unused|unbound|available|open|spare|random)_?ports?$", re.IGNORECASE)


def _binds_port_zero(call: ast.Call) -> str | None:
    """The name of the socket in `NAME.bind((host, 0))`, else None."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "bind" and isinstance(func.value, ast.Name)):
        return None
    if len(call.args) != 1 or not isinstance(call.args[0], ast.Tuple) or len(call.args[0].elts) != 2:
        return None
    port = call.args[0].elts[1]
    return func.value.id if isinstance(port, ast.Constant) and port.value == 0 else None


def _closes(function: ast.AST, name: str) -> bool:
    for node in ast.walk(function):
        if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name) \
                and node.optional_vars.id == name:
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "close" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == name:
            return True
    return False


def free_port_helpers(source: str) -> list[tuple[int, str]]:
    """(line, function name) of every free-port helper defined in `source`."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = [node for node in ast.walk(function) if isinstance(node, ast.Call)]
        reads_port = any(isinstance(c.func, ast.Attribute) and c.func.attr == "getsockname" for c in calls)
        bound = {name for c in calls if (name := _binds_port_zero(c))}
        if HELPER_NAME.match(function.name) or (reads_port and any(_closes(function, n) for n in bound)):
            found.append((function.lineno, function.name))
    return found


def test_the_detector_finds_the_copies_that_were_removed_and_spares_a_server():
    copy = ("def pick():\n    with socket.socket() as s:\n        s.bind(('127.0.0.1', 0))\n"
            "        return s.getsockname()[1]\n")
    closed = ("def ports(n):\n    socks = [socket.socket() for _ in range(n)]\n    s = socks[0]\n"
              "    s.bind(('', 0))\n    port = s.getsockname()[1]\n    s.close()\n    return port\n")
    server = ("def serve():\n    sock = socket.socket()\n    sock.bind(('127.0.0.1', 0))\n"
              "    start(sockets=[sock])\n    return sock.getsockname()[1]\n")
    assert free_port_helpers(copy) == [(1, "pick")]
    assert free_port_helpers(closed) == [(1, "ports")]
    assert free_port_helpers("def _free_port():\n    return 1\n") == [(1, "_free_port")]
    assert free_port_helpers(server) == []


def test_there_is_one_free_port_helper():
    found = []
    for top in SEARCHED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == THE_HELPER or ".venv" in path.parts:
                continue
            found += [f"{path.relative_to(ROOT)}:{line} {name}()"
                      for line, name in free_port_helpers(path.read_text(encoding="utf-8"))]
    assert not found, ("free-port helpers besides mindmotor.common.ports (use `free_port`/`free_ports` "
                       "from there):\n  " + "\n  ".join(found))
    assert {name for _, name in free_port_helpers(THE_HELPER.read_text())} == {"free_port", "free_ports"}
