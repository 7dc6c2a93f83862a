"""Every reasoning-gym dataset as a Palestra domain (optional extra: ``pip install 'palestra[reasoning_gym]'``).

One family, registered once (entry-point group ``palestra.domain_families``, prefix ``rg``): the
dataset ``chain_sum`` is the domain ``rg_chain_sum``; ``domains=rg_*`` selects them all and a
pattern such as ``rg_*matrix*`` a subset. Without the extra the family lists no domains.

Levels. reasoning-gym gives most datasets a curriculum: attributes (number of terms, grid size, …)
each with a list of settings, and global level g sets every attribute to its g-th setting, capped
at the attribute's last one (``set_global_level``). Palestra's levels 1, 2, … are the usable global
levels in order: those the dataset rejects or that hang are left out, and one that configures the
same as the level before it is merged into it, so level k is global level k-1 only where nothing
was dropped (the payload's ``curriculum_level`` says which). Ranges are "inclusive" (reasoning-gym's default: level k draws from the
easiest setting up to the k-th), so a harder level still contains some easy items. Datasets without
a curriculum have one level, their default configuration.

Tasks. ``sample`` builds the dataset with a seed drawn from ``rng`` and takes its first ``n``
items (skipping any that fail to generate, see below), so a seed fixes the tasks. The prompt is the
question plus a one-line instruction to answer inside ``<answer>`` tags; the payload holds the entry
(question, answer, metadata), the curriculum level and the seed, and the reference completion is
``<answer>{answer}</answer>`` where the dataset has a single answer (puzzles with many solutions
have none).

Verifier. The text after the last ``</think>`` is graded: the last ``<answer>…</answer>`` in it
(reasoning-gym's ``extract_answer``), or the whole text when there is no tag (a bare answer), and
scored by the dataset's own ``score_answer`` (a number in [0, 1]); correct means a score of 1.

Reward. By default it is binary: 1 for a correct answer, 0 for anything else, whatever fraction the
scorer gives. Many of reasoning-gym's scorers hand out partial scores that a policy can collect
without solving anything: 0.01 for any well-formed answer, and the default rule of
``ProceduralDataset`` pays ``len(gold) / len(answer)`` to any answer that contains the gold, so
echoing the prompt (the ``prompt_echoed`` canary) scores wherever the question holds the answer's
material. ``scripts/rg_canary_sweep.py`` measures it (reasoning-gym 0.1.25, held-out tasks of every
level, seed 1234). With 3 tasks a level the echo scored on 36 of the 105 datasets, all of which the
former default (reward = score) paid: mostly the 0.01 consolation, but 0.97 on rotate_matrix (a
rotation by a multiple of 360 degrees leaves the matrix as shown), 0.50 on manipulate_matrix, 0.33
on spell_backward, 0.20 on figlet_font and 0.17 on word_sorting. With 60 tasks a level it scored on
49 datasets, reaching 0.988 on rotate_matrix, 0.980 on manipulate_matrix, 0.65 on knights_knaves
and 0.5 on spell_backward and quantum_lock; the larger the matrix the nearer 1, up to 0.989 for a
100 x 100 one (0.991 with ``instruction=""``). It was judged correct on two datasets, which no
reward rule stops; their scorers are replaced (gsm_symbolic, sokoban: see below). With them
replaced, the same sweep of 60 tasks a level finds no canary paid on any dataset, under the default
reward or under partial credit at its default threshold (the highest score left is rotate_matrix's
0.988).

Partial credit is opt-in, per domain or pattern: with ``partial_credit: true`` a score above
``partial_credit_above`` (default 0.99, over the 0.989 the echo can reach with the default
instruction) is paid as it is, and a lower one earns 0; a correct answer earns 1 either way. That
default leaves partial pay only to near-exact answers. A lower threshold can pay the echo (with 200
tasks a level it reached 0.6 on figlet_font; ``partial_credit_above: 0`` pays every score as
reasoning-gym gives it), and the canary check at the start of a run alarms when it does: measure a
threshold with the sweep script (``--option partial_credit=true --option partial_credit_above=X``)
and keep partial credit off where the echo scores over it.

Where this departs from reasoning-gym, and why:

- Metadata holds tuples, numpy scalars and int-keyed dicts, and some scorers (arc_agi, rearc)
  compare tuples, so plain JSON would turn right answers wrong. Entries are stored in a reversible
  JSON encoding (``domains/reversible_json.py``: ``{"__tuple__": [...]}`` and the like); a value with no JSON
  form is stored as its repr and the verifier regenerates the entry from the seed instead.
- Some curriculum levels do not work in reasoning-gym 0.1.25: a configuration the dataset rejects
  (checked when the domain loads, dropped) or a generator that hangs (``HANGS``, measured with
  ``scripts/probe_reasoning_gym.py``). Some generators also loop forever for a few seeds (arc_1d's
  hardest level), so each item is generated under a deadline (``sample_timeout_s``, SIGALRM in the
  main thread) and one that fails or overruns is skipped for the next index. A level that cannot
  produce tasks at all falls back to the next easier level, logged, rather than stopping a run.
- ``composite`` is left out: it mixes other datasets, which is the scheduler's job here.
- A scorer that pays for answers that solve nothing is replaced (``SCORER_FIXES``), since a policy
  learns to collect such a reward without solving: 0.1.25's game_of_life_halting compares
  ``bool(answer) == bool(entry["answer"])``, true for every non-empty answer, since the gold is the
  string "True" or "False"; gsm_symbolic grades the first number in the answer, so a list of
  guesses scores when the first is right, and the echoed question scores 1 when its first number
  is the answer (6 of 200 held-out tasks); its replacement asks for exactly one number. sokoban's
  scorer plays every L, R, U and D in the answer and skips the rest, so the echoed question, whose
  letters include the example "LDURRUDL", solved 4 of 780 held-out puzzles; an answer there must
  be moves only (``ANSWER_FORMS``).
- Generators and scorers that print (``bf``) are silenced; the trainer's output stays readable.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import logging
import math
import random
import re
import signal
import threading
import time
from functools import lru_cache
from typing import Any

from pydantic import Field

from domains.api import (
    Canary, Domain, DomainConfig, DomainFamily, Status, Task, VerifyResult, one_line, stable_hash, user_prompt,
)
from domains.math.answer import answer_region
from domains.reversible_json import decode, encode

PREFIX = "rg"  # the entry point's name in pyproject.toml: domains are rg_<dataset>
EXCLUDED = frozenset({"composite"})
# Curriculum levels (0-based, as reasoning-gym counts) whose generator does not finish three items
# in 20 s with reasoning-gym 0.1.25 (inclusive ranges).
HANGS: dict[str, frozenset[int]] = {
    "jugs": frozenset({2, 3}),
    "sokoban": frozenset({0}),
    "zebra_puzzles": frozenset({5}),
}

INSTRUCTION = "Give only the final answer, between <answer> and </answer>."
MISSING = "reasoning-gym domains need the optional extra: pip install 'palestra[reasoning_gym]'"
DETAIL_CHARS = 200  # answers are stored in the results table; keep the rows small
log = logging.getLogger("palestra")


class ReasoningGymError(ValueError):
    """A reasoning-gym dataset that cannot produce tasks; the message names it and the level."""


def _same_boolean(answer: str, entry: dict[str, Any]) -> float:
    return float(answer.strip().lower() == str(entry["answer"]).strip().lower())


NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _the_one_number(answer: str, entry: dict[str, Any]) -> float:
    """1 when the answer holds exactly one number and it equals the gold ("195" or "195 minutes")."""
    numbers = NUMBER.findall(answer)
    return float(len(numbers) == 1 and float(numbers[0]) == float(entry["answer"]))


# Scorers used instead of the dataset's own, which pays for answers that solve nothing (see the
# module docstring).
SCORER_FIXES = {"game_of_life_halting": _same_boolean, "gsm_symbolic": _the_one_number}
# Datasets whose scorer reads only some characters of the answer: one that is not wholly of this form
# (whitespace aside) scores 0 before the scorer sees it.
ANSWER_FORMS = {"sokoban": re.compile(r"[LRUD]+")}


def _whole_form(form: re.Pattern[str], score_answer: Any) -> Any:
    return lambda answer, entry: score_answer(answer, entry) if form.fullmatch("".join(answer.split())) else 0.0


# -- reasoning-gym access -------------------------------------------------------------------------
def installed() -> bool:
    try:
        return importlib.util.find_spec("reasoning_gym") is not None
    except (ImportError, ValueError):  # a broken or half-imported package counts as missing
        return False


def _factory():
    import reasoning_gym.factory  # noqa: F401  (importing the package registers every dataset)

    return reasoning_gym.factory


@lru_cache(maxsize=1)
def dataset_names() -> tuple[str, ...]:
    return tuple(sorted(set(_factory().DATASETS) - EXCLUDED))


@lru_cache(maxsize=1)
def library_version() -> str:
    from importlib.metadata import version

    return version("reasoning_gym")


class _Expired(BaseException):
    """A generator ran past its deadline. A BaseException, so that the generators' own
    ``except Exception`` retry loops cannot swallow it and keep going."""


@contextlib.contextmanager
def _deadline(seconds: float | None):
    """Interrupt the block after ``seconds`` with ``_Expired`` (SIGALRM: main thread, POSIX only;
    elsewhere the block runs unguarded). Any timer already set is restored afterwards."""
    if not seconds or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise _Expired(f"generating took over {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, expire)
    earlier, interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if earlier:
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, earlier - (time.monotonic() - start)), interval)


@contextlib.contextmanager
def _quiet():
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def _finite_score(score_answer: Any, answer: str, entry: dict[str, Any]) -> float:
    """The scorer's number for ``answer``; one that is no finite number raises, as a crash would
    (a NaN reward would poison its group's advantages)."""
    with _quiet():
        score = float(score_answer(answer, entry))
    if not math.isfinite(score):
        raise ValueError(f"score_answer returned {score}")
    return score


def _validated(config: Any) -> Any:
    if callable(getattr(config, "validate", None)):
        config.validate()
    return config


@lru_cache(maxsize=None)
def level_configs(dataset: str) -> tuple[tuple[int | None, Any], ...]:
    """(curriculum level, dataset config) for each usable level, easiest first; ``None`` marks the
    dataset's default configuration (no curriculum, or none of its levels works). Cached: configs
    are never changed in place (sampling copies them with ``dataclasses.replace``)."""
    factory = _factory()
    default = ((None, _validated(factory.DATASETS[dataset][1](seed=0, size=1))),)
    if dataset not in factory.CURRICULA:
        return default
    curriculum = factory.create_curriculum(dataset)
    depth = max((len(attr.levels) for attr in curriculum.attributes.values()), default=0)
    kept: list[tuple[int | None, Any]] = []
    for level in range(depth):
        if level in HANGS.get(dataset, ()):
            continue
        curriculum.set_global_level(level)
        try:
            config = _validated(curriculum.generate_configuration({"seed": 0, "size": 1}))
        except Exception:  # the dataset rejects this combination of attribute settings
            continue
        if not kept or config != kept[-1][1]:
            kept.append((level, config))
    return tuple(kept) or default


def extract(completion: str, require_tag: bool) -> tuple[str | None, str]:
    """(answer, problem): the answer to grade, or None and why there is none."""
    from reasoning_gym.utils import extract_answer

    region = answer_region(completion)
    if region is None:
        return None, "a <think> block was never closed"
    tagged = extract_answer(region)
    if tagged is not None:
        return (tagged, "") if tagged else (None, "empty <answer></answer>")
    if "<answer>" in region:
        return None, "an <answer> tag was never closed"
    if require_tag:
        return None, "no <answer>...</answer> in the completion"
    bare = region.strip()
    return (bare, "") if bare else (None, "empty completion")


# -- canaries: the family's answers that must never score ----------------------------------------------
def _with_gold(write: Any) -> Canary:
    """A canary built on the task's answer; None for a task without one (many-solution puzzles)."""
    return lambda task: None if task.payload.get("entry", {}).get("answer") is None else write(
        str(task.payload["entry"]["answer"]))


CANARIES: dict[str, Canary] = {
    "empty_answer": lambda task: "<answer></answer>",
    "prompt_echoed": lambda task: "<answer>{}</answer>".format(
        task.prompt[-1]["content"].replace("<answer>", "").replace("</answer>", "")),
    "answer_in_thinking": _with_gold(lambda gold: f"<think><answer>{gold}</answer></think>"),
    "unclosed_thinking": _with_gold(lambda gold: f"<think><answer>{gold}</answer>"),
    "unclosed_answer_tag": _with_gold(lambda gold: f"<answer>{gold}"),
}


# -- the domain -----------------------------------------------------------------------------------
class ReasoningGymConfig(DomainConfig):
    max_level: int | None = Field(None, ge=1)  # cap on the levels (None: all the curriculum has)
    instruction: str = INSTRUCTION  # appended to each question; "" for the bare question
    require_answer_tag: bool = False  # False: a completion without <answer> tags is graded whole
    partial_credit: bool = False  # False: reward 1 for a score of 1, else 0 (see the module docstring)
    # with partial_credit: a score above this is paid as it is, a lower one earns 0
    partial_credit_above: float = Field(0.99, ge=0.0, lt=1.0)
    sample_timeout_s: float = Field(15.0, gt=0)  # per generated item; an item over it is skipped


class ReasoningGymDomain(Domain):
    """One reasoning-gym dataset; see the module docstring."""

    Config = ReasoningGymConfig

    def __init__(self, dataset: str, config: ReasoningGymConfig | None = None, **options: Any) -> None:
        super().__init__(config, **options)
        if dataset not in dataset_names():
            raise ReasoningGymError(f"reasoning-gym has no dataset {dataset!r}")
        self.dataset = dataset
        self.name = f"{PREFIX}_{dataset}"
        # 2: a scorer that raises on (or gives no number for) the model's answer alone is a verdict
        # on that answer; one that fails on the task's own answer too gives none
        # 3: binary reward by default (partial credit only when asked for, above a threshold);
        # gsm_symbolic and sokoban no longer score answers that merely contain the solution
        self.version = f"3+rg{library_version()}"
        self._all_levels = level_configs(dataset)
        self._on_configure()

    def _on_configure(self) -> None:
        cap = self.config.max_level or len(self._all_levels)
        self._levels = self._all_levels[:cap]
        self.levels = tuple(range(1, len(self._levels) + 1))
        self._scorers: dict[int | None, Any] = {}
        self._failed: set[int] = set()

    def __getstate__(self) -> dict[str, Any]:
        # caches stay behind; the verifier workers build their own
        return {**self.__dict__, "_scorers": {}, "_failed": set()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # import reasoning-gym while a verifier worker starts, not inside a verify call's deadline
        _factory()
        self.__dict__.update(state)

    # -- sampling ---------------------------------------------------------------------------------
    def sample(self, level: int, n: int, rng: random.Random) -> list[Task]:
        if level not in self.levels:
            raise ValueError(f"domain {self.name!r} has no level {level} (levels: {list(self.levels)})")
        seed = rng.randrange(2**32)
        for used in range(level, 0, -1):  # an easier level when reasoning-gym fails at this one
            if used in self._failed:
                continue
            try:
                size, entries = self._generate(self._levels[used - 1][1], seed, n)
            except (Exception, _Expired) as exc:
                self._failed.add(used)
                log.warning("%s level %d: reasoning-gym failed to generate tasks (%s); using easier levels",
                            self.name, used, one_line(exc))
                continue
            return [self._task(used, seed, size, i, entry) for i, entry in entries]
        raise ReasoningGymError(f"domain {self.name!r}: reasoning-gym cannot generate tasks at level {level} "
                                "or any easier level (see the warnings above)")

    def _generate(self, config: Any, seed: int, n: int) -> tuple[int, list[tuple[int, dict[str, Any]]]]:
        """(dataset size, [(index, entry)]): the first ``n`` items that generate in time. An item
        whose generator raises or overruns ``sample_timeout_s`` (some loop forever for a few seeds)
        is skipped; the dataset is sized with room for that, and the size is kept for regeneration."""
        size = 2 * n + 4
        with _deadline(self.config.sample_timeout_s):
            dataset = self._build(config, seed, size)
        entries: list[tuple[int, dict[str, Any]]] = []
        failures: list[str] = []
        for index in range(size):
            if len(entries) == n:
                break
            try:
                with _quiet(), _deadline(self.config.sample_timeout_s):
                    entries.append((index, dataset[index]))
            except (Exception, _Expired) as exc:
                failures.append(f"item {index}: {type(exc).__name__}: {one_line(exc)}")
        if len(entries) < n:
            raise ReasoningGymError(f"{len(failures)} of {len(entries) + len(failures)} items failed "
                                    f"(last: {failures[-1]})")
        if failures:
            log.warning("%s: skipped %d item(s) reasoning-gym could not generate (%s)", self.name, len(failures),
                        failures[0])
        return size, entries

    def _build(self, config: Any, seed: int, size: int) -> Any:
        dataset_cls = _factory().DATASETS[self.dataset][0]
        with _quiet():
            return dataset_cls(config=dataclasses.replace(config, seed=seed, size=max(1, size)))

    def _task(self, level: int, seed: int, size: int, index: int, entry: dict[str, Any]) -> Task:
        lossy: list[str] = []
        encoded = encode(entry, lossy)
        question = str(entry["question"])
        text = f"{question}\n\n{self.config.instruction}" if self.config.instruction else question
        payload = {"dataset": self.dataset, "curriculum_level": self._levels[level - 1][0], "seed": seed,
                   "size": size, "index": index, "entry": encoded}
        if lossy:
            payload["lossy"] = sorted(set(lossy))
        return Task(domain=self.name, level=level, prompt=user_prompt(text), payload=payload,
                    meta={"dataset": self.dataset}, id=stable_hash(self.name, question, encoded.get("answer")))

    def reference(self, task: Task) -> str | None:
        answer = task.payload.get("entry", {}).get("answer")
        return None if answer is None else f"<answer>{answer}</answer>"

    def canaries(self) -> dict[str, Canary]:
        return CANARIES

    # -- verifying --------------------------------------------------------------------------------
    def warm_up(self) -> None:
        # importing reasoning-gym registers every dataset: seconds, once per worker process. The
        # per-level scorers stay lazy; a run over all 105 datasets would build hundreds up front.
        _factory()
        from reasoning_gym.utils import extract_answer  # noqa: F401

    def verify(self, task: Task, completion: str) -> VerifyResult:
        answer, problem = extract(completion, self.config.require_answer_tag)
        if answer is None:
            return VerifyResult.failure(Status.FORMAT_ERROR, problem)
        try:  # rebuilding the task's entry or its dataset fails on the task's side: no verdict
            score_answer = SCORER_FIXES.get(self.dataset) or self._scorer(task.payload.get("curriculum_level")).score_answer
            if self.dataset in ANSWER_FORMS:
                score_answer = _whole_form(ANSWER_FORMS[self.dataset], score_answer)
            entry = self._entry(task.payload)
        except Exception as exc:
            return VerifyResult.no_verdict(f"task could not be rebuilt: {type(exc).__name__}: {one_line(exc)}")
        try:
            score = _finite_score(score_answer, answer, entry)
        except Exception as exc:
            message = f"{type(exc).__name__}: {one_line(exc)}"
            if self._scores_its_own_answer(score_answer, entry):  # int("2 x 3 x"): this answer's error
                return VerifyResult.failure(Status.ERROR, message)
            return VerifyResult.no_verdict(f"the scorer fails on the task's own answer too: {message}")
        score = min(1.0, max(0.0, score))
        correct = score >= 1.0 - 1e-9
        reward = float(correct)
        if not correct and self.config.partial_credit and score > self.config.partial_credit_above:
            reward = score
        return VerifyResult(reward=reward, correct=correct, status=Status.OK if correct else Status.WRONG,
                            details={"answer": answer[:DETAIL_CHARS], "score": score})

    @staticmethod
    def _scores_its_own_answer(score_answer: Any, entry: dict[str, Any]) -> bool:
        """Whether the scorer gets through the entry's own answer: tells an answer the scorer
        cannot take from an entry it cannot score at all."""
        try:
            _finite_score(score_answer, str(entry["answer"]), entry)
        except Exception:
            return False
        return True

    def _config_at(self, curriculum_level: int | None) -> Any:
        for level, config in self._all_levels:
            if level == curriculum_level:
                return config
        raise ReasoningGymError(f"{self.name}: no usable curriculum level {curriculum_level}")

    def _scorer(self, curriculum_level: int | None) -> Any:
        """The dataset at the task's configuration, built once per worker and level; scoring does
        not depend on the seed."""
        if curriculum_level not in self._scorers:
            self._scorers[curriculum_level] = self._build(self._config_at(curriculum_level), 0, 1)
        return self._scorers[curriculum_level]

    def _entry(self, payload: dict[str, Any]) -> dict[str, Any]:
        if not payload.get("lossy"):
            return decode(payload["entry"])
        config = self._config_at(payload.get("curriculum_level"))  # regenerate the exact entry
        dataset = self._build(config, int(payload["seed"]), int(payload["size"]))
        with _quiet():
            return dataset[int(payload["index"])]


class ReasoningGymFamily(DomainFamily):
    """Lists reasoning-gym's datasets and builds their domains; empty without the extra."""

    def members(self) -> list[str]:
        return list(dataset_names()) if installed() else []

    def domain(self, member: str) -> ReasoningGymDomain:
        return ReasoningGymDomain(member)

    def missing(self) -> str | None:
        return None if installed() else MISSING


FAMILY = ReasoningGymFamily()
