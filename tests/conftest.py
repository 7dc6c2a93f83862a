"""Test options: slow tests run only with --runslow (or -m slow); --without-system-deps (make test
SYSTEM_DEPS=skip) skips the tests that need bubblewrap when it is not installed, saying why."""
import shutil

import pytest


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="also run tests marked slow")
    parser.addoption("--without-system-deps", action="store_true", default=False,
                     help="skip the tests marked sandbox when bubblewrap is not installed, instead of failing them")


def pytest_collection_modifyitems(config, items):
    skips = []
    if config.getoption("--without-system-deps") and shutil.which("bwrap") is None:
        skips.append(("sandbox", pytest.mark.skip(
            reason="needs bubblewrap, the code sandbox, which is not installed (make test SYSTEM_DEPS=skip)")))
    if not (config.getoption("--runslow") or "slow" in (config.getoption("-m") or "")):
        skips.append(("slow", pytest.mark.skip(reason="slow: run with --runslow")))
    for item in items:
        for keyword, skip in skips:
            if keyword in item.keywords:
                item.add_marker(skip)
