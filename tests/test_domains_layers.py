"""The layering of ``domains/``, checked on the source: imports between its modules run one way (no
cycle, counting imports inside functions), no module imports another's private names, and
``domains`` never imports ``curriculum`` or ``trainer`` (dependencies run domains <- curriculum <-
trainer). The re-export modules at the old paths (see test_moved_modules.py) are left out: they
import the modules that replaced them and nothing imports them."""
from __future__ import annotations

import ast
from pathlib import Path

DOMAINS = Path(__file__).resolve().parents[1] / "domains"
SHIMS = {"domains.math_gen", "domains.math_answer", "domains.math_work", "domains.dataset", "domains.code_gen",
         "domains.code_dataset", "domains.pool", "domains.ray_pool", "domains.backend", "domains.sandbox",
         "domains.sandbox_harness"}
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    out = {}
    for path in DOMAINS.rglob("*.py"):
        parts = path.relative_to(DOMAINS.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name not in SHIMS:
            out[name] = path
    return out


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for every import statement, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for module, names in _imports(path):
            edges |= {m for m in [module, *(f"{module}.{n}" for n in names)] if m in modules and m != name}
        # importing a submodule runs its packages' __init__ first
        graph[name] = edges | {p for e in edges for p in _parents(e) if p in modules and p != name
                               and not name.startswith(p + ".")}
    return graph


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def test_imports_between_domain_modules_have_no_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [node, nxt]) if nxt in stack else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, stack + [node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles


def test_the_ray_pool_and_the_backend_import_one_way():
    graph = _graph()
    assert "domains.verify.pool" in graph["domains.verify.ray_pool"]
    assert "domains.verify.backend" not in graph["domains.verify.ray_pool"]
    assert not graph["domains.verify.pool"] & {"domains.verify.backend", "domains.verify.ray_pool"}


def test_no_domain_module_imports_another_modules_private_names():
    offenders = []
    for name, path in _modules().items():
        for module, names in _imports(path):
            if module.startswith("domains"):
                offenders += [f"{name}: from {module} import {n}" for n in names if n.startswith("_")]
    assert not offenders


def test_domains_import_neither_curriculum_nor_trainer():
    offenders = [f"{name}: {module}" for name, path in _modules().items() for module, _ in _imports(path)
                 if module.split(".")[0] in ("curriculum", "trainer")]
    assert not offenders


def test_no_domain_module_is_longer_than_500_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long
