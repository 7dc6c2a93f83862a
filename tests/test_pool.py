"""The verifier pool: every call resolves to a VerifyResult, whatever the verifier does, the pool
keeps serving afterwards, and no worker process outlives ``close``."""
from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # spawned workers import pool_helpers from here
from pool_helpers import UNRULY, task, wait_until_every_worker_is_up  # noqa: E402

from domains.api import Status, Task, user_prompt  # noqa: E402
from domains.verify.pool import Verdict, VerifierPool, VerifierPoolBroken, verify_guarded  # noqa: E402

DEADLINE_S = UNRULY.config.verify_timeout_s
RESULT_WAIT_S = 30  # a bound on Future.result so a broken pool fails the test instead of hanging


@pytest.fixture(scope="module")
def pool():
    """One pool shared by the behaviour tests: each test also checks the pool still works."""
    with VerifierPool({"unruly": UNRULY}, workers=2) as shared:
        yield shared


def _verify(pool: VerifierPool, completion: str) -> Verdict:
    return pool.submit(task(), completion).result(timeout=RESULT_WAIT_S)


def _still_works(pool: VerifierPool) -> None:
    verdict = _verify(pool, "ok")
    assert verdict.result.status == Status.OK and verdict.result.reward == 1.0


def test_ok_and_wrong_pass_through(pool: VerifierPool) -> None:
    ok, wrong = _verify(pool, "ok"), _verify(pool, "wrong")
    assert ok.result.correct and ok.result.details["pid"] != 0
    assert wrong.result.status == Status.WRONG and not wrong.result.correct
    assert ok.latency_s >= 0.0


def test_exception_becomes_error(pool: VerifierPool) -> None:
    verdict = _verify(pool, "raise")
    assert verdict.result.status == Status.ERROR and verdict.result.reward == 0.0
    assert "ZeroDivisionError" in verdict.result.details["message"]
    assert not verdict.result.scored  # no verdict on the completion: the verifier could not judge it
    _still_works(pool)


def test_garbage_return_becomes_error(pool: VerifierPool) -> None:
    verdict = _verify(pool, "garbage")
    assert verdict.result.status == Status.ERROR and "not VerifyResult" in verdict.result.details["message"]
    assert not verdict.result.scored  # no verdict on the completion: the verifier could not judge it
    _still_works(pool)


def test_unpicklable_result_becomes_error(pool: VerifierPool) -> None:
    verdict = _verify(pool, "unsendable")
    assert verdict.result.status == Status.ERROR and "not sendable" in verdict.result.details["message"]
    assert not verdict.result.scored  # no verdict on the completion: the verifier could not judge it
    _still_works(pool)


@pytest.mark.parametrize("completion", ["exit", "sysexit"])
def test_dead_worker_becomes_error_and_is_replaced(pool: VerifierPool, completion: str) -> None:
    restarts = pool.restarts
    verdict = _verify(pool, completion)
    assert verdict.result.status == Status.ERROR and "died" in verdict.result.details["message"]
    assert not verdict.result.scored  # no verdict on the completion: the verifier could not judge it
    assert pool.restarts == restarts + 1
    _still_works(pool)


def test_hang_times_out_at_the_deadline(pool: VerifierPool) -> None:
    timeouts = pool.timeouts
    start = time.monotonic()
    verdict = _verify(pool, "hang")
    elapsed = time.monotonic() - start
    assert verdict.result.status == Status.TIMEOUT and not verdict.result.correct
    assert DEADLINE_S <= elapsed < DEADLINE_S + 15  # never stopped, it would hang past RESULT_WAIT_S
    assert pool.timeouts == timeouts + 1
    _still_works(pool)


def test_a_hang_does_not_block_other_work(pool: VerifierPool) -> None:
    wait_until_every_worker_is_up(pool)
    hang = pool.submit(task(), "hang")
    quick = [pool.submit(task(), "ok") for _ in range(5)]  # served by the other worker meanwhile
    assert all(f.result(timeout=RESULT_WAIT_S).result.status == Status.OK for f in quick)
    assert not hang.done()  # the quick ones finished before the hang's deadline
    assert hang.result(timeout=RESULT_WAIT_S).result.status == Status.TIMEOUT


def test_verify_many_keeps_order(pool: VerifierPool) -> None:
    completions = ["ok", "wrong", "raise", "ok", "garbage", "wrong"]
    verdicts = pool.verify_many([(task(), c) for c in completions])
    assert [v.result.status for v in verdicts] == [
        Status.OK, Status.WRONG, Status.ERROR, Status.OK, Status.ERROR, Status.WRONG]


def test_unknown_domain_is_an_error_without_a_worker(pool: VerifierPool) -> None:
    stranger = Task("nobody", 1, user_prompt("?"), {})
    verdict = pool.submit(stranger, "ok").result(timeout=1)
    assert verdict.result.status == Status.ERROR and "unknown domain" in verdict.result.details["message"]


def test_verify_guarded_in_process() -> None:
    assert verify_guarded(UNRULY, task(), "raise").status == Status.ERROR
    assert verify_guarded(UNRULY, task(), "garbage").status == Status.ERROR
    numpy = verify_guarded(UNRULY, task(), "numpy:0.5")
    assert numpy.status == Status.OK and type(numpy.reward) is float and numpy.reward == 0.5
    for reward in ("nan", "inf"):
        result = verify_guarded(UNRULY, task(), f"nan:{reward}")
        assert result.status == Status.ERROR and result.reward == 0.0 and "not a finite number" in result.details["message"]
    assert verify_guarded(UNRULY, task(), "ok").status == Status.OK


def _processes(pool: VerifierPool) -> list:
    return [worker.process for worker in pool._workers]


def test_close_leaves_no_worker_processes() -> None:
    pool = VerifierPool({"unruly": UNRULY}, workers=2)
    seen = _processes(pool)
    assert _verify(pool, "exit").result.status == Status.ERROR  # one replacement
    seen += _processes(pool)
    assert _verify(pool, "hang").result.status == Status.TIMEOUT  # and another
    seen += _processes(pool)
    by_pid = {p.pid: p for p in seen}
    assert len(by_pid) == 4 and sum(p.is_alive() for p in by_pid.values()) == 2  # replaced ones are gone
    pool.close()
    assert not any(p.is_alive() for p in by_pid.values())
    assert not pool._thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(task(), "ok")
    pool.close()  # closing twice is harmless


def test_close_resolves_pending_work() -> None:
    pool = VerifierPool({"unruly": UNRULY}, workers=1)
    assert _verify(pool, "ok").result.status == Status.OK  # the worker is up
    running = pool.submit(task(), "sleep:0.5")
    queued = [pool.submit(task(), "ok") for _ in range(3)]
    time.sleep(0.1)
    start = time.monotonic()
    pool.close()
    assert time.monotonic() - start < 10
    futures = [running, *queued]
    assert all(f.done() for f in futures)
    statuses = [f.result().result.status for f in futures]
    assert all(s in (Status.OK, Status.ERROR) for s in statuses)
    assert Status.ERROR in statuses[1:]  # queued work is failed, not silently dropped
    assert not any(p.is_alive() for p in _processes(pool))


def test_the_first_call_does_not_pay_for_start_up() -> None:
    # SLOW_START's verifier loads for 3 s on first use and has a 1 s deadline: the worker warms it
    # up before reporting ready, so the deadline starts after the load and the first call passes.
    from pool_helpers import SLOW_START

    with VerifierPool({"slow_start": SLOW_START}, workers=1) as pool:
        first = pool.submit(SLOW_START.sample(1, 1, random.Random(0))[0], "x").result(timeout=60)
    assert first.result.status == Status.OK, first.result


def test_a_warm_up_that_fails_leaves_the_error_to_verify() -> None:
    from domains.verify.pool import warm_up

    class Broken(type(UNRULY)):
        def warm_up(self) -> None:
            raise OSError("no such model file")

    class TimesOut(type(UNRULY)):
        def warm_up(self) -> None:
            raise SystemExit(1)  # like math-verify's TimeoutException: not an Exception

    broken = Broken()
    warm_up({"broken": broken, "times_out": TimesOut()})  # the worker must still come up and answer calls
    assert verify_guarded(broken, task(), "ok").status == Status.OK


def test_a_pool_whose_workers_cannot_start_fails_loudly_after_resolving_its_calls() -> None:
    from pool_helpers import UNSTARTABLE

    with VerifierPool({"unstartable": UNSTARTABLE}, workers=1) as pool:
        pool.raise_if_broken()  # nothing has failed yet
        doomed = Task("unstartable", 1, user_prompt("x"), {})
        verdict = pool.submit(doomed, "ok").result(timeout=RESULT_WAIT_S)  # resolved, never left waiting
        assert verdict.result.status == Status.ERROR and "start-up" in verdict.result.details["message"]
        with pytest.raises(VerifierPoolBroken, match="verification stopped: verifier workers keep dying"):
            pool.raise_if_broken()


def _verify_in_a_fresh_pool() -> str:
    sys.path.insert(0, str(Path(__file__).parent))
    from pool_helpers import UNRULY as unruly, task as make_task

    with VerifierPool({"unruly": unruly}, workers=1) as fresh:
        return fresh.submit(make_task(), "ok").result(timeout=RESULT_WAIT_S).result.status.value


def test_a_pool_started_inside_a_joblib_worker_serves() -> None:
    # Hydra's joblib launcher runs each job in a joblib (loky) worker, whose default start method
    # a spawned verifier worker cannot take on: before, each of them died at start-up
    from joblib import Parallel, delayed

    statuses = Parallel(n_jobs=2, backend="loky")(delayed(_verify_in_a_fresh_pool)() for _ in range(2))
    assert statuses == [Status.OK.value] * 2
