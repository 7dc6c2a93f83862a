"""Planned against trained share per domain: a short real GRPO run with dynamic sampling logs, every
step, how many groups of each domain reached the update, and `palestra stats` shows both shares."""
import json
from collections import Counter

import pytest

from curriculum.cli import main
from curriculum.run_summary import domain_stats
from curriculum.store import StatsStore
from test_end_to_end import plugin_package, tiny_config  # noqa: F401  (plugin_package is a fixture)
from trainer.recipe.grpo import GRPORecipe


def test_each_step_logs_the_groups_trained_per_domain_and_stats_shows_both_shares(tmp_path, plugin_package, capsys):
    # the untrained model fails every arithmetic task, so its groups agree, are dropped and refilled:
    # arithmetic trains less than it was planned, digit_variety more
    config = tiny_config(tmp_path, trainer={"steps": 2, "dynamic_sampling": True, "max_refill_rounds": 1},
                         sft={"steps": 0})
    recipe = GRPORecipe(config)
    seen = []
    try:
        recipe.setup()
        collect = recipe.collector.collect_step

        def remember(*args, **kwargs):
            seen.append(collect(*args, **kwargs))
            return seen[-1]

        recipe.collector.collect_step = remember
        metrics = [recipe.train_step(step) for step in (1, 2)]
    finally:
        recipe.cleanup()

    names = ("digit_variety", "arithmetic")
    kept_total, planned_total = Counter(), Counter()
    for logged, rollouts in zip(metrics, seen):
        kept = Counter(rollouts.generated[b].tasks[p].domain for b, p in rollouts.kept)
        assert {d: logged[f"domain/{d}/trained"] for d in names} == {d: kept[d] for d in names}  # zeros too
        assert sum(kept.values()) == len(rollouts.batch.tasks)
        kept_total.update(kept)
        planned_total.update({d: logged[f"domain/{d}/prompts"] for d in names})
    generated = sum(len(b.tasks) for r in seen for b in r.generated)
    assert generated > sum(kept_total.values())  # some groups were left out: the two counts differ

    url = f"sqlite:///{tmp_path / 'run' / 'palestra.db'}"
    with StatsStore(url) as store:
        [run] = store.runs()
        stored = store.metrics(run["id"])
        rows = {r["domain"]: r for r in domain_stats(store, run["id"])}
    assert [sum(m[f"domain/{d}/trained"] for m in stored) for d in names] == [kept_total[d] for d in names]
    assert sum(r["planned_share"] for r in rows.values()) == pytest.approx(1.0)
    assert sum(r["trained_share"] for r in rows.values()) == pytest.approx(1.0)
    for d in names:
        assert rows[d]["planned_share"] == pytest.approx(planned_total[d] / sum(planned_total.values()))
        assert rows[d]["trained_share"] == pytest.approx(kept_total[d] / sum(kept_total.values()))

    capsys.readouterr()  # what the run printed
    assert main(["stats", "--db", url, "--run", run["id"][:8]]) == 0
    header, *lines = capsys.readouterr().out.splitlines()[1:]
    columns = header.split()
    assert {"planned_share", "trained_share"} <= set(columns)
    for line in lines:
        cells = dict(zip(columns, line.split()))
        assert float(cells["planned_share"]) == pytest.approx(rows[cells["domain"]]["planned_share"], abs=5e-4)
        assert float(cells["trained_share"]) == pytest.approx(rows[cells["domain"]]["trained_share"], abs=5e-4)
    assert main(["stats", "--db", url, "--run", run["id"], "--json"]) == 0
    shown = {r["domain"]: r for r in json.loads(capsys.readouterr().out)["domains"]}
    assert {d: shown[d]["trained_share"] for d in names} == pytest.approx({d: rows[d]["trained_share"] for d in names})
