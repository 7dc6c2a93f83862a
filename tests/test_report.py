"""`palestra report` writes PNGs and one self-contained HTML page, for a run and for a sweep; the
page is parsed here as a browser would read it (scripts/report_browser_check.py opens it in one)."""
import base64
from html.parser import HTMLParser

import numpy as np
import pytest

from curriculum.cli import main
from curriculum.config import parse_difficulty, parse_policy
from curriculum.heatmaps import MAX_PAGES, ROWS_PER_PAGE, HeatMap, draw, pages
from curriculum.sim.config import ScenarioConfig, SimAppConfig
from curriculum.sim.runner import run_sim
from curriculum.store import StatsStore

import matplotlib  # noqa: F401  (the report extra; make test installs it)


@pytest.fixture(scope="module")
def sweep_db(tmp_path_factory):  # built once: the tests only read it (and add one alarm)
    url = f"sqlite:///{tmp_path_factory.mktemp('sweep') / 'r.db'}"
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


class Page(HTMLParser):
    """What a reader sees: headings, images, tables (as header + rows of cell text), and every URL."""

    def __init__(self, text: str):
        super().__init__()
        self.headings, self.images, self.tables, self.urls, self.tags = [], [], [], [], set()
        self._heading = self._cell = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        self.urls += [attrs[k] for k in ("src", "href") if k in attrs]
        if tag == "img":
            self.images.append((attrs["alt"], attrs["src"]))
        elif tag == "h2":
            self._heading = ""
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag == "h2":
            self.headings.append(self._heading)
            self._heading = None
        elif tag in ("td", "th"):
            self.tables[-1][-1].append(self._cell)
            self._cell = None

    def handle_data(self, data):
        if self._heading is not None:
            self._heading += data
        if self._cell is not None:
            self._cell += data


def read_page(path) -> Page:
    page = Page(path.read_text(encoding="utf-8"))
    # one file: every image inline, nothing fetched, nothing run
    assert all(url.startswith("data:") for url in page.urls) and "script" not in page.tags
    for name, src in page.images:
        png = base64.b64decode(src.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and png == (path.parent / name).read_bytes()
    return page


def test_run_report(sweep_db, tmp_path, capsys):
    url, ids = sweep_db
    with StatsStore(url) as store:  # what the trainer stores when its health monitor alarms
        store.merge_metrics(ids[1], 5, {"alarms": ["KL 0.3000 above 0.1"]})
    out = tmp_path / "run"
    assert main(["report", "--db", url, "--run", ids[1][:8], "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "index.html")
    page = read_page(out / "index.html")
    assert {name for name, _ in page.images} == {"macro.png", "weights.png", "levels.png", "heldout.png", "kinds.png"}
    assert page.headings[-3:] == ["Per domain", "Health alarms", "Config"]
    [table] = page.tables
    head, rows = table[0], table[1:]
    assert head[:8] == ["domain", "kind", "share of rollouts", "planned share", "trained share",
                        "share of varied groups", "rollouts", "level (last)"]
    assert "held-out (first)" in head and "training success (last 10%)" in head
    assert [r[0] for r in rows] == [f"d{i}" for i in range(10)]
    for column in (2, 3, 4, 5):  # shares of the rollouts, planned prompts, trained and varied groups
        assert sum(float(r[column].rstrip("%")) for r in rows) == pytest.approx(100, abs=0.1)
    assert [r[3] for r in rows] == [r[4] for r in rows]  # without refills every planned group trains
    assert {r[1] for r in rows} >= {"plain", "noisy", "unlearnable"}
    text = (out / "index.html").read_text()
    assert "step 5: KL 0.3000 above 0.1" in text and "&quot;type&quot;: &quot;uniform&quot;" in text  # the alarm, the config


def test_sweep_report_names_every_policy_and_seed(sweep_db, tmp_path):
    url, ids = sweep_db
    out = tmp_path / "sweep"
    assert main(["report", "--db", url, "--sweep", "s", "--out", str(out)]) == 0
    page = read_page(out / "index.html")
    assert {name for name, _ in page.images} == {"curves.png", "comparison.png", "kinds.png"}
    runs = {row[0]: row for row in page.tables[0][1:]}
    assert runs["uniform"][1] == "0, 1" and runs["learnability"][1] == "0, 1"
    assert ids[2][:8] in runs["learnability"][2]
    assert "paired-seed t-based 95% CIs" in (out / "index.html").read_text()


def labels(fig):
    return [t.get_text() for t in fig.axes[0].get_yticklabels()]


def test_heat_map_rows_are_named_most_changed_first_and_paged():
    import matplotlib.pyplot as plt

    n = 2 * ROWS_PER_PAGE + 5
    names = [f"dom{i:03d}" for i in range(n)]
    matrix = np.zeros((6, n))
    matrix[:, 7] = np.linspace(0, 1, 6)  # moves most
    matrix[:, 3] = np.linspace(0, 0.5, 6)  # second
    figures = draw(plt, HeatMap(np.arange(6.0), matrix, names, "t", "v"))
    assert len(figures) == 3 and [len(labels(f)) for f in figures] == [ROWS_PER_PAGE, ROWS_PER_PAGE, 5]
    first = labels(figures[0])
    assert first[:3] == ["dom007", "dom003", "dom000"]  # then the unchanged ones, in name order
    assert sorted(sum((labels(f) for f in figures), [])) == names  # every domain once
    assert len(pages(10_000)) == MAX_PAGES and pages(10_000)[-1].stop == MAX_PAGES * ROWS_PER_PAGE
    plt.close("all")


def test_levels_get_one_colour_each():
    import matplotlib.pyplot as plt

    levels = np.array([[1, 1, 4], [2, 1, 4], [2, 2, 7]], dtype=float)
    [fig] = draw(plt, HeatMap(np.arange(3.0), levels, ["a", "b", "c"], "levels", "level", discrete=True))
    image, bar = fig.axes[0].images[0], fig.axes[1]
    assert [t.get_text() for t in bar.get_yticklabels()] == ["1", "2", "4", "7"]
    assert image.cmap.N == 4  # four colours, one per level that occurs
    plt.close("all")


def test_report_needs_a_run_or_a_sweep(sweep_db):
    url, _ = sweep_db
    with pytest.raises(SystemExit):
        main(["report", "--db", url])
