"""Architecture of domains/, curriculum/ and trainer/: no import cycle, layers (domains below
curriculum below trainer), modules of at most 500 lines, functions of at most 60.

The checks are the ones ``python scripts/architecture.py`` prints; the last tests feed them a
small made-up tree to show that each one can fail.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "architecture.py"
_spec = importlib.util.spec_from_file_location("palestra_architecture", _SCRIPT)
arch = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = arch  # dataclasses look their module up while the class is built
_spec.loader.exec_module(arch)


@pytest.fixture(scope="module")
def modules():
    return arch.load_modules()


@pytest.fixture(scope="module")
def edges(modules):
    return arch.import_edges(modules)


def _report(violations: list[str]) -> str:
    return "\n".join(violations)


def test_the_import_graph_has_no_cycle(edges):
    violations = arch.check_cycles(edges)
    assert not violations, _report(violations)


def test_domains_import_no_curriculum_or_trainer_and_curriculum_no_trainer(edges):
    violations = arch.check_layers(edges)
    assert not violations, _report(violations)


def test_no_module_is_over_500_lines(modules):
    violations = arch.check_module_lines(modules)
    assert not violations, _report(violations)


def test_no_function_is_over_60_lines(modules):
    violations = arch.check_function_lines(modules)
    assert not violations, _report(violations)


# -- the checker itself ---------------------------------------------------------------------------
def test_find_cycle_returns_one_cycle_as_a_closed_path():
    assert arch.find_cycle({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) is None
    cycle = arch.find_cycle({"a": {"b"}, "b": {"c", "x"}, "c": {"a"}, "d": {"a"}})
    assert cycle[0] == cycle[-1] and sorted(cycle[:-1]) == ["a", "b", "c"]
    assert all(b in {"a": {"b"}, "b": {"c"}, "c": {"a"}}[a] for a, b in zip(cycle, cycle[1:]))


def test_check_layers_names_only_the_forbidden_edges():
    edges = [arch.Edge("domains.x", "curriculum.y", 3), arch.Edge("curriculum.y", "domains.x", 1),
             arch.Edge("trainer.t", "curriculum.y", 2), arch.Edge("curriculum.y", "trainer.t", 9)]
    assert arch.check_layers(edges) == ["domains must not import curriculum: domains.x -> curriculum.y (line 3)",
                                        "curriculum must not import trainer: curriculum.y -> trainer.t (line 9)"]


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _function(name: str, own_lines: int, nested_lines: int = 0, indent: str = "") -> str:
    """A function whose own length is ``own_lines``, holding one nested function of ``nested_lines``."""
    body = [f"{indent}    x = {k}" for k in range(own_lines - 2)]
    nested = _function("inner", nested_lines, indent=indent + "    ").splitlines() if nested_lines else []
    return "\n".join([f"{indent}def {name}():", *nested, *body, f"{indent}    return x"]) + "\n"


def test_each_check_fails_on_a_made_up_tree(tmp_path):
    _write(tmp_path, {
        "domains/__init__.py": "",
        "domains/a.py": "def load():\n    from curriculum.b import thing  # inside a function: still an edge\n",
        "curriculum/__init__.py": "",
        "curriculum/b.py": "from . import c\nthing = 1\n",  # -> curriculum.c (a module)
        "curriculum/c.py": "from .sub import d\n",  # -> curriculum.sub.d
        "curriculum/sub/__init__.py": "from ..b import thing\n",  # -> curriculum.b (thing is a name)
        "curriculum/sub/d.py": "import curriculum.b\nimport numpy\n",  # closes b -> c -> sub.d -> b
        "trainer/__init__.py": "",
        "trainer/long.py": _function("too_long", 61, nested_lines=10) + _function("fits", 60, nested_lines=30),
        "trainer/big.py": "x = 1\n" * 501,
    })
    modules = arch.load_modules(tmp_path)
    edges = {(e.source, e.target) for e in arch.import_edges(modules)}
    assert edges == {("domains.a", "curriculum.b"), ("curriculum.b", "curriculum.c"),
                     ("curriculum.c", "curriculum.sub.d"), ("curriculum.sub", "curriculum.b"),
                     ("curriculum.sub.d", "curriculum.b")}
    results = arch.run_checks(tmp_path)
    assert results == {
        "import cycles": ["import cycle: curriculum.b -> curriculum.c -> curriculum.sub.d -> curriculum.b "
                          "(curriculum.b line 1, curriculum.c line 1, curriculum.sub.d line 1)"],
        "layers": ["domains must not import curriculum: domains.a -> curriculum.b (line 2)"],
        "modules over 500 lines": ["trainer/big.py: 501 lines (limit 500)"],
        "functions over 60 lines": ["trainer/long.py:1 too_long: 61 lines (limit 60)"],
    }
    assert arch.main(["--root", str(tmp_path)]) == 1


def test_a_tree_that_keeps_the_rules_passes(tmp_path, capsys):
    _write(tmp_path, {"domains/__init__.py": "", "curriculum/__init__.py": "from domains import api\n",
                      "domains/api.py": "", "trainer/__init__.py": "import curriculum\n" + _function("f", 60)})
    assert not any(arch.run_checks(tmp_path).values())
    assert arch.main(["--root", str(tmp_path)]) == 0
    assert "import cycles: ok" in capsys.readouterr().out
