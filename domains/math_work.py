"""Moved to ``domains.math.work``; this path still resolves for one release and will then be removed (see CHANGELOG.md)."""
from domains.math.work import *  # noqa: F401,F403
