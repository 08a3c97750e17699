"""The top-level packages of `mindmotor` depend on each other in one direction (issue 25).

The graph is computed from the source: every `import` and `from ... import` of every module under
services/mindmotor — at module level, inside a function or under `if TYPE_CHECKING` alike (a lazy
import is still a dependency), relative ones resolved — gives an edge from the package of the
importing module to the package of the imported one. Two checks: the graph has no cycle, and every
edge is one `ALLOWED` permits. `ALLOWED` is the layering, bottom-up; docs/architecture.md
("Package map") shows the same map. A failure names each offending module, line and import.

What the analysis cannot see: modules imported by a name computed at run time (cli.py's table of
command modules; cli.py is on top and may use any package) and programs started as processes
(`python -m mindmotor.cli ...`: runtime/ starts services by command line, never by import).
"""

from __future__ import annotations

import ast
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "services" / "mindmotor"
PACKAGE_ROOT = "mindmotor"        # the node of services/mindmotor/__init__.py: `mindmotor.LLM` & co.

# Bottom-up: each package (or module directly under mindmotor/) with the packages it may import.
# A package may only name packages listed before it, so the map itself is acyclic (checked below).
ALLOWED: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in {
    # base: imported by anyone, importing next to nothing
    "protocol": set(),                          # generated gRPC messages and stubs
    "vocabulary": set(),                        # the states, phases, reasons and kinds: one StrEnum each (anyone's)
    "runtime": {"vocabulary"},                  # process supervision: names what it starts by command line
    "common": {"protocol", "runtime", "vocabulary"},
    # what a request and a model are
    "rules": {"common", "vocabulary"},          # request validation, shared by coordinator, worker, engine, helpers
    "device": {"common", "vocabulary"},
    "model": {"common", "vocabulary"},
    "structured": {"common", "rules", "vocabulary"},
    # what runs a request
    "engine": {"common", "device", "model", "rules", "structured", "vocabulary"},
    "sandbox": {"common", "rules", "runtime", "structured", "vocabulary"},
    # services
    "controller": {"common", "protocol", "vocabulary"},
    "trainer": {"common", "engine", "model", "protocol", "vocabulary"},
    "worker": {"common", "controller", "engine", "protocol", "rules", "sandbox", "structured", "vocabulary"},
    "coordinator": {"common", "controller", "protocol", "rules", "runtime", "sandbox", "vocabulary"},
    "deployer": {"common", "controller", "model", "protocol", "runtime", "vocabulary", "worker"},
    "operator": {"common", "deployer", "vocabulary"},   # the InferenceService operator: into the Deployer's backend
    # the simulator composes the real parts: the engine, the coordinator's routing, the worker's windows
    "simulator": {"common", "controller", "coordinator", "device", "engine", "rules", "vocabulary", "worker"},
    # entry points
    "launcher": {"common", "coordinator", "deployer", "model", "runtime", "vocabulary", "worker"},
    "npu_smi_cli": {"common", "device", "vocabulary", "worker"},
    "analysis": {"common", "vocabulary"},       # `mindmotor analyze`: reads what a running platform exports
    PACKAGE_ROOT: {"engine", "rules", "vocabulary"},
    "cli": {"analysis", "common", "controller", "coordinator", "deployer", "device", "launcher", "npu_smi_cli", "operator", "simulator", "trainer", "vocabulary", "worker"},
}.items()}


@dataclass(frozen=True)
class Import:
    source: str          # the importing package
    target: str          # the imported package
    where: str           # path:line, relative to services/
    statement: str


def node_of(module: str, packages: set[str]) -> str | None:
    """`mindmotor.coordinator.http.server` → `coordinator`; None for a module outside mindmotor."""
    parts = module.split(".")
    if parts[0] != PACKAGE_ROOT:
        return None
    return parts[1] if len(parts) > 1 and parts[1] in packages else PACKAGE_ROOT


def top_level(root: Path) -> set[str]:
    """The packages and modules directly under `root` (besides its __init__)."""
    return {p.name if p.is_dir() else p.stem for p in root.iterdir()
            if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}


def imported_modules(node: ast.Import | ast.ImportFrom, package: list[str]) -> list[str]:
    """The dotted modules one import statement loads (`package`: the importing module's package)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parent = package[:len(package) - (node.level - 1)]
        base = ".".join([*parent, *([node.module] if node.module else [])])
    if base == PACKAGE_ROOT:
        # `from mindmotor import engine`: the package engine; `... import LLM`: the root's lazy facade
        # (an edge to PACKAGE_ROOT); `... import __version__`: the root's own constant, loaded by any
        # import of mindmotor.*, so no edge ("")
        return ["" if a.name.startswith("__") else f"{PACKAGE_ROOT}.{a.name}" for a in node.names]
    return [base]


def import_statements(tree: ast.Module):
    """Every import statement, however deep in functions, classes, `if`s and `try`s (imports are
    statements: expressions need no visit)."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            pending.extend(getattr(node, field, ()))


def imports(root: Path) -> list[Import]:
    """Every import from one top-level package of `root` (a `mindmotor` directory) into another."""
    packages = top_level(root)
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        package = parts[:-1]                                  # __init__'s package is its directory: the same
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        source_node = node_of(module, packages)
        text = path.read_text()
        lines = text.splitlines()
        for node in sorted(import_statements(ast.parse(text, str(path))), key=lambda n: n.lineno):
            statement = " ".join(" ".join(lines[node.lineno - 1:node.end_lineno]).split())
            for target in {node_of(m, packages) for m in imported_modules(node, package) if m}:
                if target is not None and target != source_node:
                    where = f"{path.relative_to(root.parent)}:{node.lineno}"
                    found.append(Import(source_node, target, where, statement))
    return found


def graph(edges: list[Import]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        out[edge.source].add(edge.target)
    return out


def cycles(out: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one package (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(out.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(set(out) | {w for ws in out.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def path_between(out: dict[str, set[str]], start: str, goal: str) -> list[str]:
    """A shortest chain of imports from `start` to `goal` (breadth first); [] if there is none."""
    previous: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue and goal not in previous:
        v = queue.popleft()
        for w in sorted(out.get(v, ())):
            if w not in previous:
                previous[w] = v
                queue.append(w)
    if goal not in previous:
        return []
    path = [goal]
    while previous[path[-1]] is not None:
        path.append(previous[path[-1]])
    return path[::-1]


def disallowed(edges: list[Import]) -> list[Import]:
    return [e for e in edges if e.target not in ALLOWED.get(e.source, frozenset())]


def cycle_report(edges: list[Import]) -> str:
    """Per cycle: each of its edges that ALLOWED does not permit (every cycle has one, the map being
    acyclic), with the shortest way back that closes the cycle and one import line per step."""
    out, first = graph(edges), {}
    for edge in edges:
        first.setdefault((edge.source, edge.target), edge)
    lines = []
    for component in cycles(out):
        lines.append(f"import cycle among {', '.join(component)}:")
        wrong = sorted({(e.source, e.target) for e in disallowed(edges) if {e.source, e.target} <= set(component)})
        for source, target in wrong:
            loop = [source, *path_between(out, target, source)]
            lines.append(f"  {' -> '.join(loop)}   ({source} -> {target} is against the map)")
            lines += [f"    {first[step].where}: {first[step].statement}" for step in zip(loop, loop[1:])]
    return "\n".join(lines)


def test_the_map_points_down_only():
    order = list(ALLOWED)
    upward = {package: sorted(t for t in targets if t not in order[:order.index(package)])
              for package, targets in ALLOWED.items()}
    assert {p: t for p, t in upward.items() if t} == {}, "a package may only be allowed what is listed before it"


def test_every_top_level_package_is_in_the_map():
    present = top_level(ROOT) | {PACKAGE_ROOT}
    assert sorted(present - set(ALLOWED)) == [], "a new package: place it in ALLOWED (and docs/architecture.md)"
    assert sorted(set(ALLOWED) - present) == [], "ALLOWED names a package that is not there"


def test_the_package_import_graph_has_no_cycle():
    edges = imports(ROOT)
    assert len(graph(edges)) > 10, "the analysis found almost no imports: is ROOT right?"
    report = cycle_report(edges)
    if report:
        pytest.fail(report, pytrace=False)


def test_every_import_between_packages_is_one_the_map_allows():
    bad = disallowed(imports(ROOT))
    report = "\n".join(f"{e.where}: `{e.statement}`: {e.source} may not import {e.target} "
                       f"(it may import: {', '.join(sorted(ALLOWED.get(e.source, ()))) or 'nothing'})" for e in bad)
    if bad:
        pytest.fail(f"{len(bad)} imports against the package map:\n{report}", pytrace=False)


def test_the_analysis_sees_lazy_and_relative_imports_and_names_the_line(tmp_path):
    """The checks above can fail: a cycle made of a function-level import and a relative one."""
    root = tmp_path / "mindmotor"
    for package in ("alpha", "beta", "gamma"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "__init__.py").write_text("__version__ = '0'\n")
    (root / "alpha" / "one.py").write_text("from mindmotor.beta.two import thing\n")
    (root / "beta" / "two.py").write_text("import os\n\n\ndef thing():\n    from ..alpha import one\n    return one\n")
    (root / "gamma" / "three.py").write_text("from mindmotor import __version__\nfrom mindmotor import beta\n"
                                             "from . import four\nfrom mindmotor import LLM\n")
    edges = imports(root)
    assert {(e.source, e.target, e.where, e.statement) for e in edges} == {
        ("alpha", "beta", "mindmotor/alpha/one.py:1", "from mindmotor.beta.two import thing"),
        ("beta", "alpha", "mindmotor/beta/two.py:5", "from ..alpha import one"),
        ("gamma", "beta", "mindmotor/gamma/three.py:2", "from mindmotor import beta"),
        ("gamma", "mindmotor", "mindmotor/gamma/three.py:4", "from mindmotor import LLM"),     # the root's facade
    }
    assert cycles(graph(edges)) == [["alpha", "beta"]]
    assert "mindmotor/beta/two.py:5: from ..alpha import one" in cycle_report(edges)
    assert [e.target for e in disallowed(edges)] == ["beta", "alpha", "beta", "mindmotor"]   # none is in ALLOWED
