"""The project's strict pydantic base and its one-line validation errors.

Every configuration section — a domain's options, the verifier and sandbox sections, the curriculum,
the simulator and the trainer — derives from ``StrictModel``, so that a misspelt key fails instead
of being ignored, and every validation error reaches the user through ``describe_error``: one line,
``dotted.key: message``. They live here, in the lowest package, so that ``curriculum`` and
``trainer`` can use them without ``domains`` ever importing those.
"""
from __future__ import annotations

from collections.abc import Collection

from pydantic import BaseModel, ConfigDict, ValidationError


class StrictModel(BaseModel):
    """A config section that rejects unknown keys."""

    model_config = ConfigDict(extra="forbid")


def describe_error(exc: ValidationError, *, hide: Collection[str] = (), top: str = "config") -> str:
    """A validation error as one line: ``dotted.key: message`` (plus a count of the others).

    The key leaves out what pydantic adds to the path of a union member: a function validator's
    name (``function-after[...]``) and the member's tag, for the tag values in ``hide`` (say, the
    policy types, which would otherwise make ``policy.alpha`` read ``policy.uniform.alpha``). An
    error at the top level is named ``top``. Pydantic's "Value error, " prefix of our own checks is
    dropped."""
    errors = exc.errors()
    first = errors[0]
    key = ".".join(str(part) for part in first["loc"] if not _union_part(part, hide))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    message = first["msg"].removeprefix("Value error, ")
    return f"{key or top}: {message}{more}"


def _union_part(part: object, hide: Collection[str]) -> bool:
    return isinstance(part, str) and (part.startswith("function-") or part in hide)
