"""Verifier workers as Ray actors: the ``domains.verify.pool.Pool`` contract on a Ray cluster.

The pool keeps ``workers`` actors, each holding the run's domains, and runs one call at a time on
each, like the local pool runs one per process; a thread in the driver hands out queued calls and
enforces each call's wall-clock deadline. Whatever happens, a call resolves to a Verdict — never an
exception into the trainer — and ``timeouts``, ``restarts``, ``start_failures`` and ``broken`` count
what they count in the local pool.

Why actors and not Ray tasks: a deadline must start when a worker starts the call, not when Ray gets
round to scheduling it, so the pool must know which call runs where. And why ``ray.kill``: Ray
cannot interrupt a running actor method (``ray.cancel`` only sets a flag there), while ``ray.kill``
ends the actor's process from Ray's own C++ side — it works even when a verifier is stuck in C code
holding the GIL (measured here: the process was gone 0.1 s later). An overrunning actor is killed and
replaced, so a hung sympy call or sandbox costs one actor start, as in the local pool.

Where it departs from the local pool:

* Domains travel as one pickled blob put into Ray's object store once, and each actor unpickles it
  itself after adding the driver's ``sys.path`` — so a domain named by import path from a local
  folder resolves on a local Ray as it does in the local pool's spawned workers. On a remote cluster
  the domains' modules (and palestra itself) must be installed on the nodes.
* Results come back pickled by the actor with the standard pickle, as through the local pool's pipe:
  a result that pickle cannot send (say, a lambda in ``details``) is an error in both pools, though
  Ray's cloudpickle could have shipped it.
* Ray may not place an actor at all (a cluster with too few CPUs). If no actor has been up for
  ``start_timeout_s`` while the pool exists, the pool is marked broken and every call gets an error,
  instead of the run hanging on futures that never resolve.
"""
from __future__ import annotations

import logging
import math
import os
import pickle
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

import ray
import ray.cloudpickle
from ray.exceptions import RayActorError

from domains.api import Domain, Task, VerifyResult
from domains.verify.pool import (Job, Pool, Verdict, VerifierBackendUnavailable, resolve_once, timed_out, verify_guarded,
                                 warm_up)

log = logging.getLogger(__name__)

POLL_S = 0.02  # how long a queued call can wait for the dispatcher while other calls are in flight


class VerifierWorker:
    """Runs in a Ray worker process: holds the domains and verifies one call at a time."""

    def __init__(self, driver_path: list[str], domains_blob: bytes) -> None:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        # compiling model-written code emits SyntaxWarnings by the hundred; the verdict says enough
        warnings.simplefilter("ignore", SyntaxWarning)
        # Bytes, not objects, so that these paths are in place before the domains' modules import.
        sys.path.extend(p for p in driver_path if p not in sys.path)
        self.domains: dict[str, Domain] = pickle.loads(domains_blob)
        warm_up(self.domains)  # ready() answers after this, and deadlines start then

    def ready(self) -> int:
        return os.getpid()

    def verify(self, domain_name: str, task: Task, completion: str) -> bytes:
        start = time.perf_counter()
        result = verify_guarded(self.domains[domain_name], task, completion)
        latency = time.perf_counter() - start
        try:
            return pickle.dumps((result, latency))
        except Exception as exc:  # e.g. unpicklable details
            return pickle.dumps((VerifyResult.no_verdict(f"result not sendable: {exc}"), 0.0))


# max_restarts=0: a dead actor is replaced by the pool (and counted), never revived behind its back.
_RemoteWorker = ray.remote(max_restarts=0, max_task_retries=0)(VerifierWorker)


@dataclass
class _Actor:
    handle: Any
    pending: Any  # ObjectRef of ready() until the actor is up, then of the running verify() call
    ready: bool = False
    job: Job | None = None
    started: float = 0.0
    deadline: float = math.inf


class _RaySession:
    """One Ray connection per process, shared by the pools in it. Whoever called ``ray.init`` for
    the pools calls ``ray.shutdown`` when the last of them closes: for a local Ray that stops it, for
    a cluster given by address it only disconnects — the cluster keeps running. A Ray the caller
    initialised before making a pool is theirs, and left alone."""

    lock = threading.Lock()
    users = 0
    started_here = False

    @classmethod
    def join(cls, address: str | None, num_cpus: int) -> None:
        with cls.lock:
            if cls.users == 0 and not ray.is_initialized():
                cls._init(address, num_cpus)
                cls.started_here = True
            elif cls.users == 0 and address is not None:
                log.warning("Ray is already initialised in this process; verifier.ray_address is not used")
            cls.users += 1

    @classmethod
    def leave(cls) -> None:
        with cls.lock:
            cls.users -= 1
            if cls.users == 0 and cls.started_here:
                cls.started_here = False
                ray.shutdown()

    @staticmethod
    def _init(address: str | None, num_cpus: int) -> None:
        # log_to_driver=False: what the actors print (sandbox noise, Ray's per-worker notices)
        # stays in Ray's log files (/tmp/ray/session_latest/logs) instead of cutting through the
        # trainer's progress output; the pool's own counters say what went wrong.
        if address is not None:
            _check_reachable(address)
        try:
            if address is None:
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        except Exception as exc:  # ConnectionError, a bad address string, ...
            where = "start a local Ray" if address is None else f"connect to the Ray cluster at {address!r}"
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise VerifierBackendUnavailable(f"cannot {where}: {first_line}") from None


def _check_reachable(address: str) -> None:
    """Ray retries an unreachable ``host:port`` for minutes; a plain TCP connect tells in seconds.
    Other forms ("auto", ...) are left to ``ray.init``, which answers those quickly itself."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise VerifierBackendUnavailable(f"cannot connect to the Ray cluster at {address!r}: {reason}") from None


class RayVerifierPool(Pool):
    """Verify completions on Ray actors; ``submit`` returns a Future[Verdict]."""

    def __init__(
        self, domains: dict[str, Domain], workers: int = 1, *, address: str | None = None,
        num_cpus: int | None = None, cpus_per_worker: float = 1.0, start_timeout_s: float = 120.0,
    ) -> None:
        self._init_queue(domains)
        n = max(1, workers)
        blob = ray.cloudpickle.dumps(domains)  # a domain that cannot travel fails here, in the driver
        self._cpus_per_worker = cpus_per_worker
        self._start_timeout_s = start_timeout_s
        self._driver_path = [os.path.abspath(p or os.curdir) for p in sys.path if os.path.isdir(p or os.curdir)]
        _RaySession.join(address, num_cpus or max(1, math.ceil(n * cpus_per_worker)))
        try:
            self._domains_ref = ray.put(blob)  # once, shared by every actor and every replacement
            self._actors = [self._spawn() for _ in range(n)]
        except BaseException:
            _RaySession.leave()
            raise
        self._wakeup = threading.Event()
        self._last_up = time.monotonic()  # last time some actor was ready: start-up counts from here
        self._thread = threading.Thread(target=self._dispatch_loop, name="ray-verifier-pool", daemon=True)
        self._thread.start()

    def _wake(self) -> None:
        self._wakeup.set()

    def _stop_workers(self) -> None:
        self._fail_pending("verifier pool closed")  # again, in case the dispatcher did not get there
        for actor in self._actors:
            self._kill(actor)
        _RaySession.leave()

    # -- dispatcher thread: the only thread that talks to the actors ------------------------------
    def _dispatch_loop(self) -> None:
        while not self._closed:
            self._assign_jobs()
            for actor in self._wait_for_replies():
                if actor.ready:
                    self._collect(actor)
                else:
                    self._greet(actor)
            self._enforce_deadlines()
            self._check_someone_is_up()
            if self.broken:  # a call submitted while the pool broke down must not wait forever
                self._fail_pending(self.broken)
        self._fail_pending("verifier pool closed")

    def _wait_for_replies(self) -> list[_Actor]:
        waiting = {actor.pending: actor for actor in self._actors if actor.pending is not None}
        if not waiting:  # nothing in flight, nothing starting: sleep until a submit
            self._wakeup.wait(timeout=1.0)
            self._wakeup.clear()
            return []
        next_deadline = min(actor.deadline for actor in self._actors) - time.monotonic()
        refs = list(waiting)
        done, _ = ray.wait(refs, num_returns=1, timeout=min(POLL_S, max(0.0, next_deadline)))
        if done:  # take every reply that is in, not one per round
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return [waiting[ref] for ref in done]

    def _spawn(self) -> _Actor:
        handle = _RemoteWorker.options(num_cpus=self._cpus_per_worker).remote(self._driver_path, self._domains_ref)
        return _Actor(handle, handle.ready.remote())

    def _greet(self, actor: _Actor) -> None:
        ref, actor.pending = actor.pending, None
        try:
            ray.get(ref)
        except Exception as exc:  # the actor died while unpickling the domains (a missing module, ...)
            self._start_failed(len(self._actors), f"Ray verifier workers keep dying at start-up: {_last_line(exc)}")
            self._replace(actor)
            return
        actor.ready = True

    def _assign_jobs(self) -> None:
        for actor in self._actors:
            if actor.job is not None or not actor.ready:
                continue
            job = self._take_job()
            if job is None:
                return
            actor.pending = actor.handle.verify.remote(job.domain, job.task, job.completion)
            actor.job, actor.started = job, time.monotonic()
            actor.deadline = actor.started + job.timeout_s

    def _collect(self, actor: _Actor) -> None:
        ref, job = actor.pending, actor.job
        assert job is not None
        actor.pending, actor.job, actor.deadline = None, None, math.inf
        try:
            result, latency = pickle.loads(ray.get(ref))
            verdict = Verdict(result, latency)
        except RayActorError:  # the actor died mid-call (segfault, os._exit or sys.exit in a verifier, ...)
            verdict = Verdict(VerifyResult.no_verdict("verifier worker died"), time.monotonic() - actor.started)
            self._replace(actor)
        except Exception as exc:  # the call failed in Ray, or the result does not unpickle here
            verdict = Verdict(VerifyResult.no_verdict(f"verifier call failed: {_last_line(exc)}"), 0.0)
        resolve_once(job, verdict)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for actor in self._actors:
            if actor.job is not None and now >= actor.deadline:
                job = actor.job
                self.timeouts += 1
                self._replace(actor)
                resolve_once(job, timed_out(job, actor.started, now))

    def _check_someone_is_up(self) -> None:
        now = time.monotonic()
        if any(actor.ready for actor in self._actors):
            self._last_up = now
        elif not self.broken and now - self._last_up > self._start_timeout_s:
            free = ray.available_resources().get("CPU", 0)
            self.broken = (f"no Ray verifier worker came up within {self._start_timeout_s:g}s (the cluster has "
                           f"{free:g} CPUs free; each worker asks for {self._cpus_per_worker:g})")
            self._fail_pending(self.broken)

    def _replace(self, actor: _Actor) -> None:
        """Kill ``actor`` and put a fresh one in its place; after a breakdown only kill it."""
        self._kill(actor)
        index = self._actors.index(actor)
        if self.broken:  # a dead slot: nothing more is sent to it
            actor.pending, actor.job, actor.ready = None, None, False
            return
        self._actors[index] = self._spawn()
        self.restarts += 1

    @staticmethod
    def _kill(actor: _Actor) -> None:
        try:
            ray.kill(actor.handle, no_restart=True)
        except Exception:  # already gone, or Ray is shutting down
            pass

    def _running_jobs(self) -> list[Job]:
        return [actor.job for actor in self._actors if actor.job is not None]


def _last_line(exc: BaseException) -> str:
    """Ray's errors carry the remote traceback; its last line names what went wrong."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return (lines[-1].strip() if lines else type(exc).__name__)[:300]
