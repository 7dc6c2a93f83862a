"""Architecture checks over the packages ``domains``, ``curriculum`` and ``trainer``.

    python scripts/architecture.py [--root DIR]

Prints one section per check and exits 1 when any of them finds a violation:

- imports: the module import graph has no cycle. Every ``import`` and ``from ... import``
  counts, inside functions and ``if TYPE_CHECKING:`` blocks too; relative imports are resolved,
  and ``from a.b import c`` is an edge to the module ``a.b.c`` when there is one, else to ``a.b``.
  Only edges between modules of the packages are kept;
- layers: ``domains`` imports neither ``curriculum`` nor ``trainer``, ``curriculum`` does not
  import ``trainer``;
- module size: no module is over 500 lines;
- function size: no function is over 60 lines, from its ``def`` line to its last line, less
  the lines of the functions defined inside it (which are counted on their own).

``tests/test_architecture.py`` runs the same functions, one test per check.
"""
from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("domains", "curriculum", "trainer")
# package -> the packages it must not import
FORBIDDEN = {"domains": ("curriculum", "trainer"), "curriculum": ("trainer",)}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


@dataclass
class Module:
    name: str  # dotted, e.g. "curriculum.store"; a package's __init__.py is the package's name
    path: str  # relative to the root, e.g. "curriculum/store.py"
    is_package: bool
    source: str

    @property
    def n_lines(self) -> int:
        return len(self.source.splitlines())

    def tree(self) -> ast.Module:
        return ast.parse(self.source, filename=self.path)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int  # of the first import of ``target`` in ``source``

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} (line {self.line})"


# -- reading the packages -------------------------------------------------------------------------
def load_modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Module]:
    """Every ``.py`` file under ``root/<package>`` for each package, by dotted module name."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            source = path.read_text(encoding="utf-8")
            modules[name] = Module(name, path.relative_to(root).as_posix(), is_package, source)
    return modules


def _imported(module: Module, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names one import statement may refer to, most specific first per name."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)] if node.level > 1 else package
        base = ".".join([*package, base] if base else package)
    return [f"{base}.{alias.name}" if base else alias.name for alias in node.names] + [base]


def _resolve(name: str, known: set[str]) -> str | None:
    """The longest prefix of ``name`` that is one of the modules, if any."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        candidate = ".".join(parts[:k])
        if candidate in known:
            return candidate
    return None


def import_edges(modules: dict[str, Module]) -> list[Edge]:
    """Edges between the modules: one per (importer, imported module), at its first line."""
    known = set(modules)
    found: dict[tuple[str, str], int] = {}
    for module in modules.values():
        for node in ast.walk(module.tree()):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = _imported(module, node)
            if isinstance(node, ast.ImportFrom):
                # from a.b import c: a.b.c where that is a module, else a.b (c is a name in it)
                base = names[-1]
                targets = {n if n in known else _resolve(base, known) for n in names[:-1]}
            else:
                targets = {_resolve(n, known) for n in names}
            for target in targets - {None, module.name}:
                key = (module.name, target)
                found[key] = min(found.get(key, node.lineno), node.lineno)
    return [Edge(s, t, line) for (s, t), line in sorted(found.items())]


# -- the checks: each returns its violations, one line each ---------------------------------------
def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path whose last node is its first, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph.get(start, ())))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def check_cycles(edges: list[Edge]) -> list[str]:
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
    cycle = find_cycle(graph)
    if not cycle:
        return []
    line = {(e.source, e.target): e.line for e in edges}
    where = ", ".join(f"{a} line {line[a, b]}" for a, b in zip(cycle, cycle[1:]))
    return [f"import cycle: {' -> '.join(cycle)} ({where})"]


def check_layers(edges: list[Edge], forbidden: dict[str, tuple[str, ...]] = FORBIDDEN) -> list[str]:
    top = lambda name: name.split(".")[0]  # noqa: E731
    return [f"{top(e.source)} must not import {top(e.target)}: {e}" for e in edges
            if top(e.target) in forbidden.get(top(e.source), ())]


def check_module_lines(modules: dict[str, Module], limit: int = MAX_MODULE_LINES) -> list[str]:
    return [f"{m.path}: {m.n_lines} lines (limit {limit})"
            for m in modules.values() if m.n_lines > limit]


def function_lengths(module: Module) -> list[tuple[str, int, int]]:
    """(qualified name, first line, own length) of every function of ``module``; a function's own
    length leaves out the lines of the functions defined inside it."""
    out = []

    def visit(node: ast.AST, prefix: str) -> list[ast.AST]:
        """Record the functions directly under ``node``; return them (to subtract their lines)."""
        inner = []
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                nested = visit(child, f"{name}.")
                own = child.end_lineno - child.lineno + 1 - sum(n.end_lineno - n.lineno + 1 for n in nested)
                out.append((name, child.lineno, own))
                inner.append(child)
            elif isinstance(child, ast.ClassDef):
                inner += visit(child, f"{prefix}{child.name}.")
            else:
                inner += visit(child, prefix)
        return inner

    visit(module.tree(), "")
    return out


def check_function_lines(modules: dict[str, Module], limit: int = MAX_FUNCTION_LINES) -> list[str]:
    return [f"{m.path}:{line} {name}: {length} lines (limit {limit})"
            for m in modules.values() for name, line, length in function_lengths(m) if length > limit]


def run_checks(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, list[str]]:
    modules = load_modules(root, packages)
    edges = import_edges(modules)
    return {"import cycles": check_cycles(edges), "layers": check_layers(edges),
            f"modules over {MAX_MODULE_LINES} lines": check_module_lines(modules),
            f"functions over {MAX_FUNCTION_LINES} lines": check_function_lines(modules)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root (default: this checkout)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    modules = load_modules(root)
    print(f"{len(modules)} modules, {len(import_edges(modules))} import edges in {', '.join(PACKAGES)}")
    results = run_checks(root)
    for check, violations in results.items():
        print(f"{check}: {'ok' if not violations else len(violations)}")
        for v in violations:
            print(f"  {v}")
    return 1 if any(results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
