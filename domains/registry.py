"""Find domains by name: entry points of the group ``palestra.domains`` or ``module.path:OBJECT``.

Entry points are loaded lazily, one at a time, so a broken third-party plugin only fails when it is
asked for — and then the error names the plugin and the original exception.
"""
from __future__ import annotations

import difflib
import importlib
from importlib.metadata import entry_points
from typing import Any

from domains.api import Domain

GROUP = "palestra.domains"


class DomainError(ValueError):
    """A domain name that cannot be resolved, or a plugin that is broken."""


def _entry_points() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for ep in entry_points(group=GROUP):
        if ep.name in found and found[ep.name].value != ep.value:
            raise DomainError(
                f"domain {ep.name!r} is registered twice: {found[ep.name].value} and {ep.value}"
            )
        found[ep.name] = ep
    return found


def available() -> list[str]:
    """Names of all registered domains (without importing them)."""
    return sorted(_entry_points())


def _check(obj: Any, origin: str) -> Domain:
    if isinstance(obj, type) and issubclass(obj, Domain):
        obj = obj()
    if not isinstance(obj, Domain):
        raise DomainError(f"{origin} is a {type(obj).__name__}, not a palestra Domain")
    if not obj.name:
        raise DomainError(f"{origin} has no name")
    return obj


def _load_import_path(spec: str) -> Domain:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the plugin's own error, named
        raise DomainError(f"domain plugin {spec!r} failed to import: {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, attr):
        raise DomainError(f"module {module_name!r} has no attribute {attr!r}")
    return _check(getattr(module, attr), spec)


def load(name: str, options: dict[str, Any] | None = None) -> Domain:
    """Resolve a registered name or ``module:attr`` path to a configured Domain."""
    return configure(_resolve(name), options)


def _resolve(name: str) -> Domain:
    if ":" in name:
        return _load_import_path(name)
    eps = _entry_points()
    if name not in eps:
        close = difflib.get_close_matches(name, eps, n=3)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise DomainError(f"unknown domain {name!r}{hint} (known: {', '.join(sorted(eps))})")
    try:
        obj = eps[name].load()
    except Exception as exc:
        raise DomainError(
            f"domain plugin {name!r} ({eps[name].value}) failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    return _check(obj, f"entry point {name!r} ({eps[name].value})")


def configure(domain: Domain, options: dict[str, Any] | None) -> Domain:
    try:
        return domain.configure(options)
    except Exception as exc:
        raise DomainError(f"domain {domain.name!r}: invalid options: {_one_line(exc)}") from exc


def load_all(names: list[str], options: dict[str, dict[str, Any]] | None = None) -> dict[str, Domain]:
    """Load several domains; ``options`` is keyed by domain name. Duplicates are an error."""
    options = options or {}
    loaded: dict[str, Domain] = {}
    used: set[str] = set()
    for name in names:
        domain = _resolve(name)
        used.add(domain.name)
        # a domain's options may rename it (e.g. a dataset domain), so key by the configured name
        configured = configure(domain, options.get(domain.name))
        if configured.name in loaded:
            raise DomainError(f"domain {configured.name!r} is selected twice")
        loaded[configured.name] = configured
    unused = set(options) - used
    if unused:
        raise DomainError(f"options given for domains that are not selected: {', '.join(sorted(unused))}")
    return loaded


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
