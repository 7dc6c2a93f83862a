"""The Ray verifier fleet (``verifier.backend=ray``) on a real local Ray: the same verdicts as the
local pool, hard deadlines that hold even in C code, errors instead of exceptions, an existing cluster
joined by address and left running, and a GRPO run that verifies on Ray.

One local Ray per module (2 CPUs), started by the module's pool and shared by every other pool here:
starting Ray costs about ten seconds on a busy two-core machine, each actor about one more.
"""
from __future__ import annotations

import random
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import ray  # the ray extra (make test installs it)

sys.path.insert(0, str(Path(__file__).parent))  # the Ray workers import pool_helpers from here too
from pool_helpers import UNRULY, task, wait_until_every_worker_is_up  # noqa: E402

from curriculum.store import StatsStore  # noqa: E402
from domains.api import Status, Task, user_prompt  # noqa: E402
from domains.verify.backend import make_pool, VerifierConfig  # noqa: E402
from domains.verify.pool import Verdict, VerifierPool  # noqa: E402
from domains.verify.ray_pool import RayVerifierPool  # noqa: E402
from domains.registry import load  # noqa: E402
from trainer.config import ConfigError, validate_config  # noqa: E402
from quick_settings import quick  # noqa: E402

DEADLINE_S = UNRULY.config.verify_timeout_s
RESULT_WAIT_S = 60  # a bound on Future.result so a broken pool fails the test instead of hanging
BUILTIN = ("arithmetic", "linear_equations", "fractions", "code_functions")
# Half a CPU per actor: the module's two actors leave one of Ray's two CPUs to the other pools here.
SHARED_CPUS_PER_WORKER = 0.5


@pytest.fixture(scope="module")
def pool():
    domains = {"unruly": UNRULY, **{name: load(name) for name in BUILTIN}}
    with RayVerifierPool(domains, workers=2, num_cpus=2, cpus_per_worker=SHARED_CPUS_PER_WORKER) as shared:
        yield shared
    assert not ray.is_initialized(), "the pool that started Ray did not stop it"


def _verify(pool, completion: str) -> Verdict:
    return pool.submit(task(), completion).result(timeout=RESULT_WAIT_S)


def _still_works(pool) -> None:
    assert _verify(pool, "ok").result.status == Status.OK


# -- the same verdicts as the local pool ----------------------------------------------------------------
def _mixed_items(domains) -> list[tuple[Task, str]]:
    """Per built-in domain: right, wrong and malformed answers, over its easiest and hardest levels."""
    rng = random.Random(7)
    items = []
    for name in BUILTIN:
        domain = domains[name]
        for level in (domain.levels[0], domain.levels[-1]):
            for t in domain.sample(level, 2, rng):
                items += [(t, domain.reference(t)), (t, r"\boxed{3}"), (t, "```python\ndef f(x):\n return 0\n```")]
    return items


def test_same_verdicts_as_the_local_pool(pool):
    domains = {name: pool.domains[name] for name in BUILTIN}
    items = _mixed_items(domains)
    on_ray = pool.verify_many(items)
    with VerifierPool(domains, workers=2) as local_pool:
        local = local_pool.verify_many(items)
    assert [v.result.to_json() for v in on_ray] == [v.result.to_json() for v in local]
    statuses = {v.result.status for v in on_ray}
    assert {Status.OK, Status.WRONG, Status.FORMAT_ERROR} <= statuses  # not a comparison of errors
    assert all(v.latency_s >= 0 for v in on_ray)


def test_make_pool_builds_the_configured_backend(pool):
    with make_pool({"unruly": UNRULY}, VerifierConfig(backend="ray", workers=1,
                                                      ray_cpus_per_worker=SHARED_CPUS_PER_WORKER)) as second:
        assert isinstance(second, RayVerifierPool)
        _still_works(second)
    assert ray.is_initialized()  # a pool that joined the running Ray leaves it running
    _still_works(pool)


# -- whatever the verifier does, a Verdict --------------------------------------------------------------
@pytest.mark.parametrize("completion, message", [
    ("raise", "verifier raised ZeroDivisionError"),
    ("garbage", "not VerifyResult"),
    ("unsendable", "result not sendable"),
])
def test_a_misbehaving_verifier_gives_status_error(pool, completion, message):
    verdict = _verify(pool, completion)
    assert verdict.result.status == Status.ERROR and verdict.result.reward == 0.0
    assert message in verdict.result.details["message"]
    _still_works(pool)


@pytest.mark.parametrize("completion", ["exit", "sysexit"])
def test_a_dead_worker_becomes_error_and_is_replaced(pool, completion):
    restarts = pool.restarts
    verdict = _verify(pool, completion)
    assert verdict.result.status == Status.ERROR and "worker died" in verdict.result.details["message"]
    assert not verdict.result.scored
    assert pool.restarts == restarts + 1
    _still_works(pool)


def test_a_hang_times_out_at_the_deadline(pool):
    timeouts, restarts = pool.timeouts, pool.restarts
    start = time.monotonic()
    verdict = _verify(pool, "hang")
    assert verdict.result.status == Status.TIMEOUT
    # margins for a busy machine; a hang never stopped would outlast RESULT_WAIT_S
    assert DEADLINE_S <= verdict.latency_s < DEADLINE_S + 5 and time.monotonic() - start < DEADLINE_S + 15
    assert (pool.timeouts, pool.restarts) == (timeouts + 1, restarts + 1)
    _still_works(pool)


def _worker_running_a_call(seconds: float = 20.0) -> psutil.Process:
    """The Ray worker process busy in a verify() call (Ray titles it after the method it runs)."""
    give_up = time.monotonic() + seconds
    while time.monotonic() < give_up:
        for proc in psutil.process_iter(["cmdline"]):
            if (proc.info["cmdline"] or [""])[0].startswith("ray::VerifierWorker.verify"):
                return proc
        time.sleep(0.05)
    raise AssertionError("no Ray worker was seen running a verify() call")


def test_a_hang_in_c_code_holding_the_gil_is_killed_at_the_deadline(pool):
    future = pool.submit(task(), "block")
    stuck = _worker_running_a_call()
    verdict = future.result(timeout=RESULT_WAIT_S)
    assert verdict.result.status == Status.TIMEOUT and verdict.latency_s < DEADLINE_S + 2
    stuck.wait(timeout=10)  # raises psutil.TimeoutExpired if ray.kill left the process alive
    _still_works(pool)


def test_the_first_call_does_not_pay_for_start_up(pool):
    from pool_helpers import SLOW_START  # loads for 3 s on first use; its deadline is 1 s

    with RayVerifierPool({"slow_start": SLOW_START}, workers=1, cpus_per_worker=SHARED_CPUS_PER_WORKER) as slow:
        first = slow.submit(SLOW_START.sample(1, 1, random.Random(0))[0], "x").result(timeout=RESULT_WAIT_S)
    assert first.result.status == Status.OK, first.result
    assert ray.is_initialized()  # it joined the module's Ray and left it running


def test_a_hang_does_not_block_other_work(pool):
    wait_until_every_worker_is_up(pool)
    hang = pool.submit(task(), "hang")
    quick = [pool.submit(task(), "ok") for _ in range(5)]  # served by the other actor meanwhile
    assert all(f.result(timeout=RESULT_WAIT_S).result.status == Status.OK for f in quick)
    assert not hang.done()
    assert hang.result(timeout=RESULT_WAIT_S).result.status == Status.TIMEOUT


def test_verify_many_keeps_order(pool):
    completions = ["ok", "wrong", "raise", "ok", "wrong"] * 3
    verdicts = pool.verify_many([(task(), c) for c in completions])
    expected = {"ok": Status.OK, "wrong": Status.WRONG, "raise": Status.ERROR}
    assert [v.result.status for v in verdicts] == [expected[c] for c in completions]


def test_unknown_domain_is_an_error_without_a_worker(pool):
    stranger = Task("nobody", 1, user_prompt("?"), {})
    verdict = pool.submit(stranger, "ok").result(timeout=1)
    assert verdict.result.status == Status.ERROR and "unknown domain" in verdict.result.details["message"]


def test_a_cluster_without_room_fails_calls_instead_of_hanging(pool):
    with RayVerifierPool({"unruly": UNRULY}, workers=1, cpus_per_worker=64, start_timeout_s=1) as starved:
        verdict = starved.submit(task(), "ok").result(timeout=RESULT_WAIT_S)
    assert verdict.result.status == Status.ERROR
    assert "no Ray verifier worker came up within 1s" in verdict.result.details["message"]
    _still_works(pool)


# -- an existing cluster, by address ----------------------------------------------------------------------
DRIVER = textwrap.dedent("""
    import sys
    import ray
    from domains.verify.ray_pool import RayVerifierPool
    from domains.registry import load

    arithmetic = load("arithmetic")
    [t] = arithmetic.sample(1, 1, __import__("random").Random(0))
    with RayVerifierPool({"arithmetic": arithmetic}, workers=1, address=sys.argv[1], cpus_per_worker=0.5) as pool:
        print(pool.submit(t, arithmetic.reference(t)).result(timeout=60).result.status.value)
    print("initialised after close:", ray.is_initialized())
""")


def test_an_address_joins_a_running_cluster_and_leaves_it_running(pool, tmp_path):
    """Another driver process joins the module's Ray by address; when its pool closes the cluster
    (which it did not start) keeps serving this process."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    address = ray.get_runtime_context().gcs_address
    done = subprocess.run([sys.executable, str(script), address], capture_output=True, text=True, timeout=240,
                          cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-2:] == ["ok", "initialised after close: False"]
    _still_works(pool)


def test_an_unreachable_address_fails_in_one_line_at_once(tmp_path):
    """In a fresh process (this one's Ray is up and would be reused): Ray itself would retry for minutes."""
    code = ("from domains.verify.ray_pool import RayVerifierPool\n"
            "RayVerifierPool({}, address='127.0.0.1:1')\n")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and time.monotonic() - start < 60
    assert done.stderr.strip().splitlines()[-1] == (
        "domains.verify.pool.VerifierBackendUnavailable: cannot connect to the Ray cluster at '127.0.0.1:1': Connection refused")


# -- configuration ----------------------------------------------------------------------------------------
def _raw(**verifier) -> dict:
    return {"policy": {"type": "uniform"}, "difficulty": {"type": "fixed"}, "verifier": verifier}


def test_ray_backend_without_ray_fails_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without the extra looks like
    with pytest.raises(ConfigError) as caught:
        validate_config(_raw(backend="ray"))
    assert "pip install 'palestra[ray]'" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("raw, message", [
    (_raw(ray_address="auto"), "verifier.ray_address is set but verifier.backend is local"),
    (_raw(backend="ray", ray_address="auto", ray_num_cpus=2), "ray_num_cpus sizes a local Ray"),
    (_raw(backend="dask"), "verifier.backend: Input should be 'local' or 'ray'"),
    ({**_raw(), "trainer": {"verifier_workers": 2}}, "trainer.verifier_workers moved to verifier.workers"),
])
def test_bad_verifier_options_fail_in_one_line(raw, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(raw)


def test_the_conf_tree_selects_ray_by_override():
    from hydra import compose, initialize_config_dir

    from trainer.app import CONF_DIR, to_config

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["output_dir=/tmp/unused", "verifier.backend=ray",
                                                       "verifier.workers=3", "verifier.ray_address=auto"])
    config = to_config(cfg)
    assert (config.verifier.backend, config.verifier.workers, config.verifier.ray_address) == ("ray", 3, "auto")


# -- a GRPO run verifying on Ray ----------------------------------------------------------------------------
@pytest.mark.sandbox
def test_grpo_steps_verify_on_ray(tmp_path, pool):
    from trainer.recipe.grpo import GRPORecipe

    config = validate_config(quick({
        "name": "ray", "seed": 1, "output_dir": str(tmp_path / "run"),
        "model": {"type": "tiny", "tiny": {"hidden_size": 32, "layers": 2, "heads": 2, "kv_heads": 1,
                                            "intermediate_size": 64}},
        "domains": ["arithmetic", "code_functions"], "policy": {"type": "uniform"}, "difficulty": {"type": "fixed"},
        "trainer": {"steps": 2, "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 8,
                    "rollout_batch_size": 16, "micro_batch_size": 16},
        "verifier": {"backend": "ray", "workers": 1, "ray_cpus_per_worker": SHARED_CPUS_PER_WORKER},
        "sft": {"steps": 0}, "eval": {"tasks_per_level": 1},
    }))
    recipe = GRPORecipe(config)
    try:
        recipe.setup()
        assert isinstance(recipe.pool, RayVerifierPool)
        metrics = [recipe.train_step(step) for step in (1, 2)]
    finally:
        recipe.cleanup()
    assert all("loss" in m for m in metrics)
    with StatsStore(f"sqlite:///{tmp_path / 'run' / 'palestra.db'}") as store:
        [run] = store.runs()
        rows = store.results(run["id"])
        assert store.count_results(run["id"]) == 2 * 4 * 4
        assert {s: len(store.results(run["id"], step=s)) for s in (1, 2)} == {1: 16, 2: 16}
    # the verifiers really ran: an untrained model earns verdicts, not pool failures
    assert not {r["status"] for r in rows} & {Status.ERROR.value, Status.TIMEOUT.value}
    assert ray.is_initialized()  # the run joined this module's Ray and left it running


# -- TRL's reward function verifying on Ray ---------------------------------------------------------
def test_the_trl_curriculum_verifies_on_ray(tmp_path, pool):
    from curriculum.config import FixedDifficultyConfig, UniformConfig
    from trainer.integrations.trl import BatchShape, TRLCurriculum

    arithmetic = load("arithmetic")
    store = StatsStore(f"sqlite:///{tmp_path / 'palestra.db'}")
    verifier = VerifierConfig(backend="ray", workers=1, ray_cpus_per_worker=SHARED_CPUS_PER_WORKER)
    with TRLCurriculum({"arithmetic": arithmetic}, BatchShape(2, 2, 4), UniformConfig(), FixedDifficultyConfig(),
                       store, verifier=verifier, owns_store=True) as curriculum:
        assert isinstance(curriculum.pool, RayVerifierPool)
        rows = curriculum.rows()
        step = [next(rows) for _ in range(2)]
        sums = [row["prompt"][-1]["content"].rstrip("=").split("+") for row in step]  # level 1: "a+b="
        right = [f"\\boxed{{{int(a) + int(b)}}}" for a, b in sums]
        completions = [[{"role": "assistant", "content": text}] for text in (right[0], "\\boxed{x}", right[1], "no")]
        repeated = [row for row in step for _ in range(2)]
        rewards = curriculum.palestra_reward(
            [row["prompt"] for row in repeated], completions,
            palestra_step=[row["palestra_step"] for row in repeated],
            palestra_group=[row["palestra_group"] for row in repeated])
        assert rewards == [1.0, 0.0, 1.0, 0.0]  # each completion scored by the arithmetic verifier, on Ray
        assert curriculum.recorded_steps == [1]
    assert ray.is_initialized()  # it joined this module's Ray and left it running

