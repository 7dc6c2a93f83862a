"""The palestra CLI: runs, stats, domains, sample and verify, as a user would call them."""
import json

import pytest

from curriculum.cli import main
from curriculum.config import parse_difficulty, parse_policy
from curriculum.scheduler import Scheduler
from curriculum.store import StatsStore
from curriculum.types import Outcome


@pytest.fixture()
def store_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with StatsStore(url) as store:
        run_id = store.start_run("demo", {"x": 1}, seed=5)
        scheduler = Scheduler({"arithmetic": (1, 2), "fractions": (1, 2)}, parse_policy({"type": "uniform"}),
                              parse_difficulty({"type": "fixed"}), prompts_per_step=2, seed=5, store=store,
                              run_id=run_id)
        for step in (1, 2):
            plan = scheduler.plan(step)
            outcomes = [Outcome(domain=d, level=lv, task_id=f"{d}{step}{g}", group=i, reward=float(g == 0),
                                correct=g == 0, status="ok" if g == 0 else "wrong")
                        for i, ((d, lv), n) in enumerate(plan.counts.items()) for _ in range(n) for g in range(2)]
            scheduler.record(step, outcomes)
        store.finish_run(run_id)
    return url, run_id


def test_runs_lists_the_run(store_url, capsys):
    url, run_id = store_url
    assert main(["runs", "--db", url, "--json"]) == 0
    [run] = json.loads(capsys.readouterr().out)
    assert (run["id"], run["name"], run["status"], run["steps"]) == (run_id, "demo", "finished", 2)
    assert main(["runs", "--db", url]) == 0
    assert run_id in capsys.readouterr().out


def test_stats_per_domain(store_url, capsys):
    url, run_id = store_url
    assert main(["stats", "--db", url, "--run", run_id[:8], "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["domain"]: r for r in report["domains"]}
    assert set(rows) == {"arithmetic", "fractions"}
    assert sum(r["attempts"] for r in rows.values()) == 2 * 2 * 2  # steps x prompts x group
    assert all(r["success_rate"] == 0.5 for r in rows.values() if r["attempts"])
    assert all(r["weight"] == pytest.approx(0.5) and r["level"] == 1 for r in rows.values())


def test_stats_shows_each_domains_verdicts_by_status(tmp_path, capsys):
    """A model that never writes the asked-for format shows as format errors, not as plain failures."""
    url = f"sqlite:///{tmp_path / 'verdicts.db'}"
    with StatsStore(url) as store:
        run_id = store.start_run("verdicts", {}, seed=0)
        scheduler = Scheduler({"arithmetic": (1,)}, parse_policy({"type": "uniform"}),
                              parse_difficulty({"type": "fixed"}), prompts_per_step=1, store=store, run_id=run_id)
        verdicts = [(1.0, True, "ok"), (0.5, False, "ok"), (0.0, False, "wrong"), (0.0, False, "format_error"),
                    (0.0, False, "format_error"), (0.0, False, "error")]
        scheduler.plan(1)
        scheduler.record(1, [Outcome(domain="arithmetic", level=1, task_id="t", group=0, reward=r, correct=c, status=s)
                             for r, c, s in verdicts], {"domain/arithmetic/unscored": 1})
    assert main(["stats", "--db", url, "--run", run_id, "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["domains"]
    assert {k: row[k] for k in ("correct", "partial", "wrong", "format_error", "timeout", "error",
                                "sandbox_violation", "unscored")} == {
        "correct": 1, "partial": 1, "wrong": 1, "format_error": 2, "timeout": 0, "error": 1,
        "sandbox_violation": 0, "unscored": 1}
    assert main(["stats", "--db", url, "--run", run_id]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert "format_error" in header and "unscored" in header


def test_stats_shows_planned_and_trained_shares_and_a_dash_for_a_run_without_trained_counts(store_url, tmp_path,
                                                                                             capsys):
    url, run_id = store_url  # recorded without domain/<name>/trained, as every run before it was
    assert main(["stats", "--db", url, "--run", run_id]) == 0
    header, *lines = capsys.readouterr().out.splitlines()[1:]
    columns = header.split()
    assert columns[6:8] == ["planned_share", "trained_share"]
    assert [line.split()[6:8] for line in lines] == [["0.500", "-"], ["0.500", "-"]]
    assert main(["stats", "--db", url, "--run", run_id, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["domains"]
    assert [(r["planned_share"], r["trained_share"]) for r in rows] == [(0.5, None), (0.5, None)]

    # one step planned 3 math prompts and 1 code prompt; dynamic sampling trained 2 math groups, 2 code
    url = f"sqlite:///{tmp_path / 'shares.db'}"
    with StatsStore(url) as store:
        run_id = store.start_run("shares", {}, seed=0)
        policy = parse_policy({"type": "fixed", "weights": {"math": 3, "code": 1}})
        scheduler = Scheduler({"math": (1,), "code": (1,)}, policy, parse_difficulty({"type": "fixed"}),
                              prompts_per_step=4, store=store, run_id=run_id)
        plan = scheduler.plan(1)
        assert plan.counts == {("math", 1): 3, ("code", 1): 1}
        outcomes = [Outcome(domain=d, level=1, task_id=f"{d}{i}", group=i, reward=0.0, correct=False, status="wrong")
                    for i, d in enumerate(["math", "math", "math", "code", "code"])]
        scheduler.record(1, outcomes, {"domain/math/trained": 2, "domain/code/trained": 2})
    assert main(["stats", "--db", url, "--run", run_id, "--json"]) == 0
    rows = {r["domain"]: r for r in json.loads(capsys.readouterr().out)["domains"]}
    assert {d: (r["planned_share"], r["trained_share"]) for d, r in rows.items()} == {
        "math": (0.75, 0.5), "code": (0.25, 0.5)}
    assert main(["stats", "--db", url, "--run", run_id]) == 0
    assert [line.split()[6:8] for line in capsys.readouterr().out.splitlines()[2:]] == [
        ["0.250", "0.500"], ["0.750", "0.500"]]


def test_stats_shows_each_domains_share_of_the_groups_with_a_reward_spread(tmp_path, capsys):
    # math: one group that split (1, 0) and one that failed whole; code: two that split
    url = f"sqlite:///{tmp_path / 'varied.db'}"
    with StatsStore(url) as store:
        run_id = store.start_run("varied", {}, seed=0)
        scheduler = Scheduler({"math": (1,), "code": (1,)}, parse_policy({"type": "uniform"}),
                              parse_difficulty({"type": "fixed"}), prompts_per_step=4, store=store, run_id=run_id)
        scheduler.plan(1)
        rewards = {0: ("math", [1.0, 0.0]), 1: ("math", [0.0, 0.0]), 2: ("code", [1.0, 0.0]), 3: ("code", [0.0, 1.0])}
        scheduler.record(1, [Outcome(domain=d, level=1, task_id=f"t{g}", group=g, reward=r, correct=r > 0,
                                     status="ok" if r else "wrong")
                             for g, (d, rs) in rewards.items() for r in rs])
    assert main(["stats", "--db", url, "--run", run_id, "--json"]) == 0
    rows = {r["domain"]: r for r in json.loads(capsys.readouterr().out)["domains"]}
    assert {d: (r["varied_groups"], r["varied_share"]) for d, r in rows.items()} == {
        "math": (1, pytest.approx(1 / 3)), "code": (2, pytest.approx(2 / 3))}
    assert main(["stats", "--db", url, "--run", run_id]) == 0
    header, *lines = capsys.readouterr().out.splitlines()[1:]
    at = header.split().index("varied_share")
    assert [line.split()[at] for line in lines] == ["0.667", "0.333"]  # code, math


def test_stats_unknown_run_is_a_clear_error(store_url, capsys):
    url, _ = store_url
    assert main(["stats", "--db", url, "--run", "nope"]) == 2
    assert "matches 0 runs" in capsys.readouterr().err


def test_reading_a_missing_or_broken_database_fails_in_one_line_and_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "typo.db"
    assert main(["runs", "--db", f"sqlite:///{missing}"]) == 2
    assert capsys.readouterr().err == f"error: no database at {missing}\n"
    assert not missing.exists()
    broken = tmp_path / "notes.db"
    broken.write_text("not a database\n" * 100)
    assert main(["stats", "--db", f"sqlite:///{broken}", "--run", "x"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: cannot open the stats store sqlite:///{broken}: file is not a database\n"


def test_reading_another_applications_database_refuses_and_leaves_its_bytes_alone(tmp_path, capsys):
    import sqlite3

    other = tmp_path / "notes.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('keep me')")
    empty = tmp_path / "empty.db"
    empty.touch()
    for path in (other, empty):
        before = path.read_bytes()
        assert main(["runs", "--db", f"sqlite:///{path}"]) == 2
        err = capsys.readouterr().err
        assert "holds no Palestra stats store" in err and err.count("\n") == 1
        assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["empty.db", "notes.db"]


def test_listing_runs_reads_past_a_writer_that_holds_the_database(store_url, capsys):
    import sqlite3

    url, run_id = store_url
    writer = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        writer.execute("BEGIN EXCLUSIVE")  # a training run in the middle of its step's write
        writer.execute("INSERT INTO meta VALUES ('held', 'by a writer')")
        assert main(["runs", "--db", url]) == 0  # WAL: a reader that asks for no write lock waits for none
        assert run_id in capsys.readouterr().out
    finally:
        writer.execute("ROLLBACK")
        writer.close()


@pytest.mark.parametrize("url, says", [
    ("outputs/run/palestra.db", "sqlite:///path/to/file.db"),      # a plain path: the hint
    ("nosuch://host/db", "Can't load plugin"),                      # an unknown backend
    ("mysql://user:secret@localhost/db", "mysql://user:***@localhost/db"),  # no driver; the password hidden
    ("postgresql//user:secret@localhost/db", "store ***@localhost/db"),  # a typo'd scheme: still hidden
    ("postgresql://user:secret@localhost:port/db", "postgresql://***@localhost:port/db"),  # not a port
])
def test_a_store_url_that_cannot_be_used_is_a_one_line_error(url, says, capsys):
    assert main(["runs", "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot open the stats store") and says in err and err.count("\n") == 1
    assert "secret" not in err


def test_a_database_of_a_newer_schema_is_a_one_line_error(tmp_path, capsys):
    from sqlalchemy import update

    from curriculum.schema import MetaRow

    url = f"sqlite:///{tmp_path / 'future.db'}"
    with StatsStore(url) as store, store.engine.begin() as conn:
        conn.execute(update(MetaRow).where(MetaRow.key == "schema_version").values(value="999"))
    assert main(["runs", "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: database ") and "schema version 999" in err and err.count("\n") == 1


def test_domains_lists_builtins(capsys):
    assert main(["domains", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["arithmetic"]["levels"] == [1, 2, 3, 4, 5]
    assert {"fractions", "linear_equations"} <= set(rows)


def test_sample_then_verify_round_trip(tmp_path, capsys):
    assert main(["sample", "--domain", "fractions", "--level", "3", "-n", "4", "--json"]) == 0
    samples = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    # a worked solution that ends in the boxed answer: "3/6+2/6=5/6,\boxed{5/6}"
    assert len(samples) == 4
    assert all(s["reference"].endswith(f"\\boxed{{{s['task']['payload']['answer']}}}") for s in samples)
    lines = []
    for s in samples:
        lines.append({"task": s["task"], "completion": s["reference"]})
        lines.append({"task": s["task"], "completion": "\\boxed{12345}"})
    lines.append({"task": samples[0]["task"], "completion": "no answer here"})
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    assert main(["verify", "--domain", "fractions", "--input", str(path)]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["correct"] for r in results] == [True, False] * 4 + [False]
    assert results[-1]["status"] == "format_error"


def test_unknown_domain_suggests(capsys):
    assert main(["sample", "--domain", "fractons", "--level", "1"]) == 2
    assert "did you mean 'fractions'" in capsys.readouterr().err


def test_malformed_verify_input_names_the_line(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task": {}, "completion": "x"}\nnot json\n')
    assert main(["verify", "--domain", "arithmetic", "--input", str(path)]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err


@pytest.mark.parametrize("line, says", [
    ({"task": {"prompt": "x"}}, 'a line is a JSON object with "task" and "completion"'),
    (["not", "an", "object"], 'a line is a JSON object with "task" and "completion"'),
    ({"task": {"domain": "fractions", "level": 1, "prompt": "1/2+1/2=", "payload": {"answer": "1"}},
      "completion": "1"}, "the task is of domain 'fractions', not 'arithmetic'"),
    # what `palestra sample` writes for a task without a reference: refused, not graded as the text "null"
    ({"task": {"domain": "arithmetic", "level": 1, "prompt": "1+1=", "payload": {"answer": "2"}},
      "reference": None}, "the completion is null (a task that declares no reference, such as one any "
                          "solving sequence answers, has none to verify)"),
])
def test_a_verify_line_without_a_completion_or_of_another_domain_is_named(line, says, tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(line) + "\n")
    assert main(["verify", "--domain", "arithmetic", "--input", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {path}:1: not a {{task, completion}} line (ValueError: {says})\n"


def test_files_and_counts_that_cannot_work_are_one_line_errors(tmp_path, capsys):
    assert main(["verify", "--domain", "arithmetic", "--input", str(tmp_path)]) == 2  # a folder
    assert capsys.readouterr().err.startswith("error: [Errno 21] Is a directory")
    for argv in (["sample", "--domain", "arithmetic", "--level", "1", "-n", "-3"],
                 ["verify", "--domain", "arithmetic", "--input", "-", "--workers", "0"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and "must be at least 1" in capsys.readouterr().err


def test_verify_with_workers_that_cannot_start_is_a_one_line_error_not_a_page_of_error_verdicts(
        tmp_path, capsys, monkeypatch):
    from pathlib import Path

    from domains.api import Task, user_prompt

    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # pool_helpers: a domain no worker can load
    task = Task("unstartable", 1, user_prompt("x"), {})
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"task": task.to_json(), "completion": "ok"}) + "\n")
    assert main(["verify", "--domain", "pool_helpers:UNSTARTABLE", "--input", str(path), "--workers", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "workers keep dying at start-up" in err and len(err.strip().splitlines()) == 1


def test_verify_exits_1_when_a_verifier_could_not_judge(tmp_path, capsys, monkeypatch):
    from pathlib import Path

    from domains.api import Task, user_prompt

    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # pool_helpers: a verifier that raises on "raise"
    task = Task("unruly", 1, user_prompt("x"), {})
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"task": task.to_json(), "completion": c}) + "\n" for c in ("ok", "raise", "x")))
    assert main(["verify", "--domain", "pool_helpers:UNRULY", "--input", str(path), "--workers", "1"]) == 1
    out, err = capsys.readouterr()
    results = [json.loads(line) for line in out.splitlines()]  # every verdict is printed first
    assert [(r["status"], r["details"].get("unscored", False)) for r in results] == [
        ("ok", False), ("error", True), ("error", True)]  # "x": an unknown behaviour, the verifier raises too
    assert err == "error: 2 of 3 completions were not scored: verifier raised ZeroDivisionError: the verifier divided by zero\n"


@pytest.mark.sandbox
def test_verify_of_code_tells_a_missing_sandbox_from_a_program_that_crashed(tmp_path, capsys):
    assert main(["sample", "--domain", "code_functions", "--level", "1", "-n", "1", "--json"]) == 0
    task = json.loads(capsys.readouterr().out)["task"]
    entry = task["payload"]["entry_point"]
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"task": task, "completion": f"import os\nos._exit(3)\ndef {entry}(*args):\n    return 0"}) + "\n")
    # the program dies as it loads: status error, and a verdict on the completion
    assert main(["verify", "--domain", "code_functions", "--input", str(path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["status"] == "error" and "unscored" not in result["details"], result
    # without its sandbox the verifier refuses to run the code: no verdict at all
    broken = ["--option", 'sandbox={"bwrap": "/nonexistent/bwrap"}']
    assert main(["verify", "--domain", "code_functions", "--input", str(path), *broken]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["details"]["unscored"] is True
    assert err.startswith("error: 1 of 1 completions were not scored: refusing to score code:"), err


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("runs", "stats", "replay", "compare", "report", "domains", "sample", "verify"))


def test_sample_output_verifies_as_it_is(tmp_path, capsys):
    assert main(["sample", "--domain", "fractions", "--level", "3", "-n", "3", "--json"]) == 0
    path = tmp_path / "tasks.jsonl"
    path.write_text(capsys.readouterr().out)
    assert main(["verify", "--domain", "fractions", "--input", str(path), "--workers", "1"]) == 0
    verdicts = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [v["reward"] for v in verdicts] == [1.0, 1.0, 1.0]  # each line's reference, verified


@pytest.mark.parametrize("argv", [
    ["sample", "--domain", "math_dataset", "--level", "1", "--option", "path=FILE"],
    ["sample", "--domain", "code_dataset", "--level", "1", "--option", "path=FILE"],
    ["verify", "--domain", "arithmetic", "--input", "FILE"],
])
def test_a_file_that_is_not_utf8_is_named(argv, tmp_path, capsys):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'\xff{"prompt": "1+1=", "answer": "2"}\n')
    argv = [a.replace("FILE", json.dumps(str(path)) if a.startswith("path=") else str(path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{path}: not UTF-8 text (invalid start byte at byte 0)" in err and err.count("\n") == 1, err
