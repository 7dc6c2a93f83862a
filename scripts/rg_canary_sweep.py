"""Which reasoning-gym canaries earn reward, dataset by dataset: the measurement behind the default
reward of ``domains/reasoning_gym.py``. Re-run it after upgrading reasoning-gym or changing a canary.

    python scripts/rg_canary_sweep.py [--tasks 3] [--levels ends|first|all] [--seed 1234]
                                      [--option partial_credit=true ...] [DATASET ...]

For every dataset (or those named) and the chosen levels (``ends``: the first and the hardest), it
draws ``--tasks`` held-out tasks, as ``palestra verify --canaries`` does, writes every canary of the
domain for each and verifies them in this process (no verifier pool). Each line names a (dataset,
canary) whose raw score (the dataset scorer's number, before the reward rule) is above 0, with the
highest score and the highest reward under the given options; the last lines count the datasets
where some canary scored and where one was paid, and the highest of each. ``--option`` takes the
domain's options as key=value (JSON values), e.g. ``--option partial_credit=true``.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: expected key=value")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _levels(levels: tuple[int, ...], which: str) -> list[int]:
    if which == "all":
        return list(levels)
    if which == "first":
        return [levels[0]]
    return sorted({levels[0], levels[-1]})


def sweep(datasets: list[str], options: dict, tasks: int, which: str, seed: int) -> dict[str, dict[str, dict]]:
    """{dataset: {canary: {"score", "reward", "level", "hits", "tried"}}} for every canary that ran."""
    from domains.reasoning_gym import ReasoningGymDomain

    found: dict[str, dict[str, dict]] = {}
    for dataset in datasets:
        start = time.monotonic()
        domain = ReasoningGymDomain(dataset).configure(options)
        rows = found.setdefault(dataset, {})
        for level in _levels(domain.levels, which):
            try:
                drawn = domain.heldout(level, tasks, seed)
            except Exception as exc:  # a level reasoning-gym cannot generate: say so, go on
                print(f"{dataset} level {level}: no tasks ({type(exc).__name__}: {exc})", flush=True)
                continue
            for task in drawn:
                for canary, write in domain.canaries().items():
                    completion = write(task)
                    if completion is None:
                        continue
                    result = domain.verify(task, completion)
                    score = float(result.details.get("score", 0.0)) if result.scored else 0.0
                    row = rows.setdefault(canary, {"score": 0.0, "reward": 0.0, "level": level, "hits": 0, "tried": 0})
                    row["tried"] += 1
                    if score > 0:
                        row["hits"] += 1
                    if (score, result.reward) > (row["score"], row["reward"]):
                        row.update(score=score, reward=result.reward, level=level)
        for canary, row in sorted(rows.items()):
            if row["score"] > 0 or row["reward"] > 0:
                print(f"{dataset:32s} {canary:20s} score {row['score']:.4f} reward {row['reward']:.4f} "
                      f"(level {row['level']}, {row['hits']}/{row['tried']} completions scored)", flush=True)
        if time.monotonic() - start > 30:
            print(f"{dataset}: {time.monotonic() - start:.0f}s", flush=True)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="*", help="reasoning-gym dataset names (default: every one)")
    parser.add_argument("--tasks", type=int, default=3, help="held-out tasks per level")
    parser.add_argument("--levels", choices=["ends", "first", "all"], default="ends")
    parser.add_argument("--seed", type=int, default=1234, help="the held-out tasks' seed (as verify --canaries)")
    parser.add_argument("--option", type=_option, action="append", default=[], help="a domain option, key=value")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the adapter's skipped-item warnings would drown the table
    from domains.reasoning_gym import dataset_names

    start = time.monotonic()
    found = sweep(args.datasets or list(dataset_names()), dict(args.option), args.tasks, args.levels, args.seed)
    scored = {d: max(r["score"] for r in rows.values()) for d, rows in found.items() if rows}
    paid = {d: max(r["reward"] for r in rows.values()) for d, rows in found.items() if rows}
    scored = {d: s for d, s in scored.items() if s > 0}
    paid = {d: r for d, r in paid.items() if r > 0}
    print(f"options {dict(args.option) or '(defaults)'}; {len(found)} datasets, levels {args.levels}, "
          f"{args.tasks} tasks a level, {time.monotonic() - start:.0f}s")
    print(f"a canary scored above 0 on {len(scored)} datasets (highest score {max(scored.values(), default=0):.4f})")
    print(f"a canary earned reward on {len(paid)} datasets (highest reward {max(paid.values(), default=0):.4f})")
    return 1 if paid else 0


if __name__ == "__main__":
    sys.exit(main())
