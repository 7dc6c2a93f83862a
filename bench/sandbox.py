"""Verifications per second: the sandboxed verifier pool versus plain unsandboxed subprocess runs.

Both sides score the same trivial passing programs (reference solutions of ``code_functions``
tasks, six hidden function-call tests each) with the same number of parallel workers:

* sandboxed — ``VerifierPool`` over the code domain: bwrap + rlimits + the harness, outputs compared
  in the parent;
* plain — what a naive verifier does: ``subprocess.run([python, "-c", program + asserts])`` from a
  thread pool, no isolation at all.

Rounds alternate plain and sandboxed so that load from anything else on the machine hits both
alike. The last line is the cost ratio (sandboxed time per verification / plain time).

    python bench/sandbox.py [--tasks 60] [--rounds 3] [--workers 2]
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from domains.code.generated import IntFunctionsDomain  # noqa: E402
from domains.verify.pool import VerifierPool  # noqa: E402
from domains.verify.sandbox import SandboxConfig  # noqa: E402


def plain_program(task, completion: str) -> str:
    asserts = "".join(f"assert f(*{c['args']!r}) == {c['expected']!r}\n" for c in task.payload["cases"])
    return completion + "\n" + asserts


def run_plain(python: str, program: str) -> bool:
    done = subprocess.run([python, "-c", program], capture_output=True, timeout=10)
    return done.returncode == 0


def time_plain(items, python: str, workers: int) -> tuple[float, int]:
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        passed = sum(ex.map(lambda item: run_plain(python, plain_program(*item)), items))
    return time.perf_counter() - start, passed


def time_sandboxed(pool: VerifierPool, items) -> tuple[float, int]:
    start = time.perf_counter()
    verdicts = pool.verify_many(items)
    return time.perf_counter() - start, sum(v.result.reward == 1.0 for v in verdicts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args()

    domain = IntFunctionsDomain().configure({})
    rng = random.Random(0)
    tasks = [t for level in domain.levels for t in domain.sample(level, args.tasks // 5, rng)]
    items = [(t, domain.reference(t)) for t in tasks]
    python = SandboxConfig().python  # the same interpreter on both sides

    with VerifierPool({domain.name: domain}, workers=args.workers) as pool:
        time_sandboxed(pool, items[:4])  # warm-up: worker start and the sandbox self-test
        run_plain(python, plain_program(*items[0]))
        plain_s = sandbox_s = 0.0
        for r in range(args.rounds):
            p_s, p_ok = time_plain(items, python, args.workers)
            s_s, s_ok = time_sandboxed(pool, items)
            assert p_ok == s_ok == len(items), (p_ok, s_ok)
            plain_s, sandbox_s = plain_s + p_s, sandbox_s + s_s
            print(f"round {r}: plain {len(items) / p_s:6.1f} verif/s   sandboxed {len(items) / s_s:6.1f} verif/s")
    n = len(items) * args.rounds
    print(f"workers={args.workers} verifications={n} (x2)  python={python}")
    print(f"plain subprocess: {n / plain_s:.1f} verifications/s")
    print(f"sandboxed pool:   {n / sandbox_s:.1f} verifications/s")
    print(f"sandbox cost ratio (sandboxed time / plain time): {sandbox_s / plain_s:.2f}")


if __name__ == "__main__":
    main()
