"""Moved to ``domains.code.generated``; this path still resolves for one release and will then be removed (see CHANGELOG.md)."""
from domains.code.generated import *  # noqa: F401,F403
