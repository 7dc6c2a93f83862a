"""Hostile submissions through the real sandbox and the real verifier pool.

For each program in ``tests/hostile/programs.py``: no reward, the expected status, the host
untouched (a marker file outside stays as it was, the pool's workers were never killed or
replaced), nothing left running (no process under a sandbox uid, no zombie child of a worker), and
the pool still scores an honest submission right afterwards.
"""
from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from domains.code.dataset import CodeDatasetDomain
from domains.code.generated import IntFunctionsDomain
from domains.code.verifier import CodeDomain
from domains.verify.pool import VerifierPool
from domains.verify.sandbox import SandboxConfig, SandboxUnavailable, self_test
from hostile.programs import HOSTILE, Hostile

pytestmark = pytest.mark.sandbox  # every test here runs code under bubblewrap

PROJECT = Path(__file__).resolve().parents[1]
FAST = {"sandbox": {"wall_timeout_s": 2.0, "cpu_s": 1}, "verify_timeout_s": 30.0}
SANDBOX_UID_MIN = 1_500_000_000  # domains.verify.sandbox_limits._fresh_uid draws from here up

HUMANEVAL_ROW = {
    "task_id": "Hostile/0",
    "prompt": 'def add_one(x):\n    """Return x plus one."""\n',
    "canonical_solution": "    return x + 1\n",
    "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(0) == 1\n    assert candidate(5) == 6\n",
    "entry_point": "add_one",
}
STDIO_ROW = {"question": "Read n, print n+1.", "input_output": {"inputs": ["1\n", "41\n"], "outputs": ["2\n", "42\n"]}}


@pytest.fixture(scope="module")
def domains() -> dict[str, CodeDomain]:
    try:
        self_test(SandboxConfig())
    except SandboxUnavailable as exc:
        pytest.fail(f"the code sandbox does not work here ({exc}); `make system-deps` installs bubblewrap")
    return {
        "code_functions": IntFunctionsDomain().configure(FAST),
        "code_dataset": CodeDatasetDomain().configure(FAST),
    }


@pytest.fixture(scope="module")
def pool(domains):
    with VerifierPool(domains, workers=2) as pool:
        yield pool


@pytest.fixture(scope="module")
def tasks(domains):
    plus_one = domains["code_functions"].sample(1, 1, __import__("random").Random(0))[0]
    cases = [{"args": [x], "expected": x + 1} for x in (1, 0, 5, -3)]
    plus_one = type(plus_one)(
        domain="code_functions", level=1, prompt=[{"role": "user", "content": "def f(x): return x plus 1"}],
        payload={"format": "call", "entry_point": "f", "cases": cases},
    )
    dataset = domains["code_dataset"]
    return {"call": plus_one, "humaneval": dataset.task_from_row(HUMANEVAL_ROW), "stdio": dataset.task_from_row(STDIO_ROW)}


HONEST = {
    "call": "def f(x):\n    return x + 1\n",
    "humaneval": "    return x + 1\n",
    "stdio": "print(int(input()) + 1)\n",
}


def _sandbox_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info["uids"]
        if uids is not None and uids.real >= SANDBOX_UID_MIN:
            found.append(proc)
    return found


def _zombie_children(pool: VerifierPool) -> list[psutil.Process]:
    zombies = []
    for worker in pool._workers:
        try:
            children = psutil.Process(worker.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for child in children:
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    zombies.append(child)
            except psutil.NoSuchProcess:  # reaped between listing and looking: fine
                pass
    return zombies


def _wait_until_clean(pool: VerifierPool, seconds: float = 3.0) -> tuple[list, list]:
    end = time.monotonic() + seconds
    while True:
        left, zombies = _sandbox_processes(), _zombie_children(pool)
        if (not left and not zombies) or time.monotonic() > end:
            return left, zombies
        time.sleep(0.05)


def test_at_least_twenty_hostile_programs():
    assert len(HOSTILE) >= 20
    assert len({h.name for h in HOSTILE}) == len(HOSTILE)


@pytest.mark.parametrize("hostile", HOSTILE, ids=[h.name for h in HOSTILE])
def test_hostile_submission_earns_nothing(hostile: Hostile, pool, tasks, tmp_path):
    marker = tmp_path / "marker.txt"
    marker.write_text("untouched")
    code = hostile.code.format(marker=marker, project=PROJECT)
    restarts_before = pool.restarts
    workers_before = [w.process.pid for w in pool._workers]

    verdict = pool.submit(tasks[hostile.kind], f"```python\n{code}```").result(timeout=60)

    result = verdict.result
    assert result.reward == 0.0 and not result.correct, result
    assert result.status.value in hostile.outcomes, result
    assert marker.read_text() == "untouched"
    assert not Path("/usr/pwned").exists()
    assert pool.restarts == restarts_before, "a verifier worker died or was replaced"
    assert [w.process.pid for w in pool._workers] == workers_before
    left, zombies = _wait_until_clean(pool)
    assert not left, f"sandbox processes still running: {[(p.pid, p.name()) for p in left]}"
    assert not zombies, f"zombie children of the workers: {zombies}"
    honest = pool.submit(tasks[hostile.kind], HONEST[hostile.kind]).result(timeout=60).result
    assert honest.reward == 1.0 and honest.status.value == "ok", honest


def test_hostile_programs_in_parallel_leave_nothing_behind(pool, tasks):
    """All of them at once, both workers busy: same verdicts, then a clean host."""
    futures = [(h, pool.submit(tasks[h.kind], h.code.format(marker="/nonexistent/m", project=PROJECT)))
               for h in HOSTILE]
    for hostile, future in futures:
        result = future.result(timeout=120).result
        assert result.reward == 0.0, (hostile.name, result)
    left, zombies = _wait_until_clean(pool)
    assert not left and not zombies
    assert pool.submit(tasks["call"], HONEST["call"]).result(timeout=60).result.reward == 1.0
