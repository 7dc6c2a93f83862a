"""Per-prompt totals: how ``StatsStore.write_prompt_step`` folds a step's per-prompt deltas into
``prompt_stats`` (the arithmetic, also used by ``curriculum.prompts``, and the SQL it runs inside
the step's transaction)."""
from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select

from curriculum.schema import PromptStatRow, PromptStepRow

_PROMPT_KEYS_PER_QUERY = 400  # task ids per IN (...) list, well under any driver's parameter limit


def empty_prompt_total(domain: str, task_id: str) -> dict:
    return dict(domain=domain, task_id=task_id, attempts=0, successes=0, groups=0,
                all_correct_streak=0, all_wrong_streak=0, last_step=-1)


def fold_prompt_delta(total: dict, delta: dict, step: int) -> dict:
    """``total`` after one more step's ``delta`` (both dicts with the PromptStat/PromptStep columns).

    A streak counts groups: if every group of the step was all-correct the streak grows by the
    step's groups, otherwise it restarts at the step's trailing run (one of the tails is 0).
    """
    out = dict(total)
    out["attempts"] += int(delta["attempts"])
    out["successes"] += int(delta["successes"])
    out["groups"] += int(delta["groups"])
    groups = int(delta["groups"])
    if groups and delta["tail_correct"] == groups:
        out["all_correct_streak"], out["all_wrong_streak"] = total["all_correct_streak"] + groups, 0
    elif groups and delta["tail_wrong"] == groups:
        out["all_correct_streak"], out["all_wrong_streak"] = 0, total["all_wrong_streak"] + groups
    else:
        out["all_correct_streak"], out["all_wrong_streak"] = int(delta["tail_correct"]), int(delta["tail_wrong"])
    out["last_step"] = int(step)
    return out


def _by_domain(keys: set[tuple[str, str]]):
    """(domain, task ids) of ``keys``, the ids of a domain in chunks of one query's IN (...) list."""
    ids: dict[str, list[str]] = {}
    for domain, task_id in sorted(keys):
        ids.setdefault(domain, []).append(task_id)
    for domain, found in ids.items():
        for k in range(0, len(found), _PROMPT_KEYS_PER_QUERY):
            yield domain, found[k:k + _PROMPT_KEYS_PER_QUERY]


def stale_prompts(conn: Any, run_id: str, step: int) -> set[tuple[str, str]]:
    """Prompts with rows at ``step`` or later: a step being re-recorded, or a crashed run's tail."""
    query = select(PromptStepRow.domain, PromptStepRow.task_id).where(
        PromptStepRow.run_id == run_id, PromptStepRow.step >= step).distinct()
    return {(d, t) for d, t in conn.execute(query)}


def stored_prompt_totals(conn: Any, run_id: str, keys: set[tuple[str, str]]) -> dict[tuple[str, str], dict]:
    t = PromptStatRow.__table__
    found: dict[tuple[str, str], dict] = {}
    for domain, chunk in _by_domain(keys):
        query = select(t).where(t.c.run_id == run_id, t.c.domain == domain, t.c.task_id.in_(chunk))
        for row in conn.execute(query).mappings():
            found[(row["domain"], row["task_id"])] = {k: v for k, v in row.items() if k != "run_id"}
    return found


def fold_deltas(totals: dict[tuple[str, str], dict], rows: list[dict]) -> dict[tuple[str, str], dict]:
    for row in rows:
        key = (row["domain"], row["task_id"])
        totals[key] = fold_prompt_delta(totals.get(key) or empty_prompt_total(*key), row, row["step"])
    return totals


def prompt_totals_from_steps(conn: Any, run_id: str, keys: set[tuple[str, str]]) -> dict[tuple[str, str], dict]:
    """Totals of ``keys`` recomputed from every stored step (the slow, always-correct path)."""
    t = PromptStepRow.__table__
    rows: list[dict] = []
    for domain, chunk in _by_domain(keys):
        query = select(t).where(t.c.run_id == run_id, t.c.domain == domain, t.c.task_id.in_(chunk))
        rows.extend(dict(r) for r in conn.execute(query).mappings())
    rows.sort(key=lambda r: r["step"])
    return fold_deltas({}, rows)  # a prompt whose every step went drops out of prompt_stats


def replace_prompt_totals(conn: Any, run_id: str, keys: set[tuple[str, str]], totals: dict) -> None:
    # delete then insert (the portable upsert); the caller inserts ``totals`` in the same transaction
    for domain, chunk in _by_domain(keys):
        conn.execute(delete(PromptStatRow).where(PromptStatRow.run_id == run_id, PromptStatRow.domain == domain,
                                                 PromptStatRow.task_id.in_(chunk)))
