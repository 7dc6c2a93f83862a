"""verl's reward function for Palestra's tasks, and how a task travels to it.

verl scores completions in ``RewardLoopWorker`` Ray actors, processes apart from the one that
holds the dataset and the curriculum. What reaches them of a prompt row is its ``data_source``,
``reward_model["ground_truth"]`` and ``extra_info`` only. So a row carries its whole task:

- ``ground_truth`` is the task's JSON as text, exactly what the ``"task"`` of a ``palestra verify``
  line holds (``Task.to_json``), read back with the domain's own ``task_from_json``;
- ``extra_info["palestra_domains"]`` is how the run loaded its domains (the names and
  ``domain_options`` as the run was given them, as JSON text): each worker process loads them once
  from it, exactly as the run did, and keeps them with a verifier pool.

``compute_score`` (``reward.custom_reward_function``) scores through Palestra's local verifier pool
(worker processes with per-call deadlines: a crashing or hanging verifier is ``status=error`` or
``timeout`` with reward 0); with ``in_process=True`` (a ``reward_kwargs`` entry) it calls the
verifier in the calling thread, with the pool's error handling but no deadline. It never raises:
a row it cannot even rebuild scores 0 too. It returns a dict with the same keys for every row, as
verl requires; verl puts them into the batch, where the curriculum reads the verdicts back.

Nothing here imports verl: the module is loaded by verl (``pkg://trainer.integrations.verl_reward``
or its file path) in each reward worker.
"""
from __future__ import annotations

import atexit
import json
import threading
import time
from typing import Any

from domains.api import Domain, Task, VerifyResult, one_line
from domains.registry import load_all
from domains.verify.pool import VerifierPool, verify_guarded

LOAD_KEY = "palestra_domains"  # extra_info: the run's domains and options, as JSON text
# the reward_extra_info keys compute_score returns, besides verl's "score"
SCORE_KEYS = ("acc", "palestra_status", "palestra_unscored", "palestra_latency_s")


def load_spec(domains: list[str], domain_options: dict[str, dict] | None) -> str:
    """The run's domains as JSON text: what a reward worker loads them from."""
    return json.dumps({"domains": list(domains), "domain_options": domain_options or {}}, sort_keys=True)


def reward_fields(task: Task, spec: str) -> dict[str, Any]:
    """The row keys verl hands the reward function: ``data_source``, ``reward_model`` and the
    ``extra_info`` entries that name the task (the dataset adds its own to ``extra_info``)."""
    return {
        "data_source": f"palestra/{task.domain}",
        "reward_model": {"style": "rule", "ground_truth": json.dumps(task.to_json(), ensure_ascii=False)},
        "extra_info": {"domain": task.domain, "level": int(task.level), "task_id": task.id, LOAD_KEY: spec},
    }


class _Verifiers:
    """A worker process's loaded domains and its verifier pool, for one load spec."""

    def __init__(self, spec: str, workers: int, in_process: bool) -> None:
        data = json.loads(spec)
        self.domains: dict[str, Domain] = load_all(list(data["domains"]), data.get("domain_options") or {})
        self.pool = None if in_process else VerifierPool(self.domains, workers=workers)

    def verify(self, task: Task, completion: str) -> tuple[VerifyResult, float]:
        if self.pool is None:
            started = time.monotonic()
            return verify_guarded(self.domains[task.domain], task, completion), time.monotonic() - started
        verdict = self.pool.submit(task, completion).result()
        return verdict.result, verdict.latency_s

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


_LOADED: dict[tuple[str, int, bool], _Verifiers] = {}
_LOCK = threading.Lock()  # verl calls a sync reward function from several executor threads at once


def _verifiers(spec: str, workers: int, in_process: bool) -> _Verifiers:
    key = (spec, int(workers), bool(in_process))
    with _LOCK:
        found = _LOADED.get(key)
        if found is None:
            found = _LOADED[key] = _Verifiers(spec, workers, in_process)
        return found


@atexit.register
def close_verifiers() -> None:
    """Stop every verifier pool this process started (at exit, or by hand)."""
    with _LOCK:
        loaded = list(_LOADED.values())
        _LOADED.clear()
    for verifiers in loaded:
        verifiers.close()


def rebuild_task(ground_truth: str, extra_info: dict | None, *, workers: int = 2,
                 in_process: bool = False) -> tuple[Task, _Verifiers]:
    """The task of a row, from its ground truth and extra_info alone, and the verifiers of its run."""
    if not isinstance(extra_info, dict) or not isinstance(extra_info.get(LOAD_KEY), str):
        raise ValueError(f"extra_info has no {LOAD_KEY!r}: not a row of Palestra's verl dataset")
    verifiers = _verifiers(extra_info[LOAD_KEY], workers, in_process)
    data = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    name = data.get("domain") if isinstance(data, dict) else None
    if name not in verifiers.domains:
        raise ValueError(f"the task's domain {name!r} is not one of the run's: {', '.join(sorted(verifiers.domains))}")
    return verifiers.domains[name].task_from_json(data), verifiers


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  verifier_workers: int = 2, in_process: bool = False, **_verl_kwargs: Any) -> dict[str, Any]:
    """verl's reward function: the completion's reward from its domain's verifier, 0 on any failure
    (never raised). ``verifier_workers`` and ``in_process`` can be set in ``reward_kwargs``."""
    started = time.monotonic()
    try:
        task, verifiers = rebuild_task(ground_truth, extra_info, workers=verifier_workers, in_process=in_process)
        result, latency = verifiers.verify(task, solution_str if isinstance(solution_str, str) else "")
    except Exception as exc:  # a row that cannot be rebuilt, a domain that cannot load: no verdict
        result = VerifyResult.no_verdict(f"palestra could not score this row: {type(exc).__name__}: {one_line(exc)}")
        latency = time.monotonic() - started
    return score_dict(result, latency)


def score_dict(result: VerifyResult, latency_s: float) -> dict[str, Any]:
    """What ``compute_score`` returns: verl's ``score`` and the verdict, all numbers but the status
    (verl's validation metrics average the numeric keys and skip the text ones)."""
    return {"score": float(result.reward), "acc": float(result.correct), "palestra_status": result.status.value,
            "palestra_unscored": float(not result.scored), "palestra_latency_s": float(latency_s)}
