"""The spot-check page of ``palestra audit``: one self-contained HTML file (inline style, no script,
nothing fetched), every text escaped. Each sampled result is a ``<section class="sample">`` whose
``data-*`` attributes carry its result id, domain, level, step and reward, so a script can read the
page back as well as a person."""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from curriculum.audit import Audit, Sampled

STYLE = """body{font-family:sans-serif;margin:2em;max-width:1100px}
pre{background:#f6f6f6;padding:.5em;white-space:pre-wrap;word-break:break-word;font-size:12px;max-height:24em;overflow:auto}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
section.sample{border-top:2px solid #888;margin-top:1.5em}.flag{background:#fdd;color:#800;padding:1px 6px;margin-right:4px}
.ok{color:#070}"""


def write_audit_page(audit: Audit, path: str | Path) -> str:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    run = audit.run
    title = f"audit of run {run['id']} ({run['name']}, seed {run['seed']})"
    flagged = sum(bool(s.flags) for s in audit.samples)
    parts = [f"<h1>{_e(title)}</h1>",
             f"<p>{len(audit.samples)} rewarded completions sampled (size {audit.size}, seed {audit.seed}) from "
             f"{sum(audit.strata.values())} in {len(audit.strata)} strata; {flagged} flagged.</p>",
             *(f"<p class='flag'>{_e(note)}</p>" for note in audit.notes),
             _divergences(audit), _repeated(audit), _strata(audit),
             *(_sample(s) for s in audit.samples)]
    page = ("<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")
    path.write_text(page, encoding="utf-8")
    return str(path)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _divergences(audit: Audit) -> str:
    if not audit.divergences:
        return "<h2>Reward against held-out success</h2><p class='ok'>no domain's reward rose while its held-out " \
               "success fell (or the run had fewer than three evaluations)</p>"
    rows = [[d["domain"], f"{d['from_step']}-{d['to_step']}", "%.3f -> %.3f" % d["reward"], "%.3f -> %.3f" % d["heldout"]]
            for d in audit.divergences]
    return "<h2>Reward rising while held-out success falls</h2>" + _table(
        ["domain", "steps", "training reward", "held-out success"], rows)


def _repeated(audit: Audit) -> str:
    if not audit.repeated:
        return "<h2>Repeated completions</h2><p class='ok'>no completion was rewarded on several different tasks</p>"
    rows = [[tasks, text[:300]] for tasks, text in sorted(audit.repeated.values(), key=lambda item: -item[0])]
    return "<h2>Completions rewarded on many different tasks</h2>" + _table(["tasks", "completion"], rows)


def _strata(audit: Audit) -> str:
    sampled: dict[tuple, int] = {}
    for sample in audit.samples:
        sampled[sample.stratum] = sampled.get(sample.stratum, 0) + 1
    rows = [[d, level, half, count, sampled.get((d, level, half), 0)] for (d, level, half), count in audit.strata.items()]
    return "<h2>Strata</h2>" + _table(["domain", "level", "half of the run", "rewarded", "sampled"], rows)


def _sample(sample: Sampled) -> str:
    row = sample.row
    attrs = {"result-id": row["id"], "domain": row["domain"], "level": row["level"], "step": row["step"],
             "reward": row["reward"], "task-id": row["task_id"]}
    data = " ".join(f'data-{k}="{_e(v)}"' for k, v in attrs.items())
    flags = "".join(f"<span class='flag'>{_e(f)}</span>" for f in sample.flags)
    facts = _table(["step", "domain", "level", "task", "reward", "status", "verifier version"],
                   [[row["step"], row["domain"], row["level"], row["task_id"], f"{row['reward']:.3f}", row["status"],
                     row["verifier_version"]]])
    blocks = [("prompt", _prompt(sample)), ("completion", row["completion"]),
              ("reference", sample.reference), ("what the verifier checks (the task's hidden payload)",
                                                  _json(sample.task.payload) if sample.task else None),
              ("verifier details (re-verified now)", _json(sample.verdict) if sample.verdict else None)]
    body = "".join(f"<h4>{_e(name)}</h4><pre>{_e(text)}</pre>" for name, text in blocks if text is not None)
    return f"<section class='sample' id='result-{_e(row['id'])}' {data}><h3>result {_e(row['id'])}</h3>{flags}{facts}{body}</section>"


def _prompt(sample: Sampled) -> str | None:
    if sample.task is None:
        return None
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in sample.task.prompt)


def _json(value: Any) -> str:
    return json.dumps(value, indent=1, default=str, ensure_ascii=False)
