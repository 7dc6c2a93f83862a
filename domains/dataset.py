"""Moved to ``domains.math.dataset``; this path still resolves for one release and will then be removed (see CHANGELOG.md)."""
from domains.math.dataset import *  # noqa: F401,F403
