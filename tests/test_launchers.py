"""Sweeps through Hydra's cluster launchers: submitit (SLURM; ``submitit_local`` runs the same code
path on this machine) and Ray. Every job of a sweep writes to one PostgreSQL store under the
sweep's id, and ``palestra compare`` reads it; a job that its scheduler interrupts is requeued by
submitit and, with ``resume=auto``, goes on from its last checkpoint without counting a step twice.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from curriculum.cli import main as cli
from databases import PG_URL, needs_pg

HERE = Path(__file__).resolve().parent


def _sim_sweep(tmp_path: Path, launcher: list[str], sweep_id: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "curriculum.sim.app", "-m", *launcher, f"hydra.sweep.dir={tmp_path / 'sweep'}",
            "policy=uniform,dump", "seed=0,1", "sim=small", "sim.steps=60", f"store.url={PG_URL}",
            f"sweep_id={sweep_id}"]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)


def _compared(sweep_id: str, capsys) -> dict:
    capsys.readouterr()
    assert cli(["compare", "--db", PG_URL, "--sweep", sweep_id, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@needs_pg
def test_a_2x2_sweep_through_submitit_local_is_compared_from_one_postgres_store(tmp_path, capsys):
    sweep_id = f"submitit-{uuid.uuid4().hex[:8]}"
    done = _sim_sweep(tmp_path, ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5"], sweep_id)
    assert done.returncode == 0, done.stderr[-2000:]
    # each job ran in its own process, under submitit's job environment
    logs = sorted((tmp_path / "sweep" / ".submitit").glob("*/*_log.out"))
    assert len(logs) == 4
    assert all('"sweep_id": "' + sweep_id + '"' in log.read_text() for log in logs)
    compared = _compared(sweep_id, capsys)
    assert sorted(compared["policies"]) == ["dump", "uniform"]
    assert all(metrics["auc"]["n"] == 2 for metrics in compared["policies"].values())


@pytest.mark.slow
@needs_pg
def test_a_sweep_through_the_ray_launcher_is_compared_from_one_postgres_store(tmp_path, capsys):
    sweep_id = f"ray-{uuid.uuid4().hex[:8]}"
    done = _sim_sweep(tmp_path, ["hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2"], sweep_id)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Ray Launcher is launching 4 jobs" in done.stdout + done.stderr
    compared = _compared(sweep_id, capsys)
    assert sorted(compared["policies"]) == ["dump", "uniform"]
    assert all(metrics["auc"]["n"] == 2 for metrics in compared["policies"].values())


def _train_sweep(sweep_dir: Path, steps: int) -> subprocess.Popen:
    # one job, checkpointed every step; resume=auto makes its requeued run go on, not start over
    args = [sys.executable, "-m", "trainer.app", "-m", "hydra/launcher=submitit_local", f"hydra.sweep.dir={sweep_dir}",
            "hydra.launcher.timeout_min=10", "seed=5", f"trainer.steps={steps}", "trainer.prompts_per_step=4",
            "trainer.group_size=4", "trainer.sampling.max_new_tokens=8", "trainer.sampling.rollout_batch_size=16",
            "trainer.optim.micro_batch_size=16", "verifier.workers=1", "sft.steps=3", "sft.batch_size=8",
            "eval.tasks_per_level=1", "checkpoint.every=1", "model.tiny.hidden_size=32", "model.tiny.layers=2",
            "model.tiny.heads=2", "model.tiny.kv_heads=1", "model.tiny.intermediate_size=64", "resume=auto",
            "domains=[arithmetic,fractions]"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "TQDM_DISABLE": "1"}, cwd=sweep_dir.parent)


def _submitit_task(launch: subprocess.Popen) -> psutil.Process:
    tasks = [p for p in psutil.Process(launch.pid).children(recursive=True)
             if "submitit.core._submit" in " ".join(p.cmdline())]
    assert len(tasks) == 1, tasks
    return tasks[0]


@pytest.mark.slow
def test_a_preempted_submitit_job_is_requeued_and_resumes_without_counting_a_step_twice(tmp_path):
    steps = 5
    sweep_dir = tmp_path / "sweep"
    launch = _train_sweep(sweep_dir, steps)
    deadline = time.time() + 300
    while not (sweep_dir / "0" / "checkpoints" / "step-0000002").exists():
        assert launch.poll() is None and time.time() < deadline, launch.stdout.read().decode()[-2000:]
        time.sleep(0.05)
    # what SLURM sends before it preempts a job (submitit asks for SIGUSR2); submitit requeues it
    _submitit_task(launch).send_signal(signal.SIGUSR2)
    assert launch.wait(timeout=300) == 0, launch.stdout.read().decode()[-2000:]
    log = "".join(p.read_text() for p in (sweep_dir / ".submitit").glob("*/*_log.*"))
    assert "Caught signal SIGUSR2" in log and "resuming run" in log
    db = sqlite3.connect(sweep_dir / "palestra.db")
    assert db.execute("SELECT status, last_step FROM runs").fetchall() == [("finished", steps)]
    per_step = dict(db.execute("SELECT step, count(*) FROM results GROUP BY step").fetchall())
    assert sorted(per_step) == list(range(1, steps + 1)) and len(set(per_step.values())) == 1, per_step
    db.close()
