"""Find domains by name: entry points of the group ``palestra.domains``, members of a domain family
(group ``palestra.domain_families``: ``<prefix>_<member>``), or ``module.path:OBJECT``.

Entry points are loaded lazily, one at a time, so a broken third-party plugin only fails when it is
asked for — and then the error names the plugin and the original exception. A family is loaded only
when a name with its prefix is asked for, or when every name is listed.

A domain list may hold shell-style patterns (``rg_*``, ``rg_*sum*``) that select every matching
registered domain; ``domain_options`` keys may be patterns too, giving options to every match (an
exact name's options are applied last, so they win).
"""
from __future__ import annotations

import difflib
import fnmatch
import importlib
from importlib.metadata import entry_points
from typing import Any

from pydantic import ValidationError

from domains.api import Domain, DomainFamily, one_line
from domains.config import describe_error

GROUP = "palestra.domains"
FAMILY_GROUP = "palestra.domain_families"
PATTERN_CHARS = frozenset("*?[")


class DomainError(ValueError):
    """A domain name that cannot be resolved, or a plugin that is broken."""


def _entry_points(group: str = GROUP) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for ep in entry_points(group=group):
        if ep.name in found and found[ep.name].value != ep.value:
            raise DomainError(
                f"domain {ep.name!r} is registered twice: {found[ep.name].value} and {ep.value}"
            )
        found[ep.name] = ep
    return found


def is_pattern(name: str) -> bool:
    return bool(PATTERN_CHARS & set(name))


# -- families ---------------------------------------------------------------------------------------
def _load_family(prefix: str, ep: Any) -> DomainFamily:
    try:
        family = ep.load()
    except Exception as exc:
        raise DomainError(
            f"domain family {prefix!r} ({ep.value}) failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(family, DomainFamily):
        raise DomainError(f"domain family {prefix!r} ({ep.value}) is a {type(family).__name__}, not a DomainFamily")
    return family


def _family_of(name: str) -> tuple[str, Any] | None:
    """The (prefix, entry point) of the family whose prefix starts ``name``; the longest wins."""
    owners = [(p, ep) for p, ep in _entry_points(FAMILY_GROUP).items() if name.startswith(f"{p}_")]
    return max(owners, key=lambda owner: len(owner[0])) if owners else None


def _members(prefix: str, family: DomainFamily) -> list[str]:
    try:
        return [f"{prefix}_{member}" for member in family.members()]
    except Exception as exc:
        raise DomainError(f"domain family {prefix!r} cannot list its domains: {type(exc).__name__}: {exc}") from exc


def _family_names() -> list[str]:
    """Every family member; a family that cannot be loaded appears as ``<prefix>_*`` so that asking
    for it (``palestra domains`` does) reports its error instead of hiding it."""
    names = []
    for prefix, ep in _entry_points(FAMILY_GROUP).items():
        try:
            names += _members(prefix, _load_family(prefix, ep))
        except DomainError:
            names.append(f"{prefix}_*")
    return names


def _resolve_member(name: str, prefix: str, ep: Any) -> Domain:
    family = _load_family(prefix, ep)
    members = _members(prefix, family)
    if name not in members:
        if not members and family.missing():
            raise DomainError(f"domain {name!r}: {family.missing()}")
        raise DomainError(f"unknown domain {name!r}{_did_you_mean(name, members)}")
    member = name[len(prefix) + 1:]
    try:
        domain = family.domain(member)
    except Exception as exc:
        raise DomainError(f"domain {name!r} failed to load: {type(exc).__name__}: {exc}") from exc
    domain = _check(domain, f"domain family {prefix!r} member {member!r}")
    if domain.name != name:
        raise DomainError(f"domain family {prefix!r} returned {domain.name!r} for {name!r}")
    return domain


# -- names ------------------------------------------------------------------------------------------
def available() -> list[str]:
    """Names of all registered domains (plain entry points are not imported; families are)."""
    return sorted(set(_entry_points()) | set(_family_names()))


def _did_you_mean(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=3)
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


def expand(names: list[str]) -> list[str]:
    """The domain list with every pattern replaced by the registered names it matches (sorted);
    a name already selected is not selected again by a later pattern."""
    if not any(is_pattern(n) for n in names):
        return list(names)
    registered = available()
    out: list[str] = []
    for name in names:
        if not is_pattern(name):
            out.append(name)
            continue
        matches = [n for n in registered if fnmatch.fnmatchcase(n, name)]
        if not matches:
            raise DomainError(f"domain pattern {name!r} matches no registered domain{_pattern_hint(name)}")
        out += [m for m in matches if m not in out]
    return out


def _pattern_hint(pattern: str) -> str:
    owner = _family_of(pattern)
    if owner is not None:
        try:
            reason = _load_family(*owner).missing()
        except DomainError as exc:
            return f" ({exc})"
        if reason:
            return f" ({reason})"
    return " (see `palestra domains`)"


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
    if name in eps:
        try:
            obj = eps[name].load()
        except Exception as exc:
            raise DomainError(
                f"domain plugin {name!r} ({eps[name].value}) failed to import: {type(exc).__name__}: {exc}"
            ) from exc
        return _check(obj, f"entry point {name!r} ({eps[name].value})")
    owner = _family_of(name)
    if owner is not None:
        return _resolve_member(name, *owner)
    families = [f"{p}_* (see `palestra domains`)" for p in _entry_points(FAMILY_GROUP)]
    raise DomainError(f"unknown domain {name!r}{_did_you_mean(name, available())} "
                      f"(known: {', '.join(sorted(eps) + families)})")


def configure(domain: Domain, options: dict[str, Any] | None) -> Domain:
    try:
        return domain.configure(options)
    except Exception as exc:
        raise DomainError(f"domain {domain.name!r}: invalid options: {_option_error(exc)}") from exc


def _options_for(name: str, options: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """Merged options of one domain: matching pattern keys in order, then its exact key."""
    keys = [k for k in options if is_pattern(k) and fnmatch.fnmatchcase(name, k)]
    keys += [name] if name in options else []
    merged: dict[str, Any] = {}
    for key in keys:
        merged.update(options[key] or {})
    return merged, keys


def load_all(names: list[str], options: dict[str, dict[str, Any]] | None = None,
             shared: dict[str, Any] | None = None) -> dict[str, Domain]:
    """Load several domains (patterns expanded); ``options`` is keyed by domain name or pattern,
    ``shared`` options go to every domain (its own options win). Duplicates are an error."""
    options = options or {}
    loaded: dict[str, Domain] = {}
    used: set[str] = set()
    for name in expand(names):
        domain = _resolve(name)
        merged, keys = _options_for(domain.name, options)
        merged = {**(shared or {}), **merged}
        used.update(keys)
        # a domain's options may rename it (e.g. a dataset domain), so key by the configured name
        configured = configure(domain, merged or None)
        if configured.name in loaded:
            raise DomainError(f"domain {configured.name!r} is selected twice")
        loaded[configured.name] = configured
    unused = set(options) - used
    if unused:
        raise DomainError(f"options given for domains that are not selected: {', '.join(sorted(unused))}")
    return loaded


def _option_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):  # "key: message", not pydantic's multi-line report
        return describe_error(exc, top="options")
    return one_line(exc)
