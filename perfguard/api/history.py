"""`perfguard history ...`: where the archive of reports is (an SQLite file or a
PostgreSQL database, `perfguard.storage.archive`)."""

from __future__ import annotations


def archive_label(db: str) -> str:
    """How the archive `db` is named in messages (a file path, or a URL without its
    password)."""
    from perfguard.storage.archive import locate

    return locate(db).label
