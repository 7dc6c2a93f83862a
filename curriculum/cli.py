"""``palestra``: inspect runs and statistics, list domains, and check a domain by hand.

    palestra runs   --db URL [--json]
    palestra stats  --db URL --run ID [--json]
    palestra replay --db URL --run ID [--step S] [--json]
    palestra compare --db URL --sweep ID [--baseline uniform] [--target T] [--domains] [--json]
    palestra report  --db URL (--run ID | --sweep ID) [--out DIR]
    palestra domains [--json]
    palestra sample --domain D --level L -n N [--seed S] [--json]
    palestra verify --domain D --input FILE.jsonl
    palestra verify --domain D --canaries [--tasks-per-level N] [--seed S]
    palestra audit  --db URL --run ID [--size N] [--seed S] [--out FILE.html]
    palestra merge  --into URL [--sweep ID] [--run ID ...] SOURCE [SOURCE ...]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from typing import Any, Callable

from sqlalchemy.exc import SQLAlchemyError

from curriculum.store import SchemaVersionError, StoreUnavailable
from curriculum.tables import cell_text
from domains.api import Task, one_line
from domains.verify.pool import VerifierPoolBroken
from domains.registry import DomainError, available, load


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.handler(args)
    except BrokenPipeError:  # `palestra runs ... | head`: the reader has all it wanted
        sys.stdout = None  # type: ignore[assignment]  # no flush of the closed pipe at exit
        return 0
    except (DomainError, KeyError, OSError, ValueError, SQLAlchemyError, SchemaVersionError, StoreUnavailable,
            VerifierPoolBroken) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"error: {one_line(message)}", file=sys.stderr)
        return 2


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="palestra", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(required=True, metavar="command")

    def command(name: str, handler: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.set_defaults(handler=handler)
        return p

    p = command("runs", cmd_runs, "list the runs in a store")
    p.add_argument("--db", required=True, help="SQLAlchemy URL of the store, e.g. sqlite:///outputs/x/palestra.db")
    p.add_argument("--json", action="store_true")
    p = command("stats", cmd_stats, "per-domain statistics of one run")
    p.add_argument("--db", required=True)
    p.add_argument("--run", required=True, help="run id (a unique prefix is enough)")
    p.add_argument("--json", action="store_true")
    p = command("replay", cmd_replay, "re-verify a run's stored results and report mismatches")
    p.add_argument("--db", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--step", type=int, default=None)
    p.add_argument("--workers", type=_positive, default=2)
    p.add_argument("--json", action="store_true")
    p = command("merge", cmd_merge, "copy whole runs from other stores into one (to compare runs stored apart)")
    p.add_argument("--into", required=True, help="the store to copy into: a URL or a SQLite file (created if new)")
    p.add_argument("--sweep", default=None, help="sweep id the copied runs get (default: each keeps its own)")
    p.add_argument("--run", action="append", default=None, help="copy only this run id (repeatable)")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="a store URL, SQLite file or run folder")
    _analysis_commands(command)
    p = command("domains", cmd_domains, "registered domains and their levels")
    p.add_argument("--json", action="store_true")
    p = command("sample", cmd_sample, "draw tasks with their reference completions")
    p.add_argument("--domain", required=True)
    p.add_argument("--level", type=int, required=True)
    p.add_argument("-n", type=_positive, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="domain option (JSON value)")
    p.add_argument("--json", action="store_true")
    p = command("verify", cmd_verify, "verify {task, completion} lines (one VerifyResult JSON a line), or a domain's canaries")
    p.add_argument("--domain", required=True)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--input", help="JSONL file ('-' for stdin)")
    what.add_argument("--canaries", action="store_true",
                      help="write the domain's canaries for held-out tasks and verify them: exit 1 if any earns reward")
    p.add_argument("--tasks-per-level", type=_positive, default=2, help="with --canaries: held-out tasks per level")
    p.add_argument("--seed", type=int, default=1234, help="with --canaries: the held-out tasks' seed (eval.seed)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--workers", type=_positive, default=2)
    return parser


# -- store views --------------------------------------------------------------------------------------

def _analysis_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """compare, report and audit: what a sweep or a run did, read from the store."""
    p = command("compare", cmd_compare, "compare the policies of a sweep, with paired-seed 95%% CIs")
    p.add_argument("--db", required=True)
    p.add_argument("--sweep", required=True, help="sweep id (see `palestra runs`)")
    p.add_argument("--baseline", default="uniform", help="policy the others are compared with")
    p.add_argument("--target", type=float, default=None, help="macro held-out success for steps-to-target")
    p.add_argument("--metric", default="heldout/macro", help="metrics key of the macro held-out success")
    p.add_argument("--domains", action="store_true", help="also each domain's final held-out success (training sweeps)")
    p.add_argument("--json", action="store_true")
    p = command("report", cmd_report, "PNG plots and an HTML page for a run or a sweep")
    p.add_argument("--db", required=True)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--run", help="run id (a unique prefix is enough)")
    target.add_argument("--sweep", help="sweep id")
    p.add_argument("--out", default=None, help="output folder (default: report-<id>)")
    p.add_argument("--baseline", default="uniform")
    p = command("audit", cmd_audit, "an HTML page of a stratified sample of a run's rewarded completions, with flags")
    p.add_argument("--db", required=True)
    p.add_argument("--run", required=True, help="run id (a unique prefix is enough)")
    p.add_argument("--size", type=_positive, default=40, help="completions in the sample")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed")
    p.add_argument("--out", default=None, help="the page's path (default: audit-<run>.html)")
    p.add_argument("--workers", type=_positive, default=2, help="verifier workers that re-verify the sample")
    p.add_argument("--no-reverify", action="store_true", help="show the stored verdicts only (no verifier details)")

def _open_store(url: str):
    """The store behind ``url``, which must exist already: these commands only read, and neither a
    mistyped path nor another application's database gets Palestra's tables written into it."""
    from curriculum.store import StatsStore

    return StatsStore(url, create=False)


def cmd_runs(args: argparse.Namespace) -> int:
    with _open_store(args.db) as store:
        # training steps are numbered from 1, so the last recorded step is the number of steps done
        rows = [{**r, "steps": max(0, r.get("last_step") or 0)} for r in store.runs()]
    if args.json:
        print(json.dumps(rows, default=str, indent=1))
    else:
        _table(rows, ["id", "name", "sweep_id", "status", "seed", "steps", "started_at"])
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from curriculum.run_summary import VERDICT_COLUMNS, domain_stats

    with _open_store(args.db) as store:
        run_id = _resolve_run(store, args.run)
        rows = domain_stats(store, run_id)
    if args.json:
        print(json.dumps({"run": run_id, "domains": rows}, default=str, indent=1))
    else:
        print(f"run {run_id}")
        # the shares stay even where unknown: a run stored before the trained counts shows "-" there
        _table(rows, ["domain", "attempts", "successes", "success_rate", "weight", "level", "planned_share",
                      "trained_share", "varied_share", *VERDICT_COLUMNS, "unscored", "canaries", "canaries_paid"],
               keep=("planned_share", "trained_share", "varied_share"))
    return 0


def _resolve_run(store, prefix: str) -> str:
    matches = [r["id"] for r in store.runs() if str(r["id"]).startswith(prefix)]
    if len(matches) != 1:
        raise KeyError(f"run {prefix!r} matches {len(matches)} runs in the store")
    return matches[0]


def cmd_replay(args: argparse.Namespace) -> int:
    from curriculum.replay import replay

    with _open_store(args.db) as store:
        report = replay(store, _resolve_run(store, args.run), step=args.step, workers=args.workers)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(f"run {report.run_id}: re-verified {report.checked} results, {len(report.mismatches)} mismatches"
              + (f", {report.missing_tasks} without a stored task" if report.missing_tasks else "")
              + (f", {report.unreadable} stored damaged" if report.unreadable else "")
              + (f", {report.unscored} results the verifier could not judge" if report.unscored else ""))
        for domain, count in report.unknown_domains.items():
            print(f"  {count} results of domain {domain!r}, which the run's config does not name, were not checked")
        for domain, change in report.version_changes.items():
            print(f"  verifier version of {domain} changed: {change}")
        if report.mismatches:
            _table([vars(m) for m in report.mismatches[:50]],
                   ["step", "domain", "task_id", "stored_reward", "replayed_reward", "stored_status", "replayed_status"])
    return 1 if report.mismatches or report.unchecked else 0  # a replay that could not check everything fails


def cmd_merge(args: argparse.Namespace) -> int:
    from curriculum.store_merge import merge_runs, store_url
    from curriculum.store_urls import shown_url

    copied = merge_runs(args.sources, args.into, sweep_id=args.sweep, run_ids=args.run)
    for run_id in copied:
        print(run_id)
    sweep = f" under sweep {args.sweep}" if args.sweep else ""
    print(f"copied {len(copied)} runs into {shown_url(store_url(args.into))}{sweep}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from curriculum.compare import compare_sweep, format_domain_table, format_table

    with _open_store(args.db) as store:
        result = compare_sweep(store, args.sweep, baseline=args.baseline, target=args.target,
                               metric_key=args.metric)
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print(format_table(result) + ("\n\n" + format_domain_table(result) if args.domains else ""))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from curriculum.report import report_run, report_sweep

    with _open_store(args.db) as store:
        if args.run:
            run_id = _resolve_run(store, args.run)
            page = report_run(store, run_id, args.out or f"report-{run_id[:8]}")
        else:
            out = args.out or "report-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in args.sweep)
            page = report_sweep(store, args.sweep, out, baseline=args.baseline)
    print(page)
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from curriculum.audit import build_audit
    from curriculum.audit_page import write_audit_page

    with _open_store(args.db) as store:
        run_id = _resolve_run(store, args.run)
        audit = build_audit(store, run_id, size=args.size, seed=args.seed, workers=args.workers,
                            reverify=not args.no_reverify)
    page = write_audit_page(audit, args.out or f"audit-{run_id[:8]}.html")
    flagged = sum(bool(s.flags) for s in audit.samples)
    print(f"{page}: {len(audit.samples)} rewarded completions, {flagged} flagged")
    return 0


# -- domains ------------------------------------------------------------------------------------------
def cmd_domains(args: argparse.Namespace) -> int:
    rows = []
    for name in available():
        try:
            domain = load(name)
            rows.append({"name": name, "levels": list(domain.levels), "version": domain.version})
        except DomainError as exc:  # list the broken plugin rather than hide it
            rows.append({"name": name, "levels": [], "error": str(exc)})
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        _table([{**r, "levels": ",".join(map(str, r["levels"]))} for r in rows], ["name", "levels", "version", "error"])
    return 0


def _options(pairs: list[str]) -> dict[str, Any]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--option {pair!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def cmd_sample(args: argparse.Namespace) -> int:
    domain = load(args.domain, _options(args.option))
    if args.level not in domain.levels:
        raise ValueError(f"domain {domain.name!r} has levels {list(domain.levels)}, not {args.level}")
    for task in domain.sample(args.level, args.n, random.Random(args.seed)):
        reference = domain.reference(task)
        if args.json:
            print(json.dumps({"task": task.to_json(), "reference": reference}))
        else:
            print(f"[{task.id}] {task.prompt[-1]['content']!r} -> {reference!r}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from domains.verify.pool import VerifierPool

    domain = load(args.domain, _options(args.option))
    if args.canaries:
        return _verify_canaries(domain, args)
    try:
        lines = (sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")).read().splitlines()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{args.input}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    items: list[tuple[Task, str]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or "task" not in row or not {"completion", "reference"} & row.keys():
                raise ValueError('a line is a JSON object with "task" and "completion"')
            task_json = row["task"] if isinstance(row["task"], dict) else {}
            named = task_json.get("domain") if {"domain", "prompt", "payload"} <= task_json.keys() else None
            if named is not None and named != domain.name:  # a Task's JSON, not a raw dataset row
                raise ValueError(f"the task is of domain {named!r}, not {domain.name!r}")
            task = domain.task_from_json(row["task"])
            # `palestra sample` lines carry a "reference": verifying them as they are checks the references
            completion = row["completion"] if "completion" in row else row["reference"]
            if completion is None:  # not the text "null": `palestra sample` writes null for a task without a reference
                raise ValueError("the completion is null (a task that declares no reference, such as "
                                 "one any solving sequence answers, has none to verify)")
            # a tool transcript may be given as a JSON list rather than a string holding one
            items.append((task, completion if isinstance(completion, str) else json.dumps(completion)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{args.input}:{number}: not a {{task, completion}} line ({type(exc).__name__}: {exc})") from None
    with VerifierPool({domain.name: domain}, workers=args.workers) as pool:
        verdicts = pool.verify_many([(_renamed(t, domain.name), c) for t, c in items])
        pool.raise_if_broken()  # no verdicts printed: none of them would mean anything
    for verdict in verdicts:
        print(json.dumps(verdict.result.to_json(), default=str))
    unscored = [v.result for v in verdicts if not v.result.scored]
    if unscored:  # a reward of 0 from a verifier that could not judge is no verdict on the completion
        print(f"error: {len(unscored)} of {len(verdicts)} completions were not scored: "
              f"{unscored[0].details.get('message', '')}", file=sys.stderr)
        return 1
    return 0


def _verify_canaries(domain, args: argparse.Namespace) -> int:
    """``verify --canaries``: each canary's verdicts, one JSON a line; exit 1 when one earned reward,
    raised, or could not be judged (then the check says nothing)."""
    from domains.canaries import canary_alarms, run_canaries
    from domains.verify.pool import VerifierPool

    if not domain.canaries():
        raise ValueError(f"domain {domain.name!r} names no canaries (Domain.canaries)")
    with VerifierPool({domain.name: domain}, workers=args.workers) as pool:
        results = run_canaries({domain.name: domain}, pool, args.tasks_per_level, args.seed)
        pool.raise_if_broken()
    for result in results:
        print(json.dumps({**dataclasses.asdict(result), "paid": result.paid}))
    failed = [f"{r.canary} raised: {r.message}" for r in results if r.status == "canary_error"]
    failed += [f"{r.canary} was not judged: {r.message}" for r in results if not r.scored]
    for line in canary_alarms(results) + failed:
        print(f"error: {line}", file=sys.stderr)
    names = sorted({r.canary for r in results})
    print(f"{domain.name}: {len(results)} canary completions ({len(names)} canaries: {', '.join(names)}), "
          f"{sum(r.paid for r in results)} earned reward", file=sys.stderr)
    return 1 if any(r.paid for r in results) or failed else 0


def _renamed(task: Task, name: str) -> Task:
    """A raw dataset row becomes a task of the domain that read it, under that domain's configured
    name; route it to the domain being checked."""
    if task.domain == name:
        return task
    return Task(domain=name, level=task.level, prompt=task.prompt, payload=task.payload, meta=task.meta, id=task.id)


def _table(rows: list[dict], columns: list[str], keep: tuple[str, ...] = ()) -> None:
    """``rows`` as aligned text; a column with no value in any row is left out, unless in ``keep``."""
    columns = [c for c in columns if c in keep or any(r.get(c) is not None for r in rows)] or columns[:1]
    cells = [[cell_text(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))



if __name__ == "__main__":
    sys.exit(main())
