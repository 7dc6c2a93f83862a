"""The domain plugin contract: Task, VerifyResult and the Domain base class.

A domain is a task family with ordered difficulty levels and an objective verifier. Tasks carry a
``payload`` the verifier needs (reference answer, hidden tests, target state) that is never shown to
the model. ``verify`` never raises into the trainer: the verifier pool turns any exception into
``status=error, reward=0`` (see ``domains.verify.pool``).
"""
from __future__ import annotations

import hashlib
import json
import random
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Callable, ClassVar, Literal

from pydantic import Field

from domains.config import StrictModel

# Chat messages. A tool domain's chat prompt opens with a system message that also carries the tool
# schemas under "tools" (domains.tools.calls.offer_tools hands them to a chat template that takes
# them, or writes them into the message for one that does not).
Messages = list[dict[str, Any]]


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's text on one line, at most ``limit`` characters: for messages and verdicts."""
    return " ".join(str(exc).split())[:limit]


class Status(str, Enum):
    OK = "ok"
    WRONG = "wrong"
    FORMAT_ERROR = "format_error"
    TIMEOUT = "timeout"
    ERROR = "error"
    SANDBOX_VIOLATION = "sandbox_violation"


# The statuses of a verification that failed to run to a judgement of the answer: the verifier or
# the program crashed, ran out of time or broke a sandbox limit. Wrong and unparseable answers
# (WRONG, FORMAT_ERROR) are judgements, not failures. Step reports and the TRL metrics count these
# as errors; defined once here so that every count means the same.
FAILURE_STATUSES: frozenset[Status] = frozenset({Status.ERROR, Status.TIMEOUT, Status.SANDBOX_VIOLATION})


def stable_hash(*parts: Any) -> str:
    """Short content hash that is identical across processes and Python versions."""
    blob = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Task:
    domain: str
    level: int
    prompt: Messages  # chat messages shown to the model
    payload: dict[str, Any]  # hidden from the model: what the verifier needs
    meta: dict[str, Any] = field(default_factory=dict)
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:  # stable id: the same content always gets the same id
            object.__setattr__(self, "id", stable_hash(self.domain, self.prompt, self.payload))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Task":
        return cls(**{k: data[k] for k in ("domain", "level", "prompt", "payload", "meta", "id") if k in data})


@dataclass(frozen=True)
class VerifyResult:
    reward: float
    correct: bool
    status: Status
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def failure(cls, status: Status, message: str, **details: Any) -> "VerifyResult":
        return cls(reward=0.0, correct=False, status=status, details={"message": message[:500], **details})

    @classmethod
    def no_verdict(cls, message: str, **details: Any) -> "VerifyResult":
        """The verifier could not judge the completion (it raised, its worker died, its sandbox is
        missing): ``status=error`` and reward 0 like any failure, flagged so that a caller can tell
        it from a verdict on the completion (``palestra verify`` exits 1 on one)."""
        return cls.failure(Status.ERROR, message, unscored=True, **details)

    @property
    def scored(self) -> bool:
        return not self.details.get("unscored", False)

    def to_json(self) -> dict[str, Any]:
        return {"reward": self.reward, "correct": self.correct, "status": self.status.value, "details": self.details}


# A canary writes, for a task, a completion that must never earn reward; None: not for this task
Canary = Callable[[Task], "str | None"]


class DomainConfig(StrictModel):
    """Options every domain accepts; a domain subclasses this for its own options (unknown keys fail)."""

    verify_timeout_s: float = 10.0  # hard deadline enforced by the verifier pool
    # Token budget of one completion (of one assistant turn in tool episodes); None: the trainer's.
    max_new_tokens: int | None = Field(None, gt=0)
    # How a task is put to the model: "compact", the terse form the built-in tiny model learns
    # ("3+4="), or "chat", the question in words and the answer format asked for, as one writes to
    # a pretrained chat model. The trainer sets both from model.prompt_style and model.system_prompt.
    prompt_style: Literal["compact", "chat"] = "compact"
    system_prompt: str | None = None  # a system message before every prompt the domain writes


class Domain:
    """Base class of every domain plugin.

    Subclasses set ``name``, ``levels`` and ``Config`` and implement ``sample`` and ``verify``;
    ``reference`` returns a known-good completion (SFT warm start, tests) when one exists, and
    ``hint`` the start of a solution, shown on some training tasks of a domain that rarely succeeds.

    A multi-turn domain (tool use) sets ``multi_turn`` and implements ``environment(task)``: the
    trainer then plays an episode of assistant turns against that environment and verifies the
    transcript. ``stop_text`` is the text that ends an assistant turn besides end-of-turn (the
    closing tag of a tool call), so that the environment can answer; None: only end-of-turn does.
    The trainer asks the domain for both rather than knowing any markup itself.
    """

    name: str = ""
    levels: tuple[int, ...] = (1,)
    version: str = "1"  # bump when verify() changes meaning; stored with every result
    Config: ClassVar[type[DomainConfig]] = DomainConfig
    multi_turn: bool = False  # episodes of several assistant turns against environment(task)
    stop_text: str | None = None  # ends an assistant turn of an episode besides end-of-turn

    def __init__(self, config: DomainConfig | None = None, **options: Any) -> None:
        self.config = config if config is not None else self.Config(**options)

    def configure(self, options: dict[str, Any] | None) -> "Domain":
        """A copy of this domain with validated options (unknown keys fail)."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.config = self.Config(**{**self.config.model_dump(), **(options or {})})
        clone._on_configure()
        return clone

    def _on_configure(self) -> None:
        """Hook for domains that derive state from their config (e.g. load a file)."""

    def sample(self, level: int, n: int, rng: random.Random) -> list[Task]:
        raise NotImplementedError(f"domain {self.name!r} must implement sample()")

    def verify(self, task: Task, completion: str) -> VerifyResult:
        raise NotImplementedError(f"domain {self.name!r} must implement verify()")

    def reference(self, task: Task) -> str | None:
        return None

    # Whether ``drawn`` changes tasks (rotated hidden tests), and whether it reads ``visit``: only
    # then does the curriculum count how often each of this domain's tasks is drawn (0 otherwise).
    rotates: bool = False
    counts_draws: bool = False

    def drawn(self, task: Task, step: int, visit: int) -> Task:
        """``task`` as it is put to the model at training ``step``, drawn for the ``visit``-th time
        in the run (0 the first): a domain may choose here what scores it, e.g. a rotating subset
        of hidden tests. Keep the id, and decide from the task, ``step`` and ``visit`` alone:
        ``palestra replay`` rebuilds the draw from the stored run the same way. Held-out evaluation
        never calls this."""
        return task

    def hint(self, task: Task) -> str | None:
        """A short hint for ``task``, or None (the default): none for this task or this domain.

        A hint is the start of a solution, QuestA-style: a first step worked out, the first tool
        call, the head of the code. It leaves the model the rest of the work and never states the
        final answer. Write it in the task's prompt style (``self.config.prompt_style``): terse for
        ``compact``, a few words for ``chat``; ``hinted`` shows it after the question. The
        curriculum puts hints on a share of the training tasks of a domain that succeeds too
        rarely to learn (``cold_start.hint_below``); held-out evaluation never shows one."""
        return None

    def lead(self, task: Task) -> str | None:
        """The start of a solution written as the assistant's own first turn, or None (the default).

        Only an episode (``multi_turn``) can be led: a tool domain gives its first call, which the
        environment answers before the model takes over. Unlike a hint in words, a lead is trained
        on: written for half of a group's members (``with_lead``), it is a choice the group's
        advantages can favour when the led members do better than those left to find it."""
        return None

    def hinted(self, task: Task, form: str = "words") -> Task | None:
        """``task`` with its hint shown: in words after the question (``with_hint``), or with
        ``form="lead"`` as a lead (``with_lead``) where the domain has one and as words where it has
        none; None when the domain gives neither."""
        if form not in ("words", "lead"):
            raise ValueError(f"unknown hint form {form!r}: 'words' or 'lead'")
        if form == "lead" and self.multi_turn:  # only an episode's first turn can be written for the model
            first = self.lead(task)
            if first is not None and first.strip():
                return with_lead(task, first)
        text = self.hint(task)
        if text is None or not text.strip():
            return None
        return with_hint(task, text, separator="\n\n" if self.config.prompt_style == "chat" else "\n")

    def canaries(self) -> dict[str, Canary]:
        """Named functions that write, for a task, a completion that must never earn reward (a
        known exploit or a near miss), or None for a task they do not apply to. A run checks them
        through the verifier pool at its start and every ``audit.every`` steps (``domains.canaries``)."""
        return {}

    def prompt(self, compact: str, chat: str, tools: list[dict[str, Any]] | None = None,
               example: Messages | None = None) -> Messages:
        """A task's messages in this domain's prompt style: the ``compact`` text, or the ``chat``
        one; a chat prompt offers ``tools`` (JSON schemas) in its system message, beside the run's
        system prompt, and ``example`` (a solved exchange: a question, the answer, any tool turns
        between) goes before a chat question as an exchange already had: a small chat model copies
        the answer's format far better than it follows words."""
        if self.config.prompt_style != "chat":
            return _with_system(self.config.system_prompt, user_prompt(compact))
        shown = [dict(message) for message in example or []]
        if tools:
            return [{"role": "system", "content": self.config.system_prompt or "", "tools": tools},
                    *shown, *user_prompt(chat)]
        return _with_system(self.config.system_prompt, shown + user_prompt(chat))

    def restyle(self, messages: Messages, request: str) -> Messages:
        """A dataset row's own messages in this domain's prompt style: chat adds ``request`` (the
        answer format the verifier reads) to the last user message unless the text already says
        it; the run's system prompt goes first when the row brings none."""
        out = [dict(m) for m in messages]
        users = [m for m in out if m["role"] == "user"]
        if self.config.prompt_style == "chat" and users and request not in users[-1]["content"]:
            users[-1]["content"] = f"{users[-1]['content'].rstrip()}\n\n{request}"
        if self.config.system_prompt and not any(m["role"] == "system" for m in out):
            out.insert(0, {"role": "system", "content": self.config.system_prompt})
        return out

    def warm_up(self) -> None:
        """Load what ``verify`` needs (heavy imports, parsers) ahead of the first call. A verifier
        worker calls this before it reports ready, so the first call's deadline is not spent on
        start-up; a failure here is ignored and left for ``verify`` to report. No deadline guards
        it, so keep it to seconds (no downloads)."""

    def task_from_json(self, data: dict[str, Any]) -> Task:
        """A task given by hand (``palestra verify``): a Task's JSON. Dataset domains override this
        to also accept the rows of their own file format."""
        return Task.from_json(data)

    def heldout(self, level: int, n: int, seed: int) -> list[Task]:
        """A fixed evaluation set. Procedural domains draw from a seed stream disjoint from training."""
        return self.sample(level, n, random.Random(f"heldout/{self.name}/{level}/{seed}"))

    def __repr__(self) -> str:
        return f"<Domain {self.name} levels={list(self.levels)}>"


class TaskListDomain(Domain):
    """A domain over a fixed list of tasks read from a file (``self.tasks``, set when configured),
    such as a code dataset or BFCL: training draws from a level's tasks, and the held-out set is
    distinct tasks of the level that always leave one to train on (a small level would otherwise
    be held out whole, and training would fail when the curriculum reached it)."""

    tasks: list[Task] = []

    def sample(self, level: int, n: int, rng: random.Random) -> list[Task]:
        pool = self._level(level)
        return rng.sample(pool, n) if n <= len(pool) else rng.choices(pool, k=n)

    def heldout(self, level: int, n: int, seed: int) -> list[Task]:
        return super().heldout(level, min(n, len(self._level(level)) - 1), seed)

    def _level(self, level: int) -> list[Task]:
        pool = [t for t in self.tasks if t.level == level]
        if not pool:
            raise ValueError(f"{self.name}: no tasks at level {level} (path: {getattr(self.config, 'path', None)})")
        return pool


class DomainFamily(ABC):
    """Many domains generated from one source (e.g. every dataset of a task library).

    Registered once, under the entry-point group ``palestra.domain_families``; the entry point's
    name is the family's prefix and its members are the domains ``<prefix>_<member>``. A family whose
    source is not installed lists no members and says why in ``missing()``.
    """

    def members(self) -> list[str]:
        return []

    @abstractmethod
    def domain(self, member: str) -> Domain:
        """The domain ``<prefix>_<member>``."""

    def missing(self) -> str | None:
        """Why ``members()`` is empty (e.g. an optional dependency is not installed), or None."""
        return None


def _with_system(text: str | None, messages: Messages) -> Messages:
    """``messages`` after a system message holding ``text``, when there is one."""
    return ([{"role": "system", "content": text}] if text else []) + messages


def user_prompt(text: str) -> Messages:
    return [{"role": "user", "content": text}]


HINT_LABEL = "Hint:"


def with_hint(task: Task, text: str, separator: str = "\n") -> Task:
    """``task`` with ``text`` shown as a hint: ``Hint: <text>`` after its last user message (the
    question itself, after any worked example a chat prompt opens with), following ``separator``.

    The payload is the same, so the task verifies exactly as before; the prompt differs, so the id
    does too. ``meta`` gains ``hint`` (the text: what ``domain/<name>/hinted`` counts) and
    ``unhinted_id`` (the plain task's id)."""
    text = text.strip()
    if not text:
        raise ValueError(f"task {task.id}: an empty hint")
    if task.meta.get("hint"):
        raise ValueError(f"task {task.id} already carries a hint")
    prompt = [dict(message) for message in task.prompt]
    last = next((m for m in reversed(prompt) if m.get("role") == "user"), None)
    if last is None or not isinstance(last.get("content"), str):
        raise ValueError(f"task {task.id}: no user message with text to add a hint to")
    last["content"] = f"{last['content'].rstrip()}{separator}{HINT_LABEL} {text}"
    return Task(domain=task.domain, level=task.level, prompt=prompt, payload=task.payload,
                meta={**task.meta, "hint": text, "unhinted_id": task.id})


def with_lead(task: Task, text: str) -> Task:
    """``task`` led by ``text``: the same prompt and payload, with ``meta["lead"]`` the assistant's
    first turn that the trainer writes for half of each group's members (``Domain.lead``). ``meta``
    gains ``hint`` and ``unhinted_id`` as ``with_hint`` gives them, and the id differs from the
    plain task's, as a hinted task's does."""
    text = text.strip()
    if not text:
        raise ValueError(f"task {task.id}: an empty lead")
    if task.meta.get("hint"):
        raise ValueError(f"task {task.id} already carries a hint")
    return Task(domain=task.domain, level=task.level, prompt=task.prompt, payload=task.payload,
                meta={**task.meta, "hint": text, "lead": text, "unhinted_id": task.id},
                id=stable_hash(task.id, "lead", text))


def led_members(task: Task, group_size: int) -> int:
    """How many of a group's members the trainer leads: ``led_share(group_size)`` for a task with a
    lead (``with_lead``), none of any other."""
    return led_share(group_size) if task.meta.get("lead") else 0


def led_share(group_size: int) -> int:
    """The members a led group's lead writes: the first half, rounded down. A group all led would
    train its lead on advantages that sum to zero: only the contrast with the unled half can favour
    it, so a group of one is not led at all."""
    return group_size // 2


def exchange(question: str, answer: str) -> Messages:
    """A question and its answer as chat messages: a worked example for ``Domain.prompt``."""
    return [*user_prompt(question), {"role": "assistant", "content": answer}]
