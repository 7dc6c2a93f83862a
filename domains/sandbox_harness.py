"""Moved to ``domains.verify.sandbox_harness``; this path still resolves for one release and will then be removed (see CHANGELOG.md)."""
from domains.verify.sandbox_harness import *  # noqa: F401,F403
