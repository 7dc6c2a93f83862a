"""Which reasoning-gym curriculum levels generate tasks: the measurement behind ``HANGS`` in
``domains/reasoning_gym.py``. Re-run it after upgrading reasoning-gym.

    python scripts/probe_reasoning_gym.py [--items 3] [--limit 20] [DATASET ...]

For every dataset with a curriculum and every curriculum level (0-based, inclusive ranges, as the
adapter uses them), it generates ``--items`` items with seed 7 under a ``--limit`` second alarm and
prints one line per dataset: the seconds each level took, ``reject`` for a configuration the dataset
refuses, ``ERR`` for a generator that raised and ``HANG`` for one that ran out of time.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import signal
import time


class Expired(BaseException):
    pass


def probe_level(dataset_cls, curriculum, level: int, items: int, limit: float) -> str:
    curriculum.set_global_level(level)
    try:
        config = curriculum.generate_configuration({"seed": 7, "size": items})
        config.validate()
    except Exception:
        return "reject"
    start = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            dataset = dataset_cls(config=config)
            for index in range(items):
                dataset[index]
    except Expired:
        return "HANG"
    except Exception as exc:
        return f"ERR {type(exc).__name__}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return f"{time.monotonic() - start:.2f}s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="*")
    parser.add_argument("--items", type=int, default=3)
    parser.add_argument("--limit", type=float, default=20.0)
    args = parser.parse_args()
    from reasoning_gym.factory import CURRICULA, DATASETS, create_curriculum

    def expire(signum, frame):
        raise Expired()

    signal.signal(signal.SIGALRM, expire)
    for name in args.datasets or sorted(CURRICULA):
        curriculum = create_curriculum(name)
        depth = max(len(attr.levels) for attr in curriculum.attributes.values())
        cells = [f"{level}:{probe_level(DATASETS[name][0], curriculum, level, args.items, args.limit)}"
                 for level in range(depth)]
        print(name, " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
