"""A pool of verifier worker processes with hard per-call deadlines.

Why processes and not threads: verifiers run untrusted or pathological inputs (huge sympy
expressions, model-written code) that can hang inside C code, and math-verify's own timeouts rely on
``signal.alarm``, which only works in a main thread. Each worker runs verifiers in its main thread;
the parent enforces a wall-clock deadline per call and kills and replaces a worker that overruns.
Whatever happens, a call resolves to a VerifyResult — never an exception into the trainer. The one
exception is a pool whose workers cannot even start: every verdict would be an error, so callers
ask ``raise_if_broken`` after each batch rather than train on nothing.

This module holds the one pool contract, ``Pool`` (an abstract class, with the call queue both
implementations share), ``Verdict``, and the local implementation, ``VerifierPool``. The Ray
implementation (``domains.verify.ray_pool``) builds on these; nothing here imports it.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import multiprocessing as mp
import os
import signal
import threading
import time
import warnings
from abc import ABC, abstractmethod
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection, wait
from typing import Any

from domains.api import Domain, Status, Task, VerifyResult


class VerifierPoolBroken(RuntimeError):
    """The pool gave up starting workers: no verdict it returns means anything."""


class VerifierBackendUnavailable(RuntimeError):
    """The verifier backend cannot start (say, no Ray cluster at the given address); one line."""


def verify_guarded(domain: Domain, task: Task, completion: str) -> VerifyResult:
    """Run one verifier call; any exception or wrong return type becomes ``status=error``."""
    try:
        result = domain.verify(task, completion)
    except Exception as exc:  # a verifier bug must not crash training
        return VerifyResult.no_verdict(f"verifier raised {type(exc).__name__}: {exc}")
    if not isinstance(result, VerifyResult):
        return VerifyResult.no_verdict(f"verifier returned {type(result).__name__}, not VerifyResult")
    try:
        reward = float(result.reward)  # numpy and torch scalars too
    except (TypeError, ValueError):
        reward = math.nan
    if not math.isfinite(reward):  # a NaN would poison every advantage of its group
        return VerifyResult.no_verdict(f"verifier returned the reward {result.reward!r}, not a finite number")
    return dataclasses.replace(result, reward=reward)


def warm_up(domains: dict[str, Domain]) -> None:
    """Each domain's ``warm_up``, in a verifier worker before it reports ready."""
    for domain in domains.values():
        try:
            domain.warm_up()
        except KeyboardInterrupt:
            raise
        except BaseException:  # timeouts and SystemExit too: verify() will say what is wrong, per call
            pass


def _worker_main(conn: Connection, domains: dict[str, Domain]) -> None:
    # Ctrl-C reaches the whole process group; the parent decides when workers stop (and says why).
    # The parent started this process with SIGINT blocked; ignored from here, it can be let through.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # compiling model-written code emits SyntaxWarnings by the hundred; the verdict says enough
    warnings.simplefilter("ignore", SyntaxWarning)
    warm_up(domains)
    conn.send("ready")  # the domains are loaded and warmed up: deadlines may start
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        job_id, domain_name, task, completion = job
        start = time.perf_counter()
        result = verify_guarded(domains[domain_name], task, completion)
        try:
            conn.send((job_id, result, time.perf_counter() - start))
        except Exception as exc:  # e.g. unpicklable details
            conn.send((job_id, VerifyResult.no_verdict(f"result not sendable: {exc}"), 0.0))


@dataclass
class Verdict:
    """A verifier result plus how long it took (seconds, wall clock)."""

    result: VerifyResult
    latency_s: float


@dataclass
class Job:
    """One queued call: what a pool's dispatcher hands to a worker, and the Future it resolves."""

    id: int
    domain: str
    task: Task
    completion: str
    future: Future
    timeout_s: float


class _Worker:
    def __init__(self, ctx: Any, domains: dict[str, Domain]) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, domains), daemon=True)
        # Started with Ctrl-C blocked (the mask survives exec), so one that lands while the child is
        # still importing is held until the child ignores it rather than printing a traceback. The
        # resource tracker starts first: starting it unblocks SIGINT in this thread.
        resource_tracker.ensure_running()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        child.close()
        self.job: Job | None = None
        self.ready = False  # a new worker imports its domains first; that time is not a job's
        self.deadline = 0.0
        self.started = 0.0

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


def resolve_once(job: Job, verdict: Verdict) -> None:
    """Give a call its verdict, unless a breakdown already failed it (a late reply is dropped)."""
    if not job.future.done():
        job.future.set_result(verdict)


def timed_out(job: Job, started: float, now: float) -> Verdict:
    """The verdict of a call that ran past its deadline (its worker is replaced)."""
    return Verdict(VerifyResult.failure(Status.TIMEOUT, f"verifier exceeded {job.timeout_s:g}s"), now - started)


class Pool(ABC):
    """The one verifier-pool contract, which the local ``VerifierPool`` and the Ray pool
    (``domains.verify.ray_pool.RayVerifierPool``) implement and the trainer and curriculum type against.

    Public API: ``domains`` (name -> Domain), ``submit(task, completion)`` returns a Future[Verdict]
    that always resolves (a hung or crashing verifier becomes ``status=timeout`` or ``status=error``,
    never an exception), ``verify_many``, ``raise_if_broken`` (after each batch), ``close`` and use as
    a context manager; the counters ``timeouts``, ``restarts``, ``start_failures`` and ``broken``.

    What the implementations share lives here too: calls wait in a queue that the pool's dispatcher
    thread hands to its workers. A subclass starts its workers and a dispatcher thread
    (``self._thread``), wakes it in ``_wake``, says which calls its workers hold in ``_running_jobs``
    and stops its workers in ``_stop_workers``."""

    def _init_queue(self, domains: dict[str, Domain]) -> None:
        self.domains = domains
        self._queue: deque[Job] = deque()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self.timeouts = 0
        self.restarts = 0
        self.start_failures = 0
        self.broken: str | None = None

    @abstractmethod
    def _wake(self) -> None:
        """Tell the dispatcher thread that a call is queued or the pool is closing."""

    @abstractmethod
    def _stop_workers(self) -> None:
        """Stop the workers once the dispatcher has exited."""

    @abstractmethod
    def _running_jobs(self) -> list[Job]:
        """The calls the workers hold right now."""

    def _take_job(self) -> Job | None:
        """The next queued call, for an idle worker; None when the queue is empty."""
        with self._lock:
            return self._queue.popleft() if self._queue else None

    def _start_failed(self, workers: int, message: str) -> None:
        """A worker died before it was ready. Past three such deaths per worker the pool gives up:
        every queued and later call gets ``message`` as its error instead of waiting forever."""
        self.start_failures += 1
        if self.start_failures > 3 * workers and not self.broken:
            self.broken = message
            self._fail_pending(message)

    def raise_if_broken(self) -> None:
        """Fail loudly once the pool has given up, instead of handing out error verdicts for ever."""
        if self.broken:
            raise VerifierPoolBroken(f"verification stopped: {self.broken}")

    def _fail_pending(self, message: str) -> None:
        with self._lock:
            pending = list(self._queue)
            self._queue.clear()
        for job in pending + self._running_jobs():
            resolve_once(job, Verdict(VerifyResult.no_verdict(message), 0.0))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake()
        self._thread.join(timeout=10)
        self._stop_workers()

    def submit(self, task: Task, completion: str) -> Future:
        """Queue one call; the Future resolves to its Verdict (an unknown domain's at once)."""
        if self._closed:
            raise RuntimeError("verifier pool is closed")
        domain = self.domains.get(task.domain)
        future: Future = Future()
        if domain is None or self.broken:
            message = self.broken or f"unknown domain {task.domain!r}"
            future.set_result(Verdict(VerifyResult.no_verdict(message), 0.0))
            return future
        job = Job(next(self._ids), task.domain, task, completion, future, domain.config.verify_timeout_s)
        with self._lock:
            self._queue.append(job)
        self._wake()
        return future

    def verify_many(self, items: list[tuple[Task, str]]) -> list[Verdict]:
        """Submit every (task, completion) and wait: the verdicts in the same order."""
        futures = [self.submit(task, completion) for task, completion in items]
        return [f.result() for f in futures]

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _spawn_context():
    """The spawn context. A spawned child first takes on its parent's default start method, which
    inside a joblib worker (Hydra's joblib launcher) is joblib's own "loky", unknown to the child:
    there the default becomes spawn too, else every verifier worker dies at start-up."""
    if mp.get_start_method(allow_none=True) not in (None, *mp.get_all_start_methods()):
        mp.set_start_method("spawn", force=True)
    return mp.get_context("spawn")


class VerifierPool(Pool):
    """Verify completions in parallel worker processes; ``submit`` returns a Future[Verdict]."""

    def __init__(self, domains: dict[str, Domain], workers: int | None = None) -> None:
        self._init_queue(domains)
        self._ctx = _spawn_context()  # never fork a process that holds torch threads
        n = max(1, workers or os.cpu_count() or 1)
        self._workers = [_Worker(self._ctx, domains) for _ in range(n)]
        self._wakeup_r, self._wakeup_w = self._ctx.Pipe(duplex=False)
        self._thread = threading.Thread(target=self._dispatch_loop, name="verifier-pool", daemon=True)
        self._thread.start()

    def _wake(self) -> None:
        self._wakeup_w.send(b"")

    def _stop_workers(self) -> None:
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except OSError:
                pass
            worker.process.join(timeout=2)
            if worker.process.is_alive():
                worker.kill()

    # -- dispatcher thread ----------------------------------------------------------------------
    def _dispatch_loop(self) -> None:
        while not self._closed:
            self._assign_jobs()
            busy = [w for w in self._workers if w.job is not None]
            starting = [w for w in self._workers if not w.ready]
            timeout = min((w.deadline for w in busy), default=time.monotonic() + 1.0) - time.monotonic()
            ready = wait([self._wakeup_r] + [w.conn for w in busy + starting], timeout=max(0.0, timeout))
            for conn in ready:
                if conn is self._wakeup_r:
                    while self._wakeup_r.poll():
                        self._wakeup_r.recv_bytes()
                    continue
                worker = next(w for w in self._workers if w.conn is conn)
                if worker.ready:
                    self._collect(worker)
                else:
                    self._greet(worker)
            self._enforce_deadlines()
        self._fail_pending("verifier pool closed")

    def _greet(self, worker: _Worker) -> None:
        try:
            worker.ready = worker.conn.recv() == "ready"
        except (EOFError, OSError):  # died while starting (e.g. a plugin that fails to unpickle)
            self._start_failed(len(self._workers),
                               "verifier workers keep dying at start-up (a domain that cannot be unpickled?)")
            self._replace(self._workers.index(worker))

    def _assign_jobs(self) -> None:
        for i, worker in enumerate(self._workers):
            if worker.job is not None or not worker.ready:
                continue
            job = self._take_job()
            if job is None:
                return
            try:
                worker.conn.send((job.id, job.domain, job.task, job.completion))
            except OSError:  # worker died between jobs: replace it and retry the job
                self._replace(i)
                with self._lock:
                    self._queue.appendleft(job)
                continue
            worker.job, worker.started = job, time.monotonic()
            worker.deadline = worker.started + job.timeout_s

    def _collect(self, worker: _Worker) -> None:
        job = worker.job
        assert job is not None
        try:
            _, result, latency = worker.conn.recv()
            verdict = Verdict(result, latency)
        except (EOFError, OSError):  # the worker crashed (segfault, os._exit in a verifier, ...)
            verdict = Verdict(VerifyResult.no_verdict("verifier worker died"), time.monotonic() - worker.started)
            self._replace(self._workers.index(worker))
        else:
            worker.job = None
        resolve_once(job, verdict)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for i, worker in enumerate(self._workers):
            if worker.job is not None and now >= worker.deadline:
                job = worker.job
                self.timeouts += 1
                self._replace(i)
                resolve_once(job, timed_out(job, worker.started, now))

    def _replace(self, index: int) -> None:
        self._workers[index].kill()
        self._workers[index] = _Worker(self._ctx, self.domains)
        self.restarts += 1

    def _running_jobs(self) -> list[Job]:
        return [w.job for w in self._workers if w.job is not None]
