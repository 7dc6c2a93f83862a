"""Palestra's curriculum inside verl's PPO/GRPO trainer: per-domain statistics in the store,
adaptive mixing and difficulty, with verl's training loop unchanged (docs/verl.md).

    data.custom_cls.path=pkg://trainer.integrations.verl   data.custom_cls.name=PalestraDataset
    data.sampler.class_path=pkg://trainer.integrations.verl data.sampler.class_name=CurriculumSampler
    data.train_files=palestra://train data.val_files=palestra://heldout data.dataloader_num_workers=0
    +data.palestra.domains=[arithmetic,fractions] +data.palestra.steps=100
    reward.custom_reward_function.path=pkg://trainer.integrations.verl_reward

How the loops line up. One verl train batch (``data.train_batch_size`` prompts, or
``gen_batch_size``) is one Palestra plan step. ``PalestraDataset`` is verl's dataset class: an
index is only a slot of the batch; when the data loader asks for the first slot of a batch the
dataset asks the Curriculum for the next plan and draws its tasks, one per slot (the plan's
(domain, level) counts laid over the batch), and yields rows in the shape of verl's
``RLHFDataset``. The rows carry their task to verl's reward workers (``verl_reward``). After the
update, verl hands the scored batch to ``CurriculumSampler.update`` (verl 0.7.1) and to
``PalestraDataset.on_batch_end`` (0.7.1, and the legacy trainer of later versions, which dropped
the sampler); either records the step (``verl_steps``), and the other finds it recorded. With
``dataloader_num_workers=0`` verl's loader draws a batch only when it is needed, so step t's
results shape step t+1's plan: no lag.

``data.val_files=palestra://heldout`` makes the validation set Palestra's held-out tasks (the ones
training never draws), scored by the same reward function, never recorded.

This is the one module that imports verl (the sampler's base class; none of it on verl >= 0.8,
which has no curriculum sampler). Not supported: multi-turn tool domains, prompt selection,
resuming a verl checkpoint into the same Palestra run (a resumed job starts a new run).
"""
from __future__ import annotations

import atexit
import copy
import logging
import weakref
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field, ValidationError
from torch.utils.data import Dataset, Sampler

from curriculum.config import (DifficultyConfig, LearnabilityConfig, PolicyConfig, ThresholdDifficultyConfig,
                               check_against_domains, describe_error)
from curriculum.curriculum import Curriculum, domain_levels
from curriculum.store import StatsStore
from curriculum.store_urls import default_store_url
from domains.api import Domain, Task
from domains.config import StrictModel
from domains.registry import DomainError, load_all
from trainer.recipe.evaluate import heldout_tasks
from trainer.integrations.verl_reward import load_spec, reward_fields
from trainer.integrations.verl_steps import VerlSteps

try:  # verl 0.7.1 is the last release with a curriculum sampler; later ones use the dataset alone
    from verl.experimental.dataset.sampler import AbstractCurriculumSampler
except ImportError:
    AbstractCurriculumSampler = None

TRAIN_FILES, HELDOUT_FILES = "palestra://train", "palestra://heldout"
log = logging.getLogger(__name__)


class PalestraSection(StrictModel):
    """``data.palestra`` in verl's config: the Palestra run."""

    domains: list[str] = Field(min_length=1)  # names, patterns or module:OBJECT paths
    domain_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    steps: int = Field(gt=0)  # plan steps = verl training steps of the run
    policy: PolicyConfig = Field(default_factory=LearnabilityConfig)
    difficulty: DifficultyConfig = Field(default_factory=ThresholdDifficultyConfig)
    store_url: str | None = None  # None: SQLite palestra.db in the working directory
    seed: int | None = None  # None: data.seed, else 0
    group_size: int | None = Field(None, ge=1)  # actor_rollout_ref.rollout.n; None: as the batches come
    run_name: str = "verl"
    heldout_tasks_per_level: int = Field(16, gt=0)
    heldout_min_tasks_per_domain: int = Field(0, ge=0)  # as Palestra's eval.min_tasks_per_domain
    heldout_seed: int = 1234
    advantage_std: Literal["group", "batch", "none"] = "group"  # the advantages stored with each result


class _Data(BaseModel):
    palestra: PalestraSection  # nested, so that an error names its key: palestra.policy.floor


def read_section(config: Any) -> PalestraSection:
    """``data.palestra`` validated as Palestra validates its own configs; a one-line ValueError."""
    raw = _get(config, "palestra")
    if raw is None:
        raise ValueError("data.palestra: missing; give at least +data.palestra.domains=[...] and +data.palestra.steps=N")
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(raw, DictConfig):  # ${actor_rollout_ref.rollout.n} and the like resolve here
            raw = OmegaConf.to_container(raw, resolve=True)
    except ImportError:
        pass
    try:
        return _Data.model_validate({"palestra": raw}).palestra
    except ValidationError as exc:
        raise ValueError(f"data.{describe_error(exc)}") from None


def batch_size(config: Any) -> int:
    """Prompts per verl batch, as verl's trainer sizes its data loader."""
    size = _get(config, "gen_batch_size") or _get(config, "train_batch_size")
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"data.train_batch_size must be a positive number of prompts, not {size!r}")
    return size


def check_loader(config: Any) -> None:
    """verl loader settings under which the curriculum cannot adapt: refused in one line."""
    workers = _get(config, "dataloader_num_workers", 8)
    if workers != 0:
        raise ValueError(f"data.dataloader_num_workers must be 0, not {workers}: worker processes would read batches "
                         "ahead from copies of the dataset, so the plans could neither adapt nor be recorded")
    sampler = _get(config, "sampler") or {}
    if _get(sampler, "class_path") is None and _get(config, "shuffle", True):
        raise ValueError("data.shuffle must be False when the dataset is used without Palestra's sampler "
                         "(data.sampler.class_path): a shuffled position is no slot of the plan")


class PalestraDataset(Dataset):
    """verl's ``data.custom_cls``: rows of the plan steps (``palestra://train``) or of the held-out
    tasks (``palestra://heldout``), as verl's RLHFDataset yields them."""

    def __init__(self, data_files: Any, tokenizer: Any = None, processor: Any = None, config: Any = None,
                 max_samples: int = -1) -> None:
        self.section, self.tokenizer = read_section(config), tokenizer
        self.batch_size = batch_size(config)
        mode = _mode(data_files)
        self.domains = _load_domains(self.section)
        self.spec = load_spec(self.section.domains, self.section.domain_options)
        self.max_prompt_length = _get(config, "max_prompt_length")
        self._warned: set[tuple[str, int]] = set()
        heldout = heldout_tasks(self.domains, self.section.heldout_tasks_per_level, self.section.heldout_seed,
                                self.section.heldout_min_tasks_per_domain)
        self.heldout: list[Task] = heldout[:max_samples] if mode == "heldout" and max_samples > 0 else heldout
        self.steps: VerlSteps | None = None
        if mode == "heldout":
            return
        check_loader(config)
        seed = self.section.seed if self.section.seed is not None else int(_get(config, "seed") or 0)
        self.steps = _start_run(self.section, self.domains, self.batch_size, seed, {t.id for t in heldout}, tokenizer)
        self.run_id = self.steps.curriculum.run_id
        _OPEN.add(self)

    def __len__(self) -> int:
        return self.section.steps * self.batch_size if self.steps is not None else len(self.heldout)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self.steps is None:
            return self._row(self.heldout[index], int(index), {})
        slot = int(index) % self.batch_size
        step, task = self.steps.task_for(slot)
        return self._row(task, (step - 1) * self.batch_size + slot,
                         {"palestra_step": step, "palestra_slot": slot, "palestra_run": self.run_id})

    def _row(self, task: Task, index: int, palestra: dict) -> dict[str, Any]:
        """A row as verl 0.7.1's RLHFDataset yields one: the chat messages (the agent loop applies the
        chat template and tokenizes), a dummy tensor, and the keys the reward needs."""
        self._check_length(task)
        fields = reward_fields(task, self.spec)
        return {"raw_prompt": copy.deepcopy(task.prompt), "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
                "data_source": fields["data_source"], "reward_model": fields["reward_model"],
                "extra_info": {**fields["extra_info"], "index": index, **palestra},
                "index": index, "tools_kwargs": {}, "interaction_kwargs": {}}

    def _check_length(self, task: Task) -> None:
        """Warn once per (domain, level) of a prompt longer than data.max_prompt_length tokens."""
        if self.tokenizer is None or not self.max_prompt_length or (task.domain, task.level) in self._warned:
            return
        try:
            ids = self.tokenizer.apply_chat_template(task.prompt, add_generation_prompt=True, tokenize=True)
            length = len(ids if isinstance(ids, list) else ids["input_ids"])  # transformers 5 returns a dict
        except Exception:  # no chat template: verl's agent loop will say so
            return
        if length > self.max_prompt_length:
            self._warned.add((task.domain, task.level))
            log.warning("palestra: a %s level %d prompt has %d tokens, over data.max_prompt_length=%d",
                        task.domain, task.level, length, self.max_prompt_length)

    def on_batch_end(self, batch: Any) -> None:
        """verl's dataset hook (after each training step but the last): record the step's groups."""
        if self.steps is not None:
            self.steps.record_batch(batch)

    def close(self, status: str | None = None) -> None:
        """End the run (``VerlSteps.close``); called at exit if verl did not."""
        if self.steps is not None:
            self.steps.close(status)


class CurriculumSampler(AbstractCurriculumSampler or Sampler):
    """verl 0.7.1's ``data.sampler``: yields the next steps' slots lazily, one batch at a time, and
    records each step from the batch verl hands ``update``."""

    def __init__(self, data_source: Any, data_config: Any = None) -> None:
        if AbstractCurriculumSampler is None:
            raise ImportError("this verl has no curriculum sampler (verl >= 0.8 removed it): leave data.sampler unset, "
                              "set data.shuffle=False, and train with the legacy trainer (trainer.use_v1=False)")
        if getattr(data_source, "steps", None) is None or not hasattr(data_source, "on_batch_end"):
            raise TypeError(f"Palestra's CurriculumSampler samples PalestraDataset's train set, not a "
                            f"{type(data_source).__name__}: set data.custom_cls to PalestraDataset")
        self.dataset = data_source

    def __iter__(self):
        size, steps = self.dataset.batch_size, self.dataset.steps
        while steps.next_step <= self.dataset.section.steps:  # read afresh at each batch: the steps still to come
            first = (steps.next_step - 1) * size
            yield from range(first, first + size)

    def __len__(self) -> int:
        return self.dataset.section.steps * self.dataset.batch_size

    def update(self, batch: Any) -> None:
        self.dataset.on_batch_end(batch=batch)


# -- helpers ----------------------------------------------------------------------------------------
_OPEN: "weakref.WeakSet[PalestraDataset]" = weakref.WeakSet()


@atexit.register
def _close_open_runs() -> None:
    for dataset in list(_OPEN):
        try:
            dataset.close()
        except Exception as exc:  # at exit, a store that is gone must not hide verl's own report
            log.warning("palestra: could not close run %s: %s", getattr(dataset, "run_id", "?"), exc)


def _get(config: Any, key: str, default: Any = None) -> Any:
    if config is None:
        return default
    getter = getattr(config, "get", None)
    return getter(key, default) if getter is not None else getattr(config, key, default)


def _mode(data_files: Any) -> str:
    files = [data_files] if isinstance(data_files, str) else [str(f) for f in (data_files or [])]
    if files == [TRAIN_FILES]:
        return "train"
    if files == [HELDOUT_FILES]:
        return "heldout"
    raise ValueError(f"Palestra's dataset reads data.train_files={TRAIN_FILES} and data.val_files={HELDOUT_FILES}, "
                     f"not {files}")


def _load_domains(section: PalestraSection) -> dict[str, Domain]:
    try:
        domains = load_all(list(section.domains), section.domain_options)
    except DomainError as exc:
        raise ValueError(f"data.palestra.domains: {exc}") from None
    for name, domain in domains.items():
        if domain.multi_turn:
            raise ValueError(f"data.palestra.domains: {name!r} is multi-turn (tools); verl's curriculum scores "
                             "single completions")
    return domains


def _start_run(section: PalestraSection, domains: dict[str, Domain], prompts: int, seed: int,
               heldout_ids: set[str], tokenizer: Any) -> VerlSteps:
    """Check the settings against the domains, then start the run in the store."""
    try:
        check_against_domains(section.policy, section.difficulty, domain_levels(domains))
    except ValueError as exc:
        raise ValueError(f"data.palestra.{exc}") from None
    config = {"integration": "verl", "verl_version": _version("verl"), "prompts_per_step": prompts,
              **section.model_dump(exclude={"store_url", "seed"})}  # domains as given: `palestra replay` loads them
    store = StatsStore(section.store_url or default_store_url(Path.cwd()))
    try:
        curriculum = Curriculum.start(store, section.run_name, config, seed=seed, domains=domains,
                                      policy=section.policy, difficulty=section.difficulty, prompts_per_step=prompts,
                                      heldout_ids=heldout_ids)
    except BaseException:
        store.close()
        raise
    return VerlSteps(curriculum, prompts, section.steps, group_size=section.group_size,
                     advantage_std=section.advantage_std, tokenizer=tokenizer, owns_store=True)


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None
