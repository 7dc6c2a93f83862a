"""`palestra report` writes PNGs and an HTML page that shows them, for a run and for a sweep."""
import re

import pytest

from curriculum.cli import main
from curriculum.config import parse_difficulty, parse_policy
from curriculum.sim.config import ScenarioConfig, SimAppConfig
from curriculum.sim.runner import run_sim
from curriculum.store import StatsStore

import matplotlib  # noqa: F401  (the report extra; make test installs it)


@pytest.fixture()
def sweep_db(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    sim = ScenarioConfig(domains=10, levels=3, steps=12, prompts_per_step=8, group_size=4, cluster_size=5,
                         noisy_share=0.1, unlearnable_share=0.1, domains_every=3)
    ids = []
    with StatsStore(url) as store:
        for policy in ("uniform", "learnability"):
            for seed in range(2):
                cfg = SimAppConfig(sim=sim, policy=parse_policy({"type": policy}), seed=seed, sweep_id="s",
                                   difficulty=parse_difficulty({"type": "target"}))
                ids.append(run_sim(cfg, store).run_id)
    return url, ids


def images_of(page):
    return re.findall(r'<img src="([^"]+)"', page.read_text())


def test_run_report(sweep_db, tmp_path, capsys):
    url, ids = sweep_db
    out = tmp_path / "run"
    assert main(["report", "--db", url, "--run", ids[1][:8], "--out", str(out)]) == 0
    page = out / "index.html"
    assert capsys.readouterr().out.strip() == str(page)
    shown = images_of(page)
    assert set(shown) == {"macro.png", "weights.png", "levels.png", "heldout.png", "kinds.png"}
    for name in shown:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_report(sweep_db, tmp_path):
    url, _ = sweep_db
    out = tmp_path / "sweep"
    assert main(["report", "--db", url, "--sweep", "s", "--out", str(out)]) == 0
    page = out / "index.html"
    assert set(images_of(page)) == {"curves.png", "comparison.png", "kinds.png"}
    assert "learnability" in page.read_text() and "paired-seed t-based 95% CIs" in page.read_text()
    assert all((out / n).stat().st_size > 1000 for n in images_of(page))


def test_report_needs_a_run_or_a_sweep(sweep_db):
    url, _ = sweep_db
    with pytest.raises(SystemExit):
        main(["report", "--db", url])
