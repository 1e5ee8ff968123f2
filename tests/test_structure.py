"""The package's shape, checked on the source: no import cycle between modules, no module over ~450 lines.

Issue 29's structure targets, kept from regressing. Every import that runs counts, also one inside a
function: a lazy import is still a dependency, and a cycle through one still means neither module can be
understood (or tested) without the other. Imports under `if TYPE_CHECKING:` do not count: they name a type
for an annotation (a protocol taking its config section), which never loads the module.
"""

from __future__ import annotations

import ast
from pathlib import Path

HONE = Path(__file__).resolve().parents[1] / "hone"

# Modules allowed past the size bound, each with why.
LONG_MODULES = {
    "hone/verifiers/sandbox.py": "one job (isolating model-written code), ~35 small functions",
}
MAX_LINES = 450


def module_name(path: Path, root: Path = HONE) -> str:
    parts = ["hone", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = HONE) -> dict[str, set[str]]:
    """module -> the `hone` modules it imports (a package import resolves to its `__init__`)."""
    paths = sorted(root.rglob("*.py"))
    modules = {module_name(p, root): p for p in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name.split(".") if is_package else name.split(".")[:-1]
        found: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = [node.module] if node.module else []
                base = (
                    ".".join([*package[: len(package) - node.level + 1], *module])
                    if node.level
                    else ".".join(module)
                )
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree` except those inside an `if TYPE_CHECKING:` block."""
    found: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_inside_the_package() -> None:
    assert cycles(import_graph()) == []


def test_no_module_over_the_size_bound() -> None:
    long = {
        f"hone/{p.relative_to(HONE).as_posix()}": n
        for p in HONE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert {k: v for k, v in long.items() if k not in LONG_MODULES} == {}


def test_a_cycle_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from hone import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from hone.a import x\n")
    (tmp_path / "c.py").write_text("import hone.a\n")
    annotation_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hone import e\n"
    (tmp_path / "d.py").write_text(annotation_only)
    (tmp_path / "e.py").write_text("from hone import d\n")
    assert cycles(import_graph(tmp_path)) == [["hone.a", "hone.b"]]
