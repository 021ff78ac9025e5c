"""The import rules of DESIGN.md, checked on the source with the standard library.

The graph is built from the text of every module of ``src/ensio`` (``ast``),
not by importing it: imports at any depth count (an import inside a function
is still a dependency, it is only paid later), the body of an
``if TYPE_CHECKING:`` block does not (it never runs), and relative imports
are resolved against the importing module. ``from pkg import name`` is an
edge to ``pkg.name`` when that is a module, else to ``pkg``.

Rules: (a) src/ensio has no import cycle; (b) io/'s rooms import only rooms
below them, in the order of :data:`IO_ROOMS`, plus the low packages of
:data:`IO_MAY_IMPORT`; (c) the analysis never imports io.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: io/'s rooms, lowest first: a room imports only the rooms before it (and itself).
IO_ROOMS = ("formats", "scan", "txn", "tiles", "node", "modes", "products")

#: What io/ may import outside io/: the packages below it (DESIGN.md: io imports
#: layout and parallel) and the standard-library-only helpers. ``ensio`` itself
#: is its ``__version__`` (written into products); ``faults`` is the
#: fault-injection points of the kill tests; ``locks`` every lock of ensio (shared
#: with workflow/, so it sits below both).
IO_MAY_IMPORT = (
    "ensio", "ensio.config", "ensio.layout", "ensio.parallel", "ensio.errors",
    "ensio.durable", "ensio.progress", "ensio.stopwatch", "ensio.jsonlines",
    "ensio.faults", "ensio.locks", "ensio.lazyexports",
)  # fmt: skip


def module_name(path: Path, root: Path) -> str:
    """``root/a/b/c.py`` -> ``a.b.c``; a package's ``__init__.py`` is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement at any depth, except under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(root: Path, top: str) -> dict[str, set[str]]:
    """Module -> the modules of package ``top`` it imports (see the module docstring)."""
    paths = {module_name(p, root): p for p in sorted((root / top).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_pkg = path.name == "__init__.py"
        package = name if is_pkg else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in paths else mod
                           for a in node.names]  # fmt: skip
            for t in targets:
                while t and t not in paths:  # ``import a.b.c`` of a non-module attribute
                    t = t.rpartition(".")[0]
                if t and t != name and (t == top or t.startswith(top + ".")):
                    deps.add(t)
        graph[name] = deps
    return graph


def find_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle (as a closed path) per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        # iterative Tarjan: (node, iterator over its successors)
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, succ = work[-1]
            for w in succ:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        components.append(sorted(comp))
    return [_closed_path(graph, set(c)) for c in components]


def _closed_path(graph: Mapping[str, set[str]], comp: set[str]) -> list[str]:
    """A cycle through the first module of a strongly connected component, for the message."""
    first = min(comp)
    prev: dict[str, str] = {}
    frontier = [first]
    while frontier:  # breadth-first inside the component, back to ``first``
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == first:
                    path = [v]
                    while path[-1] != first:
                        path.append(prev[path[-1]])
                    return [first, *reversed(path[:-1]), first] if v != first else [first, first]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"not a cycle: {sorted(comp)}")


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(SRC, "ensio")


def test_graph_sees_what_runs_and_not_what_does_not(tmp_path: Path) -> None:
    """The builder on a small package: function-level, relative imports count; TYPE_CHECKING not."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .b import B\n"
        "def f():\n    from .sub import c\n    return c\n"
    )
    (pkg / "b.py").write_text("from . import a\nimport pkg.sub.c as cc\nfrom .sub.c import X\n")
    (pkg / "sub" / "c.py").write_text("from .. import a\nfrom ..a import f\n")
    g = import_graph(tmp_path, "pkg")
    assert g["pkg.a"] == {"pkg.sub.c"}
    assert g["pkg.b"] == {"pkg.a", "pkg.sub.c"}
    assert g["pkg.sub.c"] == {"pkg.a"}
    assert find_cycles(g) == [["pkg.a", "pkg.sub.c", "pkg.a"]]
    assert find_cycles({"x": {"y"}, "y": {"z"}, "z": set()}) == []


def test_no_import_cycle_in_src(graph: dict[str, set[str]]) -> None:
    """An import circle works only by the order modules happen to load: none in src/ensio."""
    assert len(graph) > 100 and "ensio.io.modes.files" in graph  # the graph is the real one
    cycles = find_cycles(graph)
    assert not cycles, "import cycles in src/ensio: " + "; ".join(" -> ".join(c) for c in cycles)


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["ensio", "io"] else None


def test_io_is_rooms_only(graph: dict[str, set[str]]) -> None:
    """Every io module lives in one of the rooms; io/ itself holds only the public surface."""
    loose = [m for m in graph if m.startswith("ensio.io.") and _room(m) not in IO_ROOMS]
    assert not loose, f"io modules outside the rooms {IO_ROOMS}: {sorted(loose)}"
    for room in IO_ROOMS:
        assert f"ensio.io.{room}" in graph, f"io/{room}/ has no __init__.py"


def test_io_rooms_import_only_lower_rooms(graph: dict[str, set[str]]) -> None:
    bad = []
    for mod, deps in sorted(graph.items()):
        room = _room(mod)
        if room is None:
            continue
        rank = IO_ROOMS.index(room)
        for dep in sorted(deps):
            dep_room = _room(dep)
            if dep_room is not None:
                if IO_ROOMS.index(dep_room) > rank:
                    bad.append(f"{mod} (room {room}) imports {dep} (room {dep_room}, higher)")
            elif dep == "ensio.io":
                bad.append(f"{mod} imports ensio.io, the public surface for callers outside io")
            elif not any(dep == ok or dep.startswith(ok + ".") for ok in IO_MAY_IMPORT[1:]) and (
                dep != "ensio"
            ):
                bad.append(f"{mod} imports {dep}, above io (io may import {IO_MAY_IMPORT})")
    assert not bad, "\n".join(bad)


def test_analysis_never_imports_io(graph: dict[str, set[str]]) -> None:
    """DESIGN.md: the online mode and the Python API use the analysis without files."""
    bad = [f"{mod} imports {dep}" for mod, deps in sorted(graph.items())
           if mod == "ensio.analysis" or mod.startswith("ensio.analysis.")
           for dep in sorted(deps) if dep == "ensio.io" or dep.startswith("ensio.io.")]  # fmt: skip
    assert not bad, "\n".join(bad)
