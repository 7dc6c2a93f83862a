"""Moved to ``domains.code.dataset``; this path still resolves for one release and will then be removed (see CHANGELOG.md)."""
from domains.code.dataset import *  # noqa: F401,F403
