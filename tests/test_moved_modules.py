"""The modules that moved into domains/verify/, domains/math/ and domains/code/ still resolve at their
old paths for one release (see CHANGELOG.md): every built-in ``module:OBJECT`` as the entry points
named it before the move is the very object at its new path, and every entry-point name still loads
through the registry. Nothing in the project itself may import through the old paths."""
from __future__ import annotations

import ast
import importlib
import json
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from domains import registry
from domains.api import Domain

ROOT = Path(__file__).resolve().parents[1]

# The entry points exactly as pyproject.toml declared them before the move.
OLD_ENTRY_POINTS = {
    "arithmetic": "domains.math_gen:ARITHMETIC",
    "linear_equations": "domains.math_gen:LINEAR_EQUATIONS",
    "fractions": "domains.math_gen:FRACTIONS",
    "code_dataset": "domains.code_dataset:CODE_DATASET",
    "code_functions": "domains.code_gen:CODE_FUNCTIONS",
    "code_lists": "domains.code_gen:CODE_LISTS",
    "math_dataset": "domains.dataset:MATH_DATASET",
    "tool_calculator": "domains.tools.builtin:TOOL_CALCULATOR",
    "tool_kv_store": "domains.tools.builtin:TOOL_KV_STORE",
    "tool_lookup": "domains.tools.builtin:TOOL_LOOKUP",
    "bfcl": "domains.tools.bfcl:BFCL",
}
OLD_FAMILIES = {"rg": "domains.reasoning_gym:FAMILY"}

# old module -> new module
MOVED = {
    "domains.math_gen": "domains.math.generated",
    "domains.math_answer": "domains.math.answer",
    "domains.math_work": "domains.math.work",
    "domains.dataset": "domains.math.dataset",
    "domains.code_gen": "domains.code.generated",
    "domains.code_dataset": "domains.code.dataset",
    "domains.pool": "domains.verify.pool",
    "domains.ray_pool": "domains.verify.ray_pool",
    "domains.backend": "domains.verify.backend",
    "domains.sandbox": "domains.verify.sandbox",
    "domains.sandbox_harness": "domains.verify.sandbox_harness",
}
# domains.code was a module; it is now the package whose submodules hold its names
CODE_SPLIT = ("domains.code.verifier", "domains.code.program")
# names whose old spelling differs, or that ``import *`` would skip: old "module:NAME" -> new "module:NAME"
RENAMED = {
    "domains.pool:QueuedPool": "domains.verify.pool:Pool",
    "domains.pool:_Job": "domains.verify.pool:Job",
    "domains.backend:Pool": "domains.verify.pool:Pool",
    "domains.backend:VerifierBackendUnavailable": "domains.verify.pool:VerifierBackendUnavailable",
    "domains.sandbox:_SELF_TEST": "domains.verify.sandbox:_SELF_TEST",
    "domains.math_gen:_parenthesised": "domains.math.generated:_parenthesised",
    "domains.math_gen:_mul_or_negative": "domains.math.generated:_mul_or_negative",
}


def _resolve(spec: str):
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def _current_entry_points(group: str) -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=group)}


@pytest.mark.parametrize("name", sorted(OLD_ENTRY_POINTS))
def test_an_old_entry_point_target_is_the_object_at_the_new_path(name):
    new = _current_entry_points(registry.GROUP)[name]
    assert _resolve(OLD_ENTRY_POINTS[name]) is _resolve(new)


def test_the_family_entry_point_is_unchanged():
    assert _current_entry_points(registry.FAMILY_GROUP) == OLD_FAMILIES


def test_installed_entry_points_name_no_old_module():
    """The metadata is fresh: every built-in entry point already names a new module."""
    for value in _current_entry_points(registry.GROUP).values():
        assert value.partition(":")[0] not in MOVED and value.partition(":")[0] != "domains.code", value


@pytest.mark.parametrize("name", sorted(OLD_ENTRY_POINTS))
def test_every_entry_point_name_still_loads_through_the_registry(name, tmp_path):
    options = {}
    if name == "math_dataset":  # the one built-in that needs a file
        path = tmp_path / "math.jsonl"
        path.write_text("\n".join(json.dumps({"id": f"q{i}", "prompt": f"{i}+{i}=", "answer": str(2 * i)})
                                  for i in range(8)) + "\n")
        options = {"path": str(path)}
    domain = registry.load(name, options)
    assert isinstance(domain, Domain) and domain.name == name
    assert type(domain) is type(_resolve(OLD_ENTRY_POINTS[name]))
    # by old import path, as a config may name it
    assert type(registry.load(OLD_ENTRY_POINTS[name], options)) is type(domain)


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_every_public_name_of_a_moved_module_resolves_at_its_old_path(old, new):
    if new.endswith("ray_pool"):
        pytest.importorskip("ray")
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    public = [n for n in vars(new_module) if not n.startswith("_")]
    assert public
    for name in public:
        assert getattr(old_module, name) is getattr(new_module, name), f"{old}:{name}"


def test_the_old_code_module_names_resolve_in_the_code_package():
    old = importlib.import_module("domains.code")
    for new in CODE_SPLIT:
        module = importlib.import_module(new)
        for name in (n for n in vars(module) if not n.startswith("_")):
            assert getattr(old, name) is getattr(module, name), f"domains.code:{name}"
    assert old.CodeDomain is _resolve("domains.code.verifier:CodeDomain")
    assert old.assemble is _resolve("domains.code.program:assemble")


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_renamed_and_private_names_resolve_at_their_old_paths(old, new):
    assert _resolve(old) is _resolve(new)


# -- nothing in the project goes through the old paths ------------------------------------------------
OLD_MODULES = set(MOVED) | {"domains.code"}
SHIMS = {ROOT / (m.replace(".", "/") + ".py") for m in MOVED}


def _project_files() -> list[Path]:
    files = []
    for folder in ("domains", "curriculum", "trainer", "tests", "bench", "scripts", "examples"):
        files += (ROOT / folder).rglob("*.py")
    return [f for f in files if f not in SHIMS and f != Path(__file__).resolve() and ".venv" not in f.parts]


def _imported_modules(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}  # from domains import math_gen
    return found


def test_no_project_module_imports_an_old_path():
    offenders = []
    for path in _project_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = _imported_modules(tree)
        for node in ast.walk(tree):  # also modules named in strings: subprocess code, import paths
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                imported |= {m for m in OLD_MODULES if f"import {m}" in node.value or f"{m}:" in node.value
                             or f"from {m} import" in node.value}
        # "domains.code" names a package now: importing it is fine, importing names from it is not
        bad = {m for m in imported & OLD_MODULES if m != "domains.code"}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "domains.code":
                bad.add("from domains.code import ...")
        offenders += [f"{path.relative_to(ROOT)}: {m}" for m in sorted(bad)]
    assert not offenders


def test_no_config_or_readme_names_an_old_module_path():
    texts = [ROOT / "README.md", ROOT / "pyproject.toml", *(ROOT / "conf").rglob("*.yaml"),
             *(ROOT / "examples").rglob("*.yaml")]
    offenders = []
    for path in texts:
        text = path.read_text(encoding="utf-8")
        offenders += [f"{path.relative_to(ROOT)}: {m}" for m in sorted(OLD_MODULES)
                      if f"{m}:" in text or f"{m} import" in text or f"{m.replace('.', '/')}.py" in text]
    assert not offenders
