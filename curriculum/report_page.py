"""The report's HTML: one self-contained file (images inline as data URIs, no scripts, nothing
fetched), so it can be mailed, attached to an issue or opened offline."""
from __future__ import annotations

import base64
import html
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from curriculum.tables import cell_text

STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1200px} img{max-width:100%} "
         "pre{font-size:12px;overflow-x:auto} table{border-collapse:collapse;font-size:12px} "
         "th,td{border:1px solid #ccc;padding:2px 6px;text-align:right} th:first-child,td:first-child"
         "{text-align:left} thead th{background:#eee;position:sticky;top:0}")


@dataclass
class Image:
    name: str  # the PNG file written next to the page
    png: bytes


def save_figure(plt, fig, out: Path, name: str, dpi: int = 90) -> Image:
    """Write ``fig`` as ``out/name`` and keep its bytes for the page."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)
    png = buffer.getvalue()
    (out / name).write_bytes(png)
    return Image(name, png)


def image(img: Image) -> str:
    data = base64.b64encode(img.png).decode("ascii")
    return f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(img.name)}"></figure>'


def images(imgs: Sequence[Image], fold_after: int | None = None, more: str = "more") -> str:
    """The images in order; those after the first ``fold_after`` folded away under ``more``."""
    shown = "\n".join(image(i) for i in imgs[:fold_after])
    rest = imgs[fold_after:] if fold_after is not None else []
    if rest:
        shown += f"\n<details><summary>{html.escape(more)}</summary>\n" + "\n".join(image(i) for i in rest) + "</details>"
    return shown


def table(rows: list[dict], columns: dict[str, str], formats: dict[str, Callable[[Any], str]] | None = None) -> str:
    """An HTML table of ``rows``; ``columns`` maps each row key to its heading."""
    formats = formats or {}
    head = "".join(f"<th>{html.escape(title)}</th>" for title in columns.values())
    body = []
    for row in rows:
        cells = (formats.get(key, cell_text)(row.get(key)) for key in columns)
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n" + "\n".join(body) + "\n</tbody></table>"



def preformatted(text: str) -> str:
    return "<pre>" + html.escape(text) + "</pre>"


def config_block(config: dict | None) -> str:
    return preformatted(json.dumps(config or {}, indent=1, sort_keys=True, default=str))


def section(title: str, body: str) -> str:
    return f"<h2>{html.escape(title)}</h2>\n{body}"


def write_page(out: Path, title: str, parts: list[str]) -> str:
    page = (f"<!doctype html>\n<html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<link rel='icon' href='data:,'>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>\n"
            + "\n".join(parts) + "\n</body></html>\n")
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return str(path)
