"""The package order, enforced: every import in src/lowbit goes down the order, never up, and
no two files import each other (directly or around a loop).

    core -> models -> quant -> reference -> kernels -> perfmodel -> tune -> graph -> runtime
         -> serialize -> application (demo, report, tune_network, bench, the `lowbit` package
         itself)
         -> cli

A package imports only from itself and the packages before it. `lowbit.data` (workload files)
imports nothing and may be read by anyone. Imports are read with `ast` from every file: module
level and function-local ones, `TYPE_CHECKING` ones too, relative and absolute, `import lowbit.x`,
`from lowbit import x`, and `importlib.import_module("lowbit.x")` with a literal name.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "lowbit"
ORDER = ("core", "models", "quant", "reference", "kernels", "perfmodel", "tune", "graph",
         "runtime", "serialize", "application", "cli")
#: the application layer's top-level modules and packages (they may import everything but
#: the cli)
APPLICATION = ("demo", "report", "tune_network", "bench")
#: packages anyone may read (data files, no imports)
ANYONE = ("data",)


@dataclass(frozen=True)
class Edge:
    """`source` (a module) imports `target` (a module of lowbit) at `path`:`line`."""

    source: str
    target: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} -> {self.target}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> str | None:
    """The layer of a module of lowbit (None: readable by anyone)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "application"  # `src/lowbit/__init__.py`: the public facade over every package
    top = parts[1]
    if top in ANYONE:
        return None
    if top in APPLICATION:
        return "application"
    if top == "__main__":
        return "cli"
    assert top in ORDER, f"{module} belongs to no layer: add its package to ORDER"
    return top


def resolve(name: str) -> str | None:
    """The module file an imported name lives in: the longest prefix that is a module."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in MODULES:
            return ".".join(parts)
        parts.pop()
    return None


def imported_names(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, int]]:
    """(absolute dotted name, line) of everything `tree` imports from lowbit."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base.pop()
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # `from p import x`: the submodule p.x where there is one, else p itself
            out += [(f"{origin}.{a.name}" if f"{origin}.{a.name}" in MODULES else origin,
                     node.lineno) for a in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            out.append((node.args[0].value, node.lineno))
    return [(n, line) for n, line in out if n == "lowbit" or n.startswith("lowbit.")]


def edges() -> list[Edge]:
    out = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for name, line in imported_names(tree, module, path.name == "__init__.py"):
            target = resolve(name)
            assert target is not None, f"{path}:{line} imports {name}, which is no module"
            if target != module:
                out.append(Edge(module, target, str(path.relative_to(SRC.parent)), line))
    return sorted(set(out), key=lambda e: (e.path, e.line, e.target))


EDGES = edges()


def upward(edge: Edge) -> bool:
    a, b = layer(edge.source), layer(edge.target)
    return a is not None and b is not None and ORDER.index(b) > ORDER.index(a)


def cycles(edge_list: list[Edge], modules: list[str]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for e in edge_list:
        graph[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_walk_sees_every_kind_of_import():
    """The reader finds the import forms the layering relies on (so a pass means something)."""
    src = ("import lowbit.core.space\nfrom lowbit import models\nfrom .. import tune\n"
           "from ..perfmodel.roofline import x\n"
           "def f():\n    from ..tune.records import RecordsDB\n"
           "    importlib.import_module('lowbit.graph')\n")
    got = {n for n, _ in imported_names(ast.parse(src), "lowbit.runtime.compiled", False)}
    assert got == {"lowbit.core.space", "lowbit.models", "lowbit.tune",
                   "lowbit.perfmodel.roofline", "lowbit.tune.records", "lowbit.graph"}
    assert len(EDGES) > 500 and len(MODULES) > 150


def test_imports_go_down_the_order():
    bad = [str(e) for e in EDGES if upward(e)]
    assert not bad, ("imports up the package order " + " -> ".join(ORDER) + ":\n"
                     + "\n".join(bad))


def test_no_import_cycles():
    found = cycles(EDGES, list(MODULES))
    lines = []
    for comp in found:
        lines.append("cycle: " + ", ".join(comp))
        lines += [f"  {e}" for e in EDGES if e.source in comp and e.target in comp]
    assert not found, "import cycles between files:\n" + "\n".join(lines)


def test_the_cycle_finder_finds_cycles():
    fake = [Edge("lowbit.a", "lowbit.b", "a", 1), Edge("lowbit.b", "lowbit.c", "b", 1),
            Edge("lowbit.c", "lowbit.a", "c", 1), Edge("lowbit.c", "lowbit.d", "c", 2)]
    assert cycles(fake, ["lowbit.d", "lowbit.c", "lowbit.b", "lowbit.a"]) == [
        ["lowbit.a", "lowbit.b", "lowbit.c"]]
    assert upward(Edge("lowbit.kernels.x", "lowbit.tune.y", "x", 1))
    assert not upward(Edge("lowbit.tune.y", "lowbit.kernels.x", "y", 1))
    # an application package: above the runtime, below the cli
    assert upward(Edge("lowbit.runtime.gpu", "lowbit.bench.network", "gpu", 1))
    assert not upward(Edge("lowbit.bench.network", "lowbit.runtime.gpu", "network", 1))
    assert upward(Edge("lowbit.bench.recipes", "lowbit.cli", "recipes", 1))
