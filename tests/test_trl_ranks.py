"""TRL's GRPOTrainer on two processes with a Palestra curriculum (``trainer.integrations.trl_ranks``).

The first tests need no process group. The last one launches two gloo ranks on the CPU (accelerate
launch, the tiny model) that play, one after another in the same processes, a run of four steps with
held-out evaluation, the same run stopped after step 3 and resumed from its checkpoint-2, and a run
over the eight built-in domains with tool episodes; meanwhile the test's own process plays the
first run in one process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from curriculum.cli import main as cli
from curriculum.store import StatsStore
from domains.api import Task
from domains.registry import load_all
from trainer.distributed import World
from trainer.integrations.trl_ranks import own_rng_states, world_of

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # trl_helpers' domains, for the verifier workers too
import trl_ranks_helpers  # noqa: E402

SCORED = ["trl_helpers:BY_LENGTH", "trl_helpers:CRASHING"]  # always correct, never scored: plans need no luck
EIGHT = ["arithmetic", "linear_equations", "fractions", "code_functions", "code_lists", "tool_calculator",
         "tool_kv_store", "tool_lookup"]  # the main job's built-in domains (conf/config.yaml)


def test_several_processes_need_a_process_group():
    with pytest.raises(ValueError, match="^GRPOConfig says 2 processes but no process group is running: start the "
                                         "script with accelerate launch \\(or torchrun\\)$"):
        world_of(SimpleNamespace(world_size=2, process_index=0, local_process_index=0))
    assert world_of(SimpleNamespace(world_size=1)) == World()


def test_a_checkpoint_resumes_on_as_many_processes_as_saved_it():
    saved = {"rng": "rank 0's", "rank_rng": ["rank 0's", "rank 1's"]}
    assert own_rng_states(World(rank=1, size=2), saved) == "rank 1's"
    assert own_rng_states(World(), {"rng": "the one"}) == "the one"  # saved by one process
    with pytest.raises(ValueError, match="saved by 2 process\\(es\\), this run has 1: resume with the number"):
        own_rng_states(World(), saved)


def _launch(runs: list[dict], folder: Path) -> subprocess.Popen:
    plan = folder / "runs.json"
    plan.write_text(json.dumps(runs))
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               str(HERE / "trl_ranks_helpers.py"), str(plan)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",  # gloo on the CPU, also beside a GPU
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=HERE.parent, env=env)


def _stored(out: Path) -> dict[str, list]:
    """What the store holds of its one run, without what differs between any two runs (the run id,
    row ids, verification latency)."""
    def kept(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in row.items() if k not in {"run_id", "id", "latency_s"}} for row in rows]

    with StatsStore(f"sqlite:///{out / 'palestra.db'}") as store:
        [run] = store.runs()  # rank 0 alone opened the store: one run, not one per rank
        run_id = run["id"]
        return {"results": kept(store.results(run_id)), "plans": kept(store.plans(run_id)),
                "vectors": kept(store.plan_vectors(run_id)), "tasks": store.tasks(run_id),
                "metrics": kept(store.metrics(run_id)), "status": store.run(run_id)["status"]}


def _groups(results: list[dict]) -> Counter:
    return Counter((r["step"], r["group_index"], r["task_id"]) for r in results)


@pytest.mark.slow  # one launch of two ranks playing four TRL runs, beside a run in this process
def test_two_processes_record_every_group_once_and_plan_as_one_process(tmp_path):
    from trainer.models.tiny_model import build_tiny_model

    torch.manual_seed(0)
    model = str(build_tiny_model(tmp_path / "tiny", hidden_size=32, layers=1, heads=2, kv_heads=1,
                                 intermediate_size=64))
    # 3 prompts x 4 completions: each rank gets 6 rows, so the second prompt's group straddles the ranks
    # held-out evaluation at steps 2 and 4, on rank 0 (its tasks are kept out of every run's draws)
    scored = dict(model=model, domains=SCORED, policy="prioritized", prompts=3, group=4, steps=4,
                  evaluation={"every": 2, "tasks_per_level": 1, "at_start": False})
    # 9 prompts x 2 completions over the eight domains: the fifth group straddles the ranks
    tools = dict(model=model, domains=EIGHT, policy="uniform", prompts=9, group=2, steps=2, rollout=True)
    cut = tmp_path / "cut"
    started = time.perf_counter()
    two = _launch([{**scored, "out": str(tmp_path / "two")}, {**scored, "out": str(cut), "stop_after": 3},
                   {**scored, "out": str(cut), "resume": str(cut / "checkpoint-2")},
                   {**tools, "out": str(tmp_path / "tools")}], tmp_path)
    trl_ranks_helpers.train({**scored, "out": str(tmp_path / "one")})  # meanwhile, one process
    out, _ = two.communicate(timeout=1200)
    assert two.returncode == 0, out.decode()[-4000:]
    print(f"two ranks, four runs: {time.perf_counter() - started:.1f} s")

    one, two_ranks = _stored(tmp_path / "one"), _stored(tmp_path / "two")
    # every step's groups stored exactly once: 3 groups of 4 completions, none twice, none missing
    per_step = Counter(r["step"] for r in two_ranks["results"])
    assert per_step == {step: 3 * 4 for step in range(1, 5)}
    assert set(_groups(two_ranks["results"]).values()) == {4}
    # the mix and the levels adapt as in one process: these rewards' successes do not depend on the
    # completions, so the plans, the tasks drawn and each group's task are the one-process run's
    assert two_ranks["plans"] == one["plans"] and two_ranks["vectors"] == one["vectors"]
    assert two_ranks["tasks"] == one["tasks"]
    assert _groups(two_ranks["results"]) == _groups(one["results"])
    given = {(p["step"], p["domain"]): p["n_prompts"] for p in two_ranks["plans"]}
    assert given.get((1, "by_length")) and not given.get((4, "by_length"))  # they did adapt: solved, it left
    assert two_ranks["status"] == "finished"
    assert [row["step"] for row in two_ranks["metrics"] if "heldout/macro" in row] == [2, 4]

    # stopped after step 3 and resumed from checkpoint-2 on two ranks: the store is the whole run's,
    # completions and held-out evaluations included (each rank took its own RNG states back)
    resumed = _stored(cut)
    for key in ("plans", "vectors", "tasks", "results", "metrics", "status"):
        assert resumed[key] == two_ranks[key], key

    # the CLI reads a two-rank store as any other run's: the per-domain table and the report page
    url = f"sqlite:///{tmp_path / 'two' / 'palestra.db'}"
    with StatsStore(url) as store:
        [run] = store.runs()
    assert cli(["stats", "--db", url, "--run", run["id"]]) == 0
    assert cli(["report", "--db", url, "--run", run["id"], "--out", str(tmp_path / "report")]) == 0
    assert "by_length" in (tmp_path / "report" / "index.html").read_text()

    # tool episodes, played on each rank by the rollout function, graded on their transcripts
    with_tools = _stored(tmp_path / "tools")
    assert Counter(r["step"] for r in with_tools["results"]) == {1: 9 * 2, 2: 9 * 2}
    assert set(_groups(with_tools["results"]).values()) == {2}
    assert {r["domain"] for r in with_tools["results"]} == set(EIGHT)
    episodes = [r for r in with_tools["results"] if r["domain"].startswith("tool_")]
    assert all([m["role"] for m in json.loads(r["completion"])] == ["assistant", "tool", "assistant"]
               for r in episodes)
    domains = load_all(EIGHT)
    for result in episodes:  # the stored text is the episode's transcript, and its reward the verifier's
        task = Task.from_json(with_tools["tasks"][result["task_id"]])
        assert result["reward"] == domains[result["domain"]].verify(task, result["completion"]).reward
