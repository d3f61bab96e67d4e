"""No import circles among dlmpipe's modules (issues 41 and 42).

The imports are read from the source with ``ast``: every ``import`` / ``from ... import``
statement of a module, at module level **and inside functions** (a lazy import still ties the
two modules: whichever loads first, the pair is one unit), except those under ``if
TYPE_CHECKING:`` (never executed). ``from .x import name`` counts as importing the module ``x.name``
where that is a module, else ``x``. The implicit import of a module's parent packages is not
counted (every ``dlmpipe.a.b`` would otherwise import ``dlmpipe``, whose modules import ``a.b``).
A circle is a strongly connected component of more than one module; the test names each one
with the imports that close it.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "dlmpipe"

#: circles allowed: none (model.py <-> moe.py was the last: the config and the row-invariant
#: primitives moe.py reads now live in backbone_config.py and rowwise.py)
ALLOWED: list[set[str]] = []


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every import statement, skipping the bodies of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}

    def known(name: str) -> str | None:
        while name not in files and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in files else None

    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        targets = []
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets += [a.name for a in node.names]
                continue
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            targets += [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
        graph[mod] = {t for t in map(known, (t for t in targets if t.startswith("dlmpipe"))) if t} - {mod}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.add(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def test_the_finder_sees_a_circle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_holds_module_and_function_level_imports():
    graph = import_graph()
    assert "dlmpipe.backbones.model" in graph["dlmpipe.backbones.loading"]  # module level
    assert "dlmpipe.generate" in graph["dlmpipe.commands.jobs"]  # inside a function
    assert "dlmpipe.campaign" not in graph["dlmpipe.campaign.jobs"]  # TYPE_CHECKING only


def test_no_import_circles_among_dlmpipe_modules():
    graph = import_graph()
    left = [c for c in circles(graph) if c not in ALLOWED]
    described = ["; ".join(f"{m} imports {', '.join(sorted(graph[m] & c))}" for m in sorted(c))
                 for c in left]
    assert not left, "import circles:\n" + "\n".join(described)
