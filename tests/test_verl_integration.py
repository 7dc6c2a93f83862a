"""Palestra's curriculum inside verl (``trainer.integrations.verl``), against verl 0.7.1's real parts.

verl builds our sampler itself (``create_rl_sampler`` from a data config naming it) and our dataset
(``create_rl_dataset`` from ``data.custom_cls``); batches come out of verl's own data loader and
``collate_fn``; the batch handed back is a real ``DataProto`` built the way verl's trainer builds it
(uid per prompt, ``_get_gen_batch``, repeat by rollout.n, union with the rollout's tensors, rows
reordered as batch balancing does), scored by our ``compute_score``. The store is a real SQLite
file. No model, no Ray, no GPU: what needs those (a real rollout, reward workers on Ray actors)
is not run here (docs/verl.md).
"""
from __future__ import annotations

import copy
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

verl = pytest.importorskip("verl", reason="verl is not installed (make installs verl==0.7.1; docs/verl.md)")

from omegaconf import OmegaConf  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.ray_trainer import RayPPOTrainer  # noqa: E402
from verl.utils.dataset.rl_dataset import collate_fn  # noqa: E402

from curriculum.store import StatsStore  # noqa: E402
from domains.registry import load  # noqa: E402
from trainer.integrations import verl_reward  # noqa: E402
from trainer.integrations.verl import AbstractCurriculumSampler, CurriculumSampler, PalestraDataset  # noqa: E402
from trainer.integrations.verl_reward import compute_score  # noqa: E402
from trainer.models.loading import load_tokenizer  # noqa: E402
from trainer.models.tiny_model import build_tokenizer  # noqa: E402

try:  # verl 0.7.1; later versions moved them (and dropped the curriculum sampler)
    from verl.trainer.main_ppo import create_rl_dataset, create_rl_sampler
except ImportError:
    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler

sys.path.insert(0, str(Path(__file__).parent))  # spawned verifier workers import trl_helpers from here
needs_sampler = pytest.mark.skipif(AbstractCurriculumSampler is None, reason=f"verl {verl.__version__} has no "
                                   "curriculum sampler (0.7.1 is the last release with one)")

PROMPTS, N = 8, 2  # data.train_batch_size, actor_rollout_ref.rollout.n
MODULE = "pkg://trainer.integrations.verl"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The built-in tiny model's tokenizer, saved and loaded as a model folder's (no download)."""
    folder = tmp_path_factory.mktemp("tiny")
    build_tokenizer().save_pretrained(folder)
    return load_tokenizer(str(folder), tiny=True)


@pytest.fixture(autouse=True)
def _stop_verifier_pools():
    yield
    verl_reward.close_verifiers()


def data_config(tmp_path, sampler: bool = True, **palestra):
    """verl's ``config.data`` as a run would give it, with ``palestra`` under ``data``."""
    section = {"domains": ["arithmetic", "fractions"], "steps": 3, "policy": {"type": "learnability"},
               "difficulty": {"type": "fixed"}, "store_url": f"sqlite:///{tmp_path / 'palestra.db'}",
               "group_size": "${actor_rollout_ref.rollout.n}", **palestra}
    data = {"train_batch_size": PROMPTS, "dataloader_num_workers": 0, "shuffle": not sampler,
            "max_prompt_length": 64, "seed": 0, "custom_cls": {"path": MODULE, "name": "PalestraDataset"},
            "sampler": {"class_path": MODULE if sampler else None,
                        "class_name": "CurriculumSampler" if sampler else None},
            "palestra": section}
    if not sampler:
        data["shuffle"] = False
    root = OmegaConf.create({"data": data, "actor_rollout_ref": {"rollout": {"n": N}}})
    return root.data


def verl_loader(config, tokenizer):
    """The train dataset, sampler and data loader exactly as verl's TaskRunner and trainer make them."""
    dataset = create_rl_dataset("palestra://train", config, tokenizer, None)
    sampler = create_rl_sampler(config, dataset)
    loader = StatefulDataLoader(dataset=dataset, batch_size=config.train_batch_size, num_workers=0,
                                drop_last=True, collate_fn=collate_fn, sampler=sampler)
    return dataset, sampler, loader


def slots(batch: DataProto) -> Counter:
    return Counter((e["domain"], e["level"]) for e in batch.non_tensor_batch["extra_info"])


def scored_batch(batch_dict: dict, tokenizer, completions) -> DataProto:
    """The batch verl's trainer hands ``sampler.update`` and ``dataset.on_batch_end``: a uid per
    prompt, the generation keys popped, repeated by n, joined with the rollout (prompt and response
    tokens, masks, rewards on the last response token) and reordered as batch balancing does.
    ``completions(task_json, k)`` writes the k-th completion of a prompt."""
    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array([f"uid-{i}-{np.random.rand()}" for i in range(len(batch))], dtype=object)
    RayPPOTrainer._get_gen_batch(None, batch)  # pops what the rollout takes; the reward keys stay
    batch = batch.repeat(N, interleave=True)
    gts = [r["ground_truth"] for r in batch.non_tensor_batch["reward_model"]]
    texts = [completions(json.loads(gt), k % N) for k, gt in enumerate(gts)]
    scores = [compute_score(s, t, gt, dict(e), verifier_workers=1) for s, t, gt, e in
              zip(batch.non_tensor_batch["data_source"], texts, gts, batch.non_tensor_batch["extra_info"])]
    batch = batch.union(rollout(tokenizer, texts, scores))
    batch.reorder(torch.randperm(len(batch), generator=torch.Generator().manual_seed(0)))
    return batch


def rollout(tokenizer, texts: list[str], scores: list[dict]) -> DataProto:
    """What the agent loop and the reward loop add to a batch (verl 0.7.1's keys)."""
    rows, prompt_len = len(texts), 4
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    width = max(map(len, ids))
    responses = torch.full((rows, width), tokenizer.pad_token_id)
    response_mask = torch.zeros(rows, width, dtype=torch.long)
    for i, row in enumerate(ids):
        responses[i, :len(row)], response_mask[i, :len(row)] = torch.tensor(row), 1
    prompts = torch.zeros(rows, prompt_len, dtype=torch.long)
    attention = torch.cat([torch.ones(rows, prompt_len, dtype=torch.long), response_mask], dim=1)
    rm_scores = torch.zeros(rows, width)
    rm_scores[torch.arange(rows), response_mask.sum(1) - 1] = torch.tensor([s["score"] for s in scores])
    tensors = {"prompts": prompts, "responses": responses, "response_mask": response_mask,
               "input_ids": torch.cat([prompts, responses], 1), "attention_mask": attention,
               "position_ids": torch.cumsum(attention, 1) - 1, "rm_scores": rm_scores,
               "token_level_scores": rm_scores, "token_level_rewards": rm_scores,
               "old_log_probs": torch.zeros(rows, width), "advantages": torch.zeros(rows, width),
               "returns": torch.zeros(rows, width)}
    non_tensors = {key: np.array([s[key] for s in scores]) for key in scores[0]}
    non_tensors["__num_turns__"] = np.full(rows, 2, dtype=np.int32)
    return DataProto.from_dict(tensors, non_tensors, meta_info={"reward_extra_keys": list(scores[0])})


def by_domain(right: dict[str, int]):
    """Completions: per domain, how many of a prompt's N are the domain's reference (the rest are wrong)."""
    domains = {name: load(name) for name in right}

    def write(task_json: dict, k: int) -> str:
        domain = domains[task_json["domain"]]
        return domain.reference(domain.task_from_json(task_json)) if k < right[task_json["domain"]] else "\\boxed{-7777}"
    return write


# -- the tests ---------------------------------------------------------------------------------------
@needs_sampler
def test_verl_builds_our_sampler_and_each_batch_holds_its_plans_slots(tmp_path, tokenizer):
    config = data_config(tmp_path)
    dataset, sampler, loader = verl_loader(config, tokenizer)
    assert isinstance(dataset, PalestraDataset) and isinstance(sampler, AbstractCurriculumSampler)
    assert isinstance(sampler, CurriculumSampler) and len(loader) == 3  # data.palestra.steps
    batch = DataProto.from_single_dict(next(iter(loader)))
    assert slots(batch) == Counter(dataset.steps.plans[1].counts) and sum(slots(batch).values()) == PROMPTS
    # the keys of verl 0.7.1's RLHFDataset rows, and the task named in extra_info
    assert set(batch.batch.keys()) == {"dummy_tensor"}
    assert {"raw_prompt", "data_source", "reward_model", "extra_info", "index", "tools_kwargs",
            "interaction_kwargs"} <= set(batch.non_tensor_batch)
    info = batch.non_tensor_batch["extra_info"][0]
    assert {"index", "domain", "level", "task_id", "palestra_step", "palestra_slot", "palestra_run"} <= set(info)
    assert info["palestra_step"] == 1 and info["palestra_run"] == dataset.run_id
    task = json.loads(batch.non_tensor_batch["reward_model"][0]["ground_truth"])
    assert task["id"] == info["task_id"] and batch.non_tensor_batch["raw_prompt"][0] == task["prompt"]
    assert batch.non_tensor_batch["data_source"][0] == f"palestra/{task['domain']}"
    # the validation set: Palestra's held-out tasks, which training never draws
    heldout = create_rl_dataset("palestra://heldout", config, tokenizer, None)
    assert len(heldout) == 16 * sum(len(d.levels) for d in dataset.domains.values())
    assert "palestra_step" not in heldout[0]["extra_info"]
    assert not {t.id for t in heldout.heldout} & {e["task_id"] for e in batch.non_tensor_batch["extra_info"]}
    dataset.close()


@needs_sampler
def test_a_scored_batch_is_recorded_once_through_both_hooks_and_moves_the_mix(tmp_path, tokenizer):
    dataset, sampler, loader = verl_loader(data_config(tmp_path), tokenizer)
    batches = iter(loader)
    first = next(batches)
    # arithmetic: both completions right (success 1: nothing to learn); fractions: one of two (0.5)
    scored = scored_batch(first, tokenizer, by_domain({"arithmetic": 2, "fractions": 1}))
    assert sorted(scored.non_tensor_batch["score"]) == [0.0] * 4 + [1.0] * 12
    sampler.update(batch=scored)  # verl 0.7.1 calls both, in this order
    dataset.on_batch_end(batch=scored)
    again = copy.deepcopy(scored)  # the same rows in another object and order: still recorded once
    again.reorder(torch.arange(len(again)).flip(0))
    dataset.on_batch_end(batch=again)
    assert dataset.steps.recorded_steps == [1]

    store = StatsStore(f"sqlite:///{tmp_path / 'palestra.db'}")
    results = store.results(dataset.run_id, 1)
    assert len(results) == PROMPTS * N  # every completion once
    assert Counter(r["group_index"] for r in results) == Counter({g: N for g in range(PROMPTS)})
    texts = {r["completion"] for r in results if r["domain"] == "arithmetic" and r["reward"] == 1.0}
    assert all("\\boxed{" in t for t in texts)  # completions decoded from verl's response tokens
    success = {d: np.mean([r["correct"] for r in results if r["domain"] == d]) for d in ("arithmetic", "fractions")}
    assert success == {"arithmetic": 1.0, "fractions": 0.5}

    # learnability p(1-p): the next plan gives fractions (p=0.5) more than arithmetic (p=1)
    second = DataProto.from_single_dict(next(batches))
    plan1, plan2 = dataset.steps.plans[1], dataset.steps.plans[2]
    w1, w2 = (dict(zip(p.domains, p.weights)) for p in (plan1, plan2))
    assert w1["arithmetic"] == pytest.approx(w1["fractions"])
    assert w2["fractions"] > w2["arithmetic"]
    assert slots(second) == Counter(plan2.counts) and slots(second) != slots(DataProto.from_single_dict(first))
    assert [v["step"] for v in store.plan_vectors(dataset.run_id)] == [1]
    store.close()
    dataset.close()


def test_the_dataset_alone_records_through_on_batch_end_as_later_verls_use_it(tmp_path, tokenizer):
    config = data_config(tmp_path, sampler=False, steps=2)
    dataset = create_rl_dataset("palestra://train", config, tokenizer, None)
    sampler = create_rl_sampler(config, dataset)  # shuffle off: verl's SequentialSampler
    assert isinstance(sampler, torch.utils.data.SequentialSampler)
    loader = StatefulDataLoader(dataset=dataset, batch_size=PROMPTS, num_workers=0, drop_last=True,
                                collate_fn=collate_fn, sampler=sampler)
    batches = iter(loader)
    dataset.on_batch_end(batch=scored_batch(next(batches), tokenizer, by_domain({"arithmetic": 1, "fractions": 1})))
    assert dataset.steps.recorded_steps == [1]
    assert slots(DataProto.from_single_dict(next(batches))) == Counter(dataset.steps.plans[2].counts)
    # verl's legacy trainer calls no hook after the last step: closing marks the run finished
    dataset.close()
    store = StatsStore(f"sqlite:///{tmp_path / 'palestra.db'}")
    assert store.run(dataset.run_id)["status"] == "finished"
    store.close()
    with pytest.raises(RuntimeError, match="plan step 3 of a run of 2"):
        next(iter(loader))  # a second epoch


def test_a_step_that_lost_groups_is_recorded_with_the_rest_when_a_later_one_comes_back(tmp_path, tokenizer):
    """A trainer that filters groups (DAPO-style) hands back a step without some of them: it is recorded
    with those it has once a later step comes back (verl trains in order), or when the run closes."""
    config = data_config(tmp_path, sampler=False, steps=4)
    dataset = create_rl_dataset("palestra://train", config, tokenizer, None)
    loader = StatefulDataLoader(dataset=dataset, batch_size=PROMPTS, num_workers=0, drop_last=True,
                                collate_fn=collate_fn, sampler=create_rl_sampler(config, dataset))
    write, batches = by_domain({"arithmetic": 1, "fractions": 1}), iter(loader)
    for step in (1, 2):
        scored = scored_batch(next(batches), tokenizer, write)
        slots_of = np.array([e["palestra_slot"] for e in scored.non_tensor_batch["extra_info"]])
        kept = scored.select_idxs(slots_of != 3)  # slot 3's group filtered out
        dataset.on_batch_end(batch=kept)
        dataset.on_batch_end(batch=kept)  # again, before the step is recorded: its groups are taken once
        assert dataset.steps.recorded_steps == [1][:step - 1]
    dataset.close()
    assert dataset.steps.recorded_steps == [1, 2]
    store = StatsStore(f"sqlite:///{tmp_path / 'palestra.db'}")
    for step in (1, 2):
        assert len({r["group_index"] for r in store.results(dataset.run_id, step)}) == PROMPTS - 1
    assert store.run(dataset.run_id)["status"] == "interrupted"  # 2 of 4 steps
    store.close()


def test_the_validation_set_tops_each_domain_up_to_its_minimum_of_tasks(tmp_path, tokenizer):
    options = {"heldout_tasks_per_level": 2}
    plain = create_rl_dataset("palestra://heldout", data_config(tmp_path, **options), tokenizer, None)
    topped = create_rl_dataset("palestra://heldout", data_config(tmp_path, heldout_min_tasks_per_domain=12, **options),
                               tokenizer, None)
    levels = {name: len(domain.levels) for name, domain in plain.domains.items()}
    assert Counter(t.domain for t in plain.heldout) == {name: 2 * n for name, n in levels.items()}
    # 12 tasks over a domain's levels: ceil(12 / levels) at each, never fewer than the 2 asked a level
    assert Counter(t.domain for t in topped.heldout) == {name: max(2, -(-12 // n)) * n for name, n in levels.items()}
    assert all(n * 2 < 12 for n in levels.values())  # so the minimum is what changed the count


def test_the_reward_function_scores_from_the_row_alone_and_never_raises(tmp_path, tokenizer):
    dataset = create_rl_dataset("palestra://heldout", data_config(tmp_path), tokenizer, None)
    row = dataset[0]
    gt, info = row["reward_model"]["ground_truth"], row["extra_info"]
    task = load(info["domain"]).task_from_json(json.loads(gt))
    right = load(info["domain"]).reference(task)
    for in_process in (False, True):
        assert compute_score(row["data_source"], right, gt, dict(info), in_process=in_process)["score"] == 1.0
        wrong = compute_score(row["data_source"], "\\boxed{-7777}", gt, dict(info), in_process=in_process)
        assert wrong["score"] == 0.0 and wrong["palestra_status"] == "wrong"
    crashing = {**info, verl_reward.LOAD_KEY: verl_reward.load_spec(["trl_helpers:CRASHING"], {})}
    crash_task = json.dumps({**json.loads(gt), "domain": "crashing"})
    broken = [compute_score("x", "1", crash_task, dict(crashing), verifier_workers=1),  # raises in a worker
              compute_score("x", "1", crash_task, dict(crashing), in_process=True),
              compute_score("x", "1", "not json", dict(info)),
              compute_score("x", "1", gt, None),
              compute_score("x", "1", gt, {**info, verl_reward.LOAD_KEY: '{"domains": ["no_such_domain"]}'})]
    for score in broken:
        assert score["score"] == 0.0 and score["palestra_status"] == "error" and score["palestra_unscored"] == 1.0
        assert set(score) == {"score", *verl_reward.SCORE_KEYS}  # the same keys for every row, as verl needs


@pytest.mark.parametrize("change, message", [
    ({"palestra": None}, "data.palestra: missing"),
    ({"palestra": {"domains": ["arithmetic"]}}, "data.palestra.steps: Field required"),
    ({"palestra": {"domains": ["arithmetic"], "steps": 2, "policy": {"type": "learnability", "floor": 3}}},
     "data.palestra.policy.floor: "),
    ({"palestra": {"domains": ["arithmetic"], "steps": 2, "epochs": 1}}, "data.palestra.epochs: Extra inputs"),
    ({"palestra": {"domains": ["arithmetc"], "steps": 2}}, "data.palestra.domains: unknown domain 'arithmetc'"),
    ({"dataloader_num_workers": 8}, "data.dataloader_num_workers must be 0"),
    ({"sampler": {"class_path": None}, "shuffle": True}, "data.shuffle must be False"),
])
def test_a_bad_setting_is_one_line(tmp_path, change, message):
    config = data_config(tmp_path)
    for key, value in change.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    with pytest.raises(ValueError) as caught:
        PalestraDataset("palestra://train", None, None, config)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="palestra://train"):
        PalestraDataset("~/data/gsm8k/train.parquet", None, None, data_config(tmp_path))


@pytest.mark.skipif(AbstractCurriculumSampler is not None, reason="this verl has the curriculum sampler")
def test_without_the_curriculum_sampler_the_sampler_says_to_use_the_dataset_alone(tmp_path, tokenizer):
    dataset = create_rl_dataset("palestra://train", data_config(tmp_path, sampler=False), tokenizer, None)
    with pytest.raises(ImportError, match="trainer.use_v1=False"):
        CurriculumSampler(dataset, None)
    dataset.close()


@needs_sampler
def test_the_example_cluster_config_composes_with_verls_and_builds_our_parts(tmp_path, tokenizer):
    """scripts/verl/palestra_grpo.yaml (never run on a GPU here) as verl 0.7.1's main_ppo composes it:
    our dataset, sampler and reward function come out of it, wired as documented."""
    from hydra import compose, initialize_config_dir
    from verl.experimental.reward_loop.reward_loop import migrate_legacy_reward_impl
    from verl.trainer.ppo.reward import get_custom_reward_fn

    folder = Path(__file__).resolve().parents[1] / "scripts" / "verl"
    with initialize_config_dir(config_dir=str(folder), version_base=None):
        config = compose("palestra_grpo", overrides=[f"data.palestra.store_url=sqlite:///{tmp_path / 'p.db'}"])
    config = migrate_legacy_reward_impl(config)
    assert config.data.palestra.group_size == config.actor_rollout_ref.rollout.n == 8
    assert config.trainer.total_training_steps == config.data.palestra.steps
    dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, None)
    sampler = create_rl_sampler(config.data, dataset)
    assert isinstance(dataset, PalestraDataset) and isinstance(sampler, CurriculumSampler)
    assert len(sampler) // config.data.train_batch_size == config.data.palestra.steps
    row = dataset[0]
    score = get_custom_reward_fn(config)(data_source=row["data_source"], solution_str="no answer",
                                         ground_truth=row["reward_model"]["ground_truth"],
                                         extra_info=dict(row["extra_info"]))
    assert score["score"] == 0.0 and score["palestra_unscored"] == 0.0  # judged wrong, not unscored
    dataset.close("interrupted")
