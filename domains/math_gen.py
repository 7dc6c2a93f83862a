"""Moved to ``domains.math.generated``; this path still resolves for one release and will then be removed (see CHANGELOG.md)."""
from domains.math.generated import *  # noqa: F401,F403
from domains.math.generated import _mul_or_negative, _parenthesised  # noqa: F401
