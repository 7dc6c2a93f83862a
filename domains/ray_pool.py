"""Moved to ``domains.verify.ray_pool``; this path still resolves for one release and will then be removed (see CHANGELOG.md)."""
from domains.verify.ray_pool import *  # noqa: F401,F403
