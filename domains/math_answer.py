"""Moved to ``domains.math.answer``; this path still resolves for one release and will then be removed (see CHANGELOG.md)."""
from domains.math.answer import *  # noqa: F401,F403
