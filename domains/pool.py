"""Moved to ``domains.verify.pool``; this path still resolves for one release and will then be removed (see CHANGELOG.md)."""
from domains.verify.pool import *  # noqa: F401,F403
from domains.verify.pool import Job as _Job  # noqa: F401  (renamed Job)
from domains.verify.pool import Pool as QueuedPool  # noqa: F401  (renamed Pool: the one pool contract)
