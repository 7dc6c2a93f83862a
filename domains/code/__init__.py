"""Code domains: the hidden-test verifier (``verifier``), how a completion becomes a program and
outputs are compared (``program``), the procedural generators (``generated``) and the JSONL-backed
dataset domain (``dataset``).

This package also stands where the module ``domains.code`` stood (now ``domains.code.verifier`` and
``domains.code.program``): it re-exports their names for one release, after which they will be
removed from here (see CHANGELOG.md). Import from the submodules.
"""
from domains.code.program import *  # noqa: F401,F403
from domains.code.verifier import *  # noqa: F401,F403
