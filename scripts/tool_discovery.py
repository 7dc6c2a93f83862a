"""When did a run's model learn to call a tool domain's tools? Reads stored runs; the measurement
behind the discovery tables in ``docs/adaptive-mixing.md``.

    python scripts/tool_discovery.py [--domain tool_calculator] [--until 10] STORE.db ...

For each store (one run each, as under ``docs/results/``) it counts the domain's completions the
model wrote unled: every completion of a plain task, and the unled half of a led group's. A
completion whose first turn is exactly its task's lead is counted as led and left out, so a member
that made the very call unprompted is not credited to the model (the count errs low). It prints,
per store, over steps 1 to ``--until``: completions, those whose first turn makes a call, those
right; and the first step at which at least half of that step's unled completions were right.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

from curriculum.store import StatsStore
from domains.tools.calls import OPEN


def unled_by_step(path: str, domain: str) -> dict[int, list[int]]:
    """Step -> [completions, first turn makes a call, right] of ``domain``'s unled completions."""
    store = StatsStore(f"sqlite:///{path}")
    try:
        run = store.runs()[-1]["id"]
        tasks = store.tasks(run)
        counts: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
        for row in store.results(run):
            if row["domain"] != domain or row["completion"] is None:
                continue
            lead = ((tasks.get(row["task_id"]) or {}).get("meta") or {}).get("lead")
            messages = json.loads(row["completion"])
            first = messages[0]["content"] if messages else ""
            if lead and first == lead:
                continue
            step = counts[row["step"]]
            step[0] += 1
            step[1] += OPEN in first
            step[2] += bool(row["correct"])
        return dict(counts)
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stores", nargs="+")
    parser.add_argument("--domain", default="tool_calculator")
    parser.add_argument("--until", type=int, default=10)
    args = parser.parse_args()
    for path in args.stores:
        counts = unled_by_step(path, args.domain)
        n, calls, right = (sum(c[i] for s, c in counts.items() if s <= args.until) for i in range(3))
        half = next((s for s in sorted(counts) if counts[s][2] and 2 * counts[s][2] >= counts[s][0]), None)
        print(f"{path.rsplit('/', 1)[-1]}: steps 1-{args.until}: {n} unled, {calls} call first, {right} right; "
              f"first step with half right: {half if half is not None else 'none'}")


if __name__ == "__main__":
    main()
