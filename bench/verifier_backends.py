"""Verifying on a local Ray versus the local process pool, side by side on this machine.

Both pools get the same workers and score the same math completions (reference answers and wrong
ones, over arithmetic, linear_equations and fractions). Start-up is timed to the first verdict (for
Ray that includes starting Ray itself); then rounds alternate the two pools so that load from
anything else on the machine hits both alike. The last line is the cost ratio (Ray time per batch /
local time per batch).

    python bench/verifier_backends.py [--completions 256] [--rounds 3] [--workers 2]
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from domains.verify.pool import VerifierPool  # noqa: E402
from domains.verify.ray_pool import RayVerifierPool  # noqa: E402
from domains.registry import load  # noqa: E402

DOMAINS = ("arithmetic", "linear_equations", "fractions")


def math_items(domains, n: int, seed: int = 0):
    rng = random.Random(seed)
    items = []
    while len(items) < n:
        domain = domains[DOMAINS[len(items) % len(DOMAINS)]]
        task = domain.sample(rng.choice(domain.levels), 1, rng)[0]
        right = domain.reference(task)
        items.append((task, right if rng.random() < 0.5 else rf"\boxed{{{rng.randint(-99, 99)}}}"))
    return items


def time_batch(pool, items) -> float:
    start = time.perf_counter()
    pool.verify_many(items)
    return time.perf_counter() - start


def started(make, warm_up):
    """A pool and the seconds until its first verdicts are back (every worker imports sympy then)."""
    start = time.perf_counter()
    pool = make()
    pool.verify_many(warm_up)
    return pool, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    domains = {name: load(name) for name in DOMAINS}
    items = math_items(domains, args.completions)
    warm_up = items[:2 * args.workers]
    local, local_start = started(lambda: VerifierPool(domains, workers=args.workers), warm_up)
    on_ray, ray_start = started(lambda: RayVerifierPool(domains, workers=args.workers, num_cpus=args.workers), warm_up)
    print(f"start-up to the first verdict: local {local_start:.1f}s, ray {ray_start:.1f}s (Ray itself included)")
    local_s = ray_s = 0.0
    try:
        for _ in range(args.rounds):
            local_s += time_batch(local, items)
            ray_s += time_batch(on_ray, items)
    finally:
        local.close()
        on_ray.close()
    n = args.rounds * len(items)
    print(f"{len(items)} math completions x {args.rounds} rounds, {args.workers} workers each")
    print(f"local pool: {n / local_s:.0f} verifications/s ({local_s / args.rounds:.2f}s per batch)")
    print(f"ray pool:   {n / ray_s:.0f} verifications/s ({ray_s / args.rounds:.2f}s per batch)")
    print(f"ray / local time per batch: {ray_s / local_s:.2f}")


if __name__ == "__main__":
    main()
