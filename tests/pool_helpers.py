"""A test-only domain whose verifier misbehaves on request, for tests/test_pool.py.

It lives in its own module (not in the test file) because the pool's spawned workers unpickle the
domain by importing its module; the test adds this folder to ``sys.path`` before starting a pool.
The completion text picks the behaviour.
"""
from __future__ import annotations

import ctypes
import os
import random
import sys
import time

import numpy as np

from domains.api import Domain, Status, Task, VerifyResult, user_prompt


class UnrulyDomain(Domain):
    name = "unruly"
    levels = (1,)

    def sample(self, level: int, n: int, rng: random.Random) -> list[Task]:
        return [Task(self.name, level, user_prompt(f"task {rng.random()}"), {"answer": "ok"}) for _ in range(n)]

    def verify(self, task: Task, completion: str) -> VerifyResult:
        behaviour, _, argument = completion.partition(":")
        if behaviour == "ok":
            return VerifyResult(1.0, True, Status.OK, {"pid": os.getpid()})
        if behaviour == "wrong":
            return VerifyResult(0.0, False, Status.WRONG, {})
        if behaviour == "raise":
            raise ZeroDivisionError("the verifier divided by zero")
        if behaviour == "hang":
            while True:  # a verifier stuck in a loop; only the parent's deadline ends it
                time.sleep(0.01)
        if behaviour == "block":
            ctypes.PyDLL(None).sleep(3600)  # stuck in C holding the GIL: no Python code runs, no handler
        if behaviour == "numpy":
            return VerifyResult(np.float32(argument), True, Status.OK, {})  # a real number, not a float
        if behaviour == "nan":
            return VerifyResult(float(argument), True, Status.OK, {})  # nan, inf: a reward no mean survives
        if behaviour == "garbage":
            return {"reward": 1.0}  # type: ignore[return-value]  # not a VerifyResult
        if behaviour == "unsendable":
            return VerifyResult(1.0, True, Status.OK, {"callback": lambda: None})  # cannot be pickled
        if behaviour == "exit":
            os._exit(3)  # the worker process vanishes without a reply
        if behaviour == "sysexit":
            sys.exit(4)  # SystemExit is not an Exception: it escapes verify_guarded
        if behaviour == "sleep":
            time.sleep(float(argument))
            return VerifyResult(1.0, True, Status.OK, {"pid": os.getpid()})
        raise ValueError(f"unknown behaviour {behaviour!r}")


UNRULY = UnrulyDomain(verify_timeout_s=1.5)


class SlowStartDomain(Domain):
    """A verifier with a slow first call (a heavy import, say) unless warm_up() loaded it first."""

    name = "slow_start"
    levels = (1,)
    START_UP_S = 3.0

    def sample(self, level: int, n: int, rng: random.Random) -> list[Task]:
        return [Task(self.name, level, user_prompt(f"task {rng.random()}"), {}) for _ in range(n)]

    def warm_up(self) -> None:
        self._load()

    def verify(self, task: Task, completion: str) -> VerifyResult:
        self._load()
        return VerifyResult(1.0, True, Status.OK, {"pid": os.getpid()})

    def _load(self) -> None:
        if not getattr(self, "loaded", False):
            time.sleep(self.START_UP_S)
            self.loaded = True


SLOW_START = SlowStartDomain(verify_timeout_s=1.0)  # the deadline is shorter than the start-up


def task() -> Task:
    return UNRULY.sample(1, 1, random.Random(0))[0]


def wait_until_every_worker_is_up(pool, timeout_s: float = 60.0) -> None:
    """A worker replaced after a timeout starts in the background, which on a busy machine can
    outlast a 1.5 s deadline; a test that races one worker against another waits for both first."""
    def all_up() -> bool:
        workers = getattr(pool, "_workers", None) or pool._actors  # the local pool's or Ray's
        return all(worker.ready for worker in workers)

    deadline = time.monotonic() + timeout_s
    while not all_up():
        assert time.monotonic() < deadline, "a verifier worker never came up"
        time.sleep(0.05)


def _load_only_in(parent_pid: int) -> "UnrulyDomain":
    if os.getpid() != parent_pid:
        raise RuntimeError("this domain cannot be loaded in a worker process")
    return UNSTARTABLE


class UnstartableDomain(UnrulyDomain):
    """Unpickles only in the process that made it, so every verifier worker dies starting up."""

    name = "unstartable"

    def __reduce__(self):
        return _load_only_in, (os.getpid(),)


UNSTARTABLE = UnstartableDomain()
