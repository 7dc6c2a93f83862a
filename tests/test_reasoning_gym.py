"""The reasoning-gym adapter (``domains.reasoning_gym``) against the real library: every dataset is a
domain ``rg_<name>``; levels follow the curricula; the dataset's own scorer is the verifier."""
import json
import math
import random
import subprocess
import sys

import pytest

from curriculum.cli import main as cli_main
from domains.api import Status, Task
from domains.verify.pool import VerifierPool, verify_guarded
from domains.reasoning_gym import ReasoningGymDomain, dataset_names
from domains.reversible_json import decode, encode
from domains.registry import DomainError, available, expand, load, load_all
from trainer.config import validate_config
from quick_settings import quick

# A spread over reasoning-gym's categories, including scorers that compare tuples (arc_agi, rearc)
# and metadata with numpy values (codeio, knights_knaves).
REFERENCE_DATASETS = [
    "ab", "advanced_geometry", "aiw", "arc_1d", "arc_agi", "base_conversion", "basic_arithmetic",
    "bitwise_arithmetic", "caesar_cipher", "calendar_arithmetic", "chain_sum", "codeio",
    "color_cube_rotation", "complex_arithmetic", "count_primes", "cryptarithm", "dice",
    "family_relationships", "fraction_simplification", "gcd", "knights_knaves", "leg_counting",
    "letter_counting", "maze", "n_queens", "polynomial_multiplication", "rearc", "simple_equations",
    "sudoku", "time_intervals", "word_sorting", "zebra_puzzles",
]


@pytest.fixture(scope="module")
def chain_sum():
    return load("rg_chain_sum")


def round_trip(task: Task) -> Task:
    return Task.from_json(json.loads(json.dumps(task.to_json())))


# -- registration -----------------------------------------------------------------------------------
def test_every_dataset_is_a_domain(capsys):
    names = [n for n in available() if n.startswith("rg_")]
    assert len(names) >= 100
    assert names == [f"rg_{d}" for d in dataset_names()]
    assert "rg_composite" not in names  # a mixture of the others: the scheduler's job here
    assert cli_main(["domains", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert all(rows[n]["levels"] and "error" not in rows[n] for n in names)
    assert rows["rg_chain_sum"]["levels"][0] == 1 and len(rows["rg_chain_sum"]["levels"]) > 3


def test_without_the_extra_nothing_is_listed_and_asking_says_why():
    # a fresh interpreter in which `import reasoning_gym` fails, as if the extra were not installed
    script = """
import json, sys
sys.modules["reasoning_gym"] = None
from curriculum.cli import main
from domains.registry import DomainError, expand, load
assert main(["domains", "--json"]) == 0
for attempt in (lambda: load("rg_chain_sum"), lambda: expand(["rg_*"])):
    try:
        attempt()
    except DomainError as exc:
        print("ERROR", exc)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout[:out.stdout.index("ERROR")])
    assert listed and not [r for r in listed if r["name"].startswith("rg_")]
    errors = [line for line in out.stdout.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 2 and all("palestra[reasoning_gym]" in e for e in errors)


def test_unknown_dataset_gets_did_you_mean():
    with pytest.raises(DomainError, match="did you mean 'rg_chain_sum'"):
        load("rg_chain_sun")
    with pytest.raises(DomainError, match="matches no registered domain"):
        expand(["rg_no_such_thing*"])


def test_patterns_select_domains_and_give_them_options():
    assert expand(["rg_*matrix*"]) == ["rg_binary_matrix", "rg_manipulate_matrix", "rg_pool_matrix",
                                       "rg_rotate_matrix", "rg_spiral_matrix"]
    # an exact name before a pattern is not selected twice
    assert expand(["rg_chain_sum", "rg_*_sum"]) == ["rg_chain_sum", "rg_decimal_chain_sum"]
    loaded = load_all(["rg_*_sum"], {"rg_*": {"max_level": 2}, "rg_chain_sum": {"max_level": 3}})
    assert loaded["rg_chain_sum"].levels == (1, 2, 3)  # the exact name's options win
    assert loaded["rg_decimal_chain_sum"].levels == (1, 2)
    with pytest.raises(DomainError, match="not selected: rg_x"):
        load_all(["rg_chain_sum"], {"rg_x*": {"max_level": 1}})
    with pytest.raises(DomainError, match="invalid options"):
        load("rg_chain_sum", {"max_level": 0})
    config = validate_config({"domains": "rg_*", "policy": {"type": "uniform"}, "difficulty": {"type": "fixed"}})
    assert config.domains == ["rg_*"]  # `domains=rg_*` on the command line is one string


# -- levels and sampling ----------------------------------------------------------------------------
def test_sampling_is_deterministic_for_a_seed(chain_sum):
    for domain in (chain_sum, load("rg_arc_1d"), load("rg_sudoku")):
        level = min(3, domain.levels[-1])
        first = [t.to_json() for t in domain.sample(level, 4, random.Random(7))]
        again = [t.to_json() for t in domain.sample(level, 4, random.Random(7))]
        other = [t.to_json() for t in domain.sample(level, 4, random.Random(8))]
        assert first == again
        assert first != other
        assert len({t["id"] for t in first}) == 4


def test_an_item_whose_generator_hangs_is_skipped():
    # reasoning-gym 0.1.25's arc_1d loops forever on the first item of this seed at its top level
    arc = load("rg_arc_1d", {"sample_timeout_s": 1})
    tasks = arc.sample(4, 4, random.Random(7))
    assert [t.payload["index"] for t in tasks] == [1, 2, 3, 4]
    assert [t.to_json() for t in arc.sample(4, 4, random.Random(7))] == [t.to_json() for t in tasks]
    assert arc.verify(round_trip(tasks[0]), arc.reference(tasks[0])).correct


def test_levels_raise_the_curriculum_settings(chain_sum):
    assert chain_sum.levels == tuple(range(1, len(chain_sum.levels) + 1))
    configs = [config for _, config in chain_sum._levels]
    for easier, harder in zip(configs, configs[1:]):
        assert (harder.max_terms, harder.max_digits) >= (easier.max_terms, easier.max_digits)
        assert (harder.max_terms, harder.max_digits) != (easier.max_terms, easier.max_digits)

    def terms(level):  # what the tasks show: the number of terms in the expression
        return [t.payload["entry"]["metadata"]["num_terms"] for t in chain_sum.sample(level, 30, random.Random(1))]

    top = chain_sum.levels[-1]
    assert max(terms(1)) < max(terms(top))
    assert sum(terms(1)) < sum(terms(top))
    assert load("rg_chain_sum", {"max_level": 2}).levels == (1, 2)
    assert load("rg_acre").levels == (1,)  # no curriculum: one level, the default configuration


def test_a_level_the_dataset_rejects_is_dropped():
    # reasoning-gym 0.1.25's caesar_cipher curriculum asks for rotations above 25 from its third level
    caesar = load("rg_caesar_cipher")
    assert all(config.max_rotation <= 25 for _, config in caesar._levels)
    for level in caesar.levels:
        assert caesar.sample(level, 2, random.Random(level))


def test_unknown_level_is_a_clear_error(chain_sum):
    with pytest.raises(ValueError, match="has no level 99"):
        chain_sum.sample(99, 1, random.Random(0))


# -- verifying ----------------------------------------------------------------------------------------
def reference_tasks():
    tasks, domains = [], {}
    for name in REFERENCE_DATASETS:
        domain = load(f"rg_{name}")
        domains[domain.name] = domain
        tasks += domain.sample(min(2, domain.levels[-1]), 2, random.Random(name))
    return domains, tasks


def test_references_score_one_through_the_verifier_pool():
    domains, tasks = reference_tasks()
    assert len(domains) >= 30
    items = [(round_trip(task), domains[task.domain].reference(task)) for task in tasks]
    assert all(reference for _, reference in items)
    with VerifierPool(domains, workers=1) as pool:
        verdicts = pool.verify_many(items)
    failed = [(t.domain, v.result.to_json()) for (t, _), v in zip(items, verdicts) if not v.result.correct]
    assert not failed
    assert all(v.result.reward == 1.0 and v.result.status is Status.OK for v in verdicts)


def test_a_bare_answer_and_an_answer_after_thinking_are_accepted(chain_sum):
    task = chain_sum.sample(1, 1, random.Random(3))[0]
    answer = task.payload["entry"]["answer"]
    for completion in (answer, f" {answer}\n", f"<think>sum it</think><answer>{answer}</answer>",
                       f"<answer>0</answer> no wait <answer>{answer}</answer>"):
        assert chain_sum.verify(task, completion).correct, completion
    strict = load("rg_chain_sum", {"require_answer_tag": True})
    assert strict.verify(task, answer).status is Status.FORMAT_ERROR


@pytest.mark.parametrize("completion, status", [
    ("", Status.FORMAT_ERROR),
    ("   \n", Status.FORMAT_ERROR),
    ("<think>still thinking", Status.FORMAT_ERROR),
    ("<answer>12", Status.FORMAT_ERROR),
    ("<answer></answer>", Status.FORMAT_ERROR),
    ("<answer>not a number</answer>", Status.WRONG),
    ("\x00\x01\ufffd" * 50, Status.WRONG),
    ("<answer>-99999999999999999999</answer>", Status.WRONG),
])
def test_garbage_scores_zero_with_a_status(chain_sum, completion, status):
    task = chain_sum.sample(1, 1, random.Random(5))[0]
    result = chain_sum.verify(task, completion)
    assert (result.reward, result.correct, result.status) == (0.0, False, status)
    assert result.status is Status.WRONG or result.details["message"]


def test_malformed_completions_score_zero_on_other_datasets():
    for name in ("rg_sudoku", "rg_graph_color", "rg_arc_agi", "rg_propositional_logic", "rg_countdown"):
        domain = load(name)
        task = domain.sample(1, 1, random.Random(0))[0]
        for completion in ("", "<answer>[[[", "<answer>" + "9" * 5000 + "</answer>", "{}"):
            result = domain.verify(task, completion)
            assert not result.correct and result.reward < 1.0
            assert result.status in (Status.FORMAT_ERROR, Status.WRONG, Status.ERROR)


def test_a_scorer_that_raises_on_the_models_answer_is_a_verdict_on_that_answer():
    factors = load("rg_prime_factorization")
    task = factors.sample(1, 1, random.Random(0))[0]
    for answer in ("abc", "2 x 3 x"):  # int() of a factor that is not a number raises in the scorer
        result = factors.verify(task, f"<answer>{answer}</answer>")
        assert (result.status, result.reward, result.scored) == (Status.ERROR, 0.0, True), result
    assert factors.verify(task, factors.reference(task)).correct


def test_a_scorer_that_gives_no_number_is_judged_like_one_that_raises(monkeypatch):
    from domains import reasoning_gym

    chain = load("rg_chain_sum")
    task = chain.sample(1, 1, random.Random(0))[0]
    gold = str(task.payload["entry"]["answer"])
    # NaN for any answer but the gold one: a verdict on the model's answer (it scored its own)
    monkeypatch.setitem(reasoning_gym.SCORER_FIXES, "chain_sum", lambda a, e: 1.0 if a == gold else math.nan)
    result = chain.verify(task, "<answer>x</answer>")
    assert (result.status, result.reward, result.scored) == (Status.ERROR, 0.0, True), result
    assert "score_answer returned nan" in result.details["message"]
    assert chain.verify(task, f"<answer>{gold}</answer>").correct
    # NaN for the gold answer too: the scorer cannot score this task, so no verdict
    monkeypatch.setitem(reasoning_gym.SCORER_FIXES, "chain_sum", lambda a, e: math.inf)
    assert not chain.verify(task, f"<answer>{gold}</answer>").scored


def test_a_scorer_that_raises_becomes_status_error():
    sudoku = load("rg_sudoku")
    task = sudoku.sample(1, 1, random.Random(0))[0]
    entry = {k: v for k, v in task.payload["entry"].items() if k != "metadata"}  # sudoku's scorer reads it
    broken = Task(task.domain, task.level, task.prompt, {**task.payload, "entry": entry})
    for result in (sudoku.verify(broken, sudoku.reference(task)), verify_guarded(sudoku, broken, "<answer>1</answer>")):
        assert (result.status, result.reward, result.correct) == (Status.ERROR, 0.0, False)
        assert "KeyError" in result.details["message"]
        assert not result.scored  # the scorer fails on the task's own answer too: no verdict on this one
    elsewhere = Task(task.domain, task.level, task.prompt, {**task.payload, "curriculum_level": 999})
    assert sudoku.verify(elsewhere, sudoku.reference(task)).status is Status.ERROR
    assert sudoku.verify(Task(task.domain, 1, task.prompt, {}), "<answer>1</answer>").status is Status.ERROR


# -- JSON --------------------------------------------------------------------------------------------
def test_tasks_round_trip_through_json():
    for name in ("rg_arc_agi", "rg_graph_color", "rg_codeio", "rg_knights_knaves", "rg_chain_sum"):
        domain = load(name)
        for task in domain.sample(1, 2, random.Random(11)):
            text = json.dumps(task.to_json(), allow_nan=False)  # strict JSON: no NaN, no objects
            again = domain.task_from_json(json.loads(text))
            assert again == task
            # the stored entry decodes to exactly what reasoning-gym generated (tuples, int keys, ...)
            regenerated = domain._entry({**task.payload, "lossy": ["forces regeneration"]})
            assert domain._entry(again.payload) == regenerated
            reference = domain.reference(task) or "<answer>x</answer>"
            assert domain.verify(again, reference) == domain.verify(task, reference)


def test_encoding_is_reversible_and_marks_what_json_cannot_hold():
    value = {"t": (1, (2, "a")), "s": {3, 4}, 5: [1.5, float("inf")], "n": None}
    lossy: list[str] = []
    encoded = encode(value, lossy)
    assert not lossy and decode(json.loads(json.dumps(encoded, allow_nan=False))) == value
    encode({"x": object()}, lossy)
    assert lossy == ["object"]


def test_domains_survive_pickling_for_spawned_workers(chain_sum):
    import pickle

    clone = pickle.loads(pickle.dumps(chain_sum))
    assert isinstance(clone, ReasoningGymDomain) and clone.levels == chain_sum.levels
    task = chain_sum.sample(1, 1, random.Random(2))[0]
    assert clone.verify(task, chain_sum.reference(task)).correct


# -- training -----------------------------------------------------------------------------------------
@pytest.mark.slow  # 61 s on a 2-core AVX2 machine (2026-12-05), most of it the held-out evaluation of 105 domains
def test_training_runs_on_every_reasoning_gym_domain(tmp_path):
    from curriculum.store import StatsStore
    from trainer.app import run

    steps, prompts, group = 2, 8, 2
    config = validate_config(quick({
        "name": "rg", "seed": 0, "output_dir": str(tmp_path / "run"),
        "model": {"type": "tiny", "tiny": {"hidden_size": 32, "layers": 2, "heads": 2, "kv_heads": 1,
                                            "intermediate_size": 64}},
        "domains": ["rg_*"], "domain_options": {"rg_*": {"max_level": 1}},
        "policy": {"type": "learnability"}, "difficulty": {"type": "threshold"},
        "trainer": {"steps": steps, "prompts_per_step": prompts, "group_size": group, "max_new_tokens": 8,
                    "rollout_batch_size": 8, "micro_batch_size": 2, "beta": 0.0},
        "verifier": {"workers": 1}, "sft": {"steps": 0}, "eval": {"tasks_per_level": 1},
        "checkpoint": {"every": 0},
    }))
    summary = run(config)
    assert len([k for k in summary["before"] if k.count("/") == 1 and k != "eval/macro"]) >= 100
    with StatsStore(f"sqlite:///{tmp_path / 'run' / 'palestra.db'}") as store:
        [stored] = store.runs()
        rows = store.results(stored["id"])
    assert stored["status"] == "finished"
    assert len(rows) == steps * prompts * group
    attempted = {r["domain"] for r in rows}
    assert len(attempted) == steps * prompts  # the credit moves each step's prompts to new domains
    assert all(r["domain"].startswith("rg_") and r["status"] in {"ok", "wrong", "format_error"} for r in rows)


def test_the_training_preset_selects_every_domain_at_level_one():
    from hydra import compose, initialize_config_dir

    from trainer.app import CONF_DIR, to_config

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["output_dir=/tmp/unused", "+experiment=reasoning_gym",
                                                       "domains=[rg_*_sum,arithmetic]"])
    config = to_config(cfg)
    assert config.domains == ["rg_*_sum", "arithmetic"] and config.sft.steps == 0
    loaded = load_all(config.domains, config.domain_options)
    assert set(loaded) == {"rg_chain_sum", "rg_decimal_chain_sum", "arithmetic"}
    assert loaded["rg_chain_sum"].levels == (1,) and len(loaded["arithmetic"].levels) == 5


def test_a_scorer_that_accepts_anything_is_replaced():
    # reasoning-gym 0.1.25's own game_of_life_halting scorer gives 1 to every non-empty answer
    halting = load("rg_game_of_life_halting")
    for task in halting.sample(1, 4, random.Random(0)):
        gold = task.payload["entry"]["answer"]
        other = {"True": "False", "False": "True"}[gold]
        assert halting.verify(task, f"<answer>{gold.lower()}</answer>").correct
        for wrong in (other, "x", "?"):
            assert halting.verify(task, f"<answer>{wrong}</answer>").reward == 0.0


def test_gsm_symbolic_pays_only_an_answer_that_is_the_one_right_number():
    # reasoning-gym 0.1.25's gsm_symbolic scorer grades the first number in the answer: the echoed
    # question is correct when its first number is the answer (1 of these 60 held-out tasks, 6 of 200)
    from domains.reasoning_gym import CANARIES, extract

    gsm = load("rg_gsm_symbolic")
    own_scorer = gsm._scorer(None).score_answer
    echoed = [t for t in gsm.heldout(1, 60, 1234)
              if own_scorer(extract(CANARIES["prompt_echoed"](t), False)[0], gsm._entry(t.payload)) == 1.0]
    assert echoed
    assert all(gsm.verify(t, CANARIES["prompt_echoed"](t)).reward == 0.0 for t in echoed)
    task = echoed[0]
    gold = task.payload["entry"]["answer"]
    for completion, reward in ((gold, 1.0), (f"<answer>{gold} minutes</answer>", 1.0), (f"{gold}.0", 1.0),
                               (f"{gold} or 7", 0.0), (f"7, {gold}", 0.0), (f"-{gold}", 0.0), ("none", 0.0)):
        assert gsm.verify(task, completion).reward == reward, completion


def test_sokoban_pays_only_an_answer_made_of_moves():
    # reasoning-gym 0.1.25's sokoban scorer plays every L, R, U, D in the answer and skips the rest:
    # the echoed question (its letters, the example "LDURRUDL") solved 4 of 780 held-out puzzles
    sokoban = load("rg_sokoban")
    task = sokoban.sample(1, 1, random.Random(0))[0]
    gold = task.payload["entry"]["answer"]
    own_scorer = sokoban._scorer(task.payload["curriculum_level"]).score_answer
    assert own_scorer(f"the answer is {gold}, done", sokoban._entry(task.payload)) == 1.0
    for completion, reward in ((gold, 1.0), (" ".join(gold), 1.0), (f"<answer>\n{gold}\n</answer>", 1.0),
                               (f"the answer is {gold}, done", 0.0), (f"{gold}!", 0.0), ("LDURRUDL", 0.0)):
        assert sokoban.verify(task, completion).reward == reward, completion


# -- canaries under the default reward ----------------------------------------------------------------
# The datasets whose scorers pay the prompt echo most under reasoning-gym's own scores (measured with
# scripts/rg_canary_sweep.py: rotate_matrix up to 0.99, manipulate_matrix 0.98, spell_backward 0.5, ...)
# and two where it scores at a higher level only; the fast test checks their hardest level too.
ECHO_PAID_MOST = ["rotate_matrix", "manipulate_matrix", "spell_backward", "figlet_font", "word_sorting",
                  "sentence_reordering", "mini_sudoku", "syllogism"]


def canary_verdicts(domain, level: int, per_level: int) -> list[tuple[str, float, float]]:
    """(canary, reward, raw score) of every canary on ``per_level`` held-out tasks of ``level``, drawn
    as ``palestra verify --canaries`` draws them (seed 1234)."""
    verdicts = []
    for task in domain.heldout(level, per_level, 1234):
        for canary, write in domain.canaries().items():
            completion = write(task)
            if completion is not None:
                result = domain.verify(task, completion)
                verdicts.append((canary, result.reward, float(result.details.get("score", 0.0))))
    return verdicts


def test_no_canary_earns_reward_on_any_dataset_under_the_default_reward():
    # every dataset at level 1, and the hardest level of those where the echo scores most: 6-8 s
    paid, scored = [], set()
    for dataset in dataset_names():
        domain = load(f"rg_{dataset}")
        levels = {1, domain.levels[-1]} if dataset in ECHO_PAID_MOST else {1}
        for level in sorted(levels):
            for canary, reward, score in canary_verdicts(domain, level, 2):
                if reward > 0:
                    paid.append((dataset, level, canary, reward))
                if score > 0:
                    scored.add(dataset)
    assert paid == []
    # not vacuous: the scorers did give the echo partial scores, which the binary reward does not pay
    assert {"rotate_matrix", "manipulate_matrix", "spell_backward"} <= scored and len(scored) >= 20


def test_palestra_verify_canaries_passes_on_rotate_matrix(capsys):
    # the check that found the echo paid 0.97 here under the former default (partial credit)
    assert cli_main(["verify", "--domain", "rg_rotate_matrix", "--canaries", "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert "rg_rotate_matrix: 40 canary completions (5 canaries: " in err and "0 earned reward" in err


def test_partial_credit_is_opt_in_and_pays_only_above_its_threshold():
    from domains.reasoning_gym import CANARIES

    rotate = load("rg_rotate_matrix")
    task = rotate.heldout(rotate.levels[-1], 1, 1234)[0]  # a rotation by 360 degrees x k: the echo holds the gold
    echo = CANARIES["prompt_echoed"](task)
    score = rotate.verify(task, echo).details["score"]
    assert 0.95 < score < 0.99
    rewards = {}
    for name, options in {"default": {}, "partial": {"partial_credit": True},
                          "partial above 0.9": {"partial_credit": True, "partial_credit_above": 0.9},
                          "threshold alone": {"partial_credit_above": 0.0}}.items():
        domain = load("rg_rotate_matrix", options)
        result = domain.verify(task, echo)
        assert (result.correct, result.status, result.details["score"]) == (False, Status.WRONG, score)
        assert domain.verify(task, rotate.reference(task)).reward == 1.0
        rewards[name] = result.reward
    assert rewards == {"default": 0.0, "partial": 0.0, "partial above 0.9": score, "threshold alone": 0.0}


@pytest.mark.parametrize("options, message", [
    ({"partial_credit_above": 1.0}, "partial_credit_above: Input should be less than 1"),
    ({"partial_credit_above": -0.1}, "partial_credit_above: Input should be greater than or equal to 0"),
    ({"partial_credit_above": "high"}, "partial_credit_above: Input should be a valid number"),
    ({"partial_credit": "sometimes"}, "partial_credit: Input should be a valid boolean"),
    ({"partial_credit_below": 0.5}, "partial_credit_below: Extra inputs are not permitted"),
])
def test_bad_reward_options_are_one_line_errors(options, message):
    with pytest.raises(DomainError) as caught:
        load("rg_chain_sum", options)
    assert "\n" not in str(caught.value) and f"invalid options: {message}" in str(caught.value)


@pytest.mark.slow
def test_no_canary_earns_reward_at_any_level_of_any_dataset_through_the_pool():
    # every dataset, every level, two held-out tasks each, through the verifier pool as the run's
    # canary check does: 60-70 s on a loaded 2-core machine
    from domains.canaries import canary_alarms, run_canaries

    domains = load_all(["rg_*"])
    with VerifierPool(domains, workers=2) as pool:
        results = run_canaries(domains, pool, 2, seed=1234)
        pool.raise_if_broken()
    assert canary_alarms(results) == []
    assert [r for r in results if r.status == "canary_error" or not r.scored] == []
    assert len({r.domain for r in results}) == len(dataset_names())


def test_a_heldout_set_that_covers_a_datasets_task_space_fails_at_the_start_in_one_line():
    from curriculum.tasks import TaskSource
    from trainer.recipe.evaluate import heldout_tasks
    domains = load_all(["rg_coin_flip", "arithmetic"], {"rg_*": {"max_level": 1}})  # coin_flip: 8 tasks at level 1
    covering = {t.id for t in heldout_tasks(domains, 4, seed=1234, min_per_domain=20)}
    with pytest.raises(DomainError, match="domain 'rg_coin_flip' level 1: could not draw 1 tasks outside the held-out"):
        TaskSource(domains, covering, seed=0)
    partial = {t.id for t in heldout_tasks(domains, 4, seed=1234)}
    plan = {("rg_coin_flip", 1): 16, ("arithmetic", 2): 4}
    drawn = TaskSource(domains, partial, seed=0).draw(plan, step=1)
    assert len(drawn) == 20 and not {t.id for t in drawn} & partial
    # the check's own draws leave the training stream where it was
    unchecked = TaskSource(domains, set(), seed=0).draw(plan, step=1)
    checked = TaskSource(domains, {"not-a-task"}, seed=0).draw(plan, step=1)
    assert [t.id for t in checked] == [t.id for t in unchecked]
