"""Moved to ``domains.verify.backend``; this path still resolves for one release and will then be removed (see CHANGELOG.md)."""
from domains.verify.backend import *  # noqa: F401,F403
from domains.verify.pool import VerifierBackendUnavailable  # noqa: F401  (now defined in domains.verify.pool)
