"""Keys as users type and store them: a typo on the command line, flat trainer keys from before the
groups (``trainer.lr`` for ``trainer.optim.lr``), and which settings a resumed run changed.

``trainer.config`` holds the schema; this module reads keys against it before and after validation.
"""
from __future__ import annotations

import difflib
import sys
from typing import Any, get_args

from pydantic import BaseModel

from trainer.config import (FLAT_KEYS, RETIRED_KEYS, TRAINER_GROUPS, ConfigError, PalestraConfig, flat_key_note,
                            regroup_trainer)


def drop_shadowed_flat_keys(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``raw`` without the flat trainer keys (from a conf file) whose grouped key the command line
    sets: what the user typed last wins, as it did before the groups."""
    trainer = raw.get("trainer")
    if not isinstance(trainer, dict):
        return raw
    typed = set()
    for arg in overrides:
        parts = arg.split("=", 1)[0].lstrip("+~").split(".")
        if len(parts) == 3 and parts[0] == "trainer" and parts[1] in TRAINER_GROUPS:
            typed.add(parts[2])
    return {**raw, "trainer": {k: v for k, v in trainer.items() if not (k in FLAT_KEYS and k in typed)}}


def as_stored_now(config: dict[str, Any]) -> dict[str, Any]:
    """A run's stored config with its trainer section in today's groups, so that a resume of a run
    stored before them names only the settings that really changed."""
    if not isinstance(config.get("trainer"), dict):
        return config
    return {**config, "trainer": regroup_trainer(config["trainer"])}


def regroup_overrides(args: list[str]) -> list[str]:
    """Command-line overrides with flat trainer keys (``trainer.lr=2e-4``) renamed to their group's
    (``trainer.optim.lr=2e-4``), each with a one-line note; everything else as given."""
    out = []
    for arg in args:
        key, sep, value = arg.partition("=")
        prefix = key[:len(key) - len(key.lstrip("+~"))]  # +, ++ or ~ stay as they were
        parts = key[len(prefix):].split(".")
        if len(parts) == 2 and parts[0] == "trainer" and parts[1] in FLAT_KEYS.keys() | RETIRED_KEYS:
            print(f"note: {flat_key_note(parts[1])}", file=sys.stderr)
            if parts[1] in RETIRED_KEYS:
                continue
            arg = f"{prefix}trainer.{FLAT_KEYS[parts[1]]}.{parts[1]}{sep}{value}"
        out.append(arg)
    return out


def check_override_keys(args: list[str], groups: set[str]) -> None:
    """Fail in one line on a ``key=value`` override whose key no config has (a typo), before Hydra
    would: Hydra's message spans five lines and suggests ``+key=value``, which validation then
    rejects. Prefixed overrides (``+``, ``++``, ``~``), flags and ``hydra.*`` are left to Hydra, and
    so is a key that some variant of a group has (``policy.alpha`` with another policy chosen).
    ``hydra/launcher=…`` and other ``hydra/`` groups choose Hydra's plugins."""
    for arg in args:
        key = arg.split("=", 1)[0]
        if "=" not in arg or key[:1] in "+~-" or key.split(".")[0] == "hydra" or key.startswith("hydra/"):
            continue
        unknown = _unknown_part(key.split("."), groups)
        if unknown is not None:
            known, options = unknown
            near = difflib.get_close_matches(key.split(".")[len(known)], options, n=1)
            hint = f" (did you mean {'.'.join([*known, near[0]])}?)" if near else ""
            raise ConfigError(f"{key}: no such setting{hint}")


def _unknown_part(parts: list[str], groups: set[str]) -> tuple[list[str], list[str]] | None:
    """(the known prefix, the names allowed after it) where ``parts`` leaves the schema; else None."""
    models: list[type[BaseModel]] = [PalestraConfig]
    for depth, part in enumerate(parts):
        names = sorted({name for m in models for name in m.model_fields} | (groups if depth == 0 else set()))
        if part not in names:
            return parts[:depth], names
        models = [sub for m in models if part in m.model_fields for sub in _models_in(m.model_fields[part].annotation)]
        if not models:  # a value, a dict or a config group's choice: anything below is the value's
            return None
    return None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field may hold (one, or each variant of a union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


# where a launch writes and what it resumes from: they belong to one launch, not to the run's settings
LAUNCH_KEYS = {"output_dir", "resume"}
_ABSENT = object()  # a setting one of two configs lacks (added by an upgrade, say)


def changed_settings(before: dict[str, Any], after: dict[str, Any], prefix: str = "") -> list[str]:
    """``key: old -> new`` for every setting that differs between two dumped configs, nested keys
    dotted (``trainer.optim.mu: 1 -> 2``). A resumed run goes on under the settings it is launched with,
    which need not be the ones it started with; this says which ones moved."""
    changes = []
    for key in sorted((before.keys() | after.keys()) - (LAUNCH_KEYS if not prefix else set())):
        old, new = before.get(key, _ABSENT), after.get(key, _ABSENT)
        if all(isinstance(v, dict) or v is _ABSENT for v in (old, new)):  # a section: name its settings
            changes += changed_settings(*(v if isinstance(v, dict) else {} for v in (old, new)), f"{prefix}{key}.")
        elif old != new:
            changes.append(f"{prefix}{key}: {_shown(old)} -> {_shown(new)}")
    return changes


def _shown(value: Any) -> str:
    return "(absent)" if value is _ABSENT else repr(value)
