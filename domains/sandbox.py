"""Moved to ``domains.verify.sandbox`` (limits and command line: ``domains.verify.sandbox_limits``); this path still resolves for one release and will then be removed (see CHANGELOG.md)."""
from domains.verify.sandbox import *  # noqa: F401,F403
from domains.verify.sandbox import _SELF_TEST  # noqa: F401
