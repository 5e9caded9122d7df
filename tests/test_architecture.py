"""The package structure, checked from the code's own imports (``ast``), not from a list of files.

- Packages import only downward, in the layers of ``docs/architecture.md``; two packages on one
  level never import each other both ways.
- No module circle inside a package, unless one of its imports carries a ``# circle:`` comment
  saying why.
- Every public class name is defined once in ``src/kvstack``.
- ``docs/structure.md`` names every module, and only modules that exist.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "kvstack"

# Bottom first. A top-level module (kvstack/x.py) or package (kvstack/x/) is one unit.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "errors",
        "section",
        "metrics",
        "log",
        "procs",
        "registry",
        "extras",
        "security",
        "redact",
        "output",
    ),
    ("kv",),
    ("cluster", "index", "models"),
    ("sim", "lora", "integrations", "deploy"),
    ("router",),
    ("stack",),
    ("bench",),
    ("cli", "config", "config_cli", "__main__", "__init__"),
)
LEVEL = {unit: level for level, units in enumerate(LAYERS) for unit in units}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported module, dotted
    line: int
    excused: bool  # the import line says why a circle is needed


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _targets(module: str, path: Path, node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, *([node.module] if node.module else [])])
        yield base
        yield from (f"{base}.{alias.name}" for alias in node.names)


def edges() -> list[Edge]:
    found: list[Edge] = []
    for module, path in MODULES.items():
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            for target in _targets(module, path, node):
                if target in MODULES and target != module:
                    excused = "# circle:" in lines[node.lineno - 1]
                    found.append(Edge(module, target, node.lineno, excused))
    return found


EDGES = edges()


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(m) for m in MODULES}
    assert units <= set(LEVEL), (
        f"add these to LAYERS and docs/architecture.md: {units - set(LEVEL)}"
    )


def test_packages_import_only_downward() -> None:
    wrong = [
        f"{e.source} -> {e.target} (line {e.line})"
        for e in EDGES
        if LEVEL[unit_of(e.target)] > LEVEL[unit_of(e.source)]
    ]
    assert not wrong, "imports that run up the layers:\n" + "\n".join(wrong)


def test_packages_on_one_level_never_import_each_other_both_ways() -> None:
    pairs: dict[tuple[str, str], list[str]] = defaultdict(list)
    for e in EDGES:
        a, b = unit_of(e.source), unit_of(e.target)
        if a != b and LEVEL[a] == LEVEL[b]:
            pairs[(a, b)].append(f"{e.source} -> {e.target}")
    both = [f"{a} <-> {b}: {pairs[(a, b)] + pairs[(b, a)]}" for a, b in pairs if (b, a) in pairs]
    assert not both, "\n".join(both)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
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
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_circle_without_a_reason() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for e in EDGES:
        if not e.excused:
            graph[e.source].add(e.target)
    circles = _circles(graph)
    assert not circles, "module circles (say why with a '# circle:' comment, or break them):\n" + (
        "\n".join(" <-> ".join(c) for c in circles)
    )


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_public_class_names_are_unique() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for module, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(module)
    twice = {name: mods for name, mods in where.items() if len(mods) > 1}
    assert not twice, f"class names defined more than once: {twice}"


def test_structure_doc_names_every_module_and_no_other() -> None:
    text = (ROOT / "docs" / "structure.md").read_text()
    listed = set(re.findall(r"^- `([\w/]+\.py)`", text, flags=re.M))
    present = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py")}
    assert not present - listed, f"docs/structure.md misses: {sorted(present - listed)}"
    assert not listed - present, (
        f"docs/structure.md names missing files: {sorted(listed - present)}"
    )
