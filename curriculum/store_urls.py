"""Store URLs: the default SQLite file of a run, and URLs as messages and stored configs show them.

Apart from ``curriculum.store`` so that the config code can name a run's default database
without opening one.
"""
from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

DB_FILE = "palestra.db"  # a run's (or a sweep's) SQLite file, in its output folder

URL_HINT = " (a SQLite file is written sqlite:///path/to/file.db)"


def default_store_url(folder: str | Path) -> str:
    """The SQLite URL of ``<folder>/palestra.db``, the folder made absolute (symlinks resolved),
    so the URL means the same file whatever the working directory. Creates nothing."""
    return f"sqlite:///{Path(folder).resolve() / DB_FILE}"


def shown_url(url: str) -> str:
    """``url`` for messages and stored configs, a server password shown as ***. One that does not
    parse hides everything before its last ``@`` but the ``scheme://`` (a mistyped URL may still
    hold a password), and so does one with two ``@`` before its path: SQLAlchemy would read the
    second half of a password holding an unescaped ``@`` as part of the host."""
    authority = url.split("://", 1)[-1].split("/", 1)[0]
    try:
        if authority.count("@") <= 1:
            return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # not a URL, or a port that is not a number
        pass
    if "@" not in url:
        return url
    head, _, host = url.rpartition("@")
    scheme = head.split("://", 1)[0] + "://" if "://" in head else ""
    return f"{scheme}***@{host}"


def without_password(config: dict) -> dict:
    """A run's config as it is stored: a server password in ``store.url`` shows as ***."""
    url = (config.get("store") or {}).get("url")
    return {**config, "store": {**config["store"], "url": shown_url(url)}} if url else config
